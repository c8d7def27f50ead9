// The overlap workload: the case ferry exists for. Each step computes C = A x B (n x n float32,
// cuBLAS on the GPU) on the client's stream and copies C (n*n*4 bytes; 64 MiB at n = 4096) to
// the host. Run serially, the copy is exposed; moved under the math, it is not. The same steps
// run in this process (the baselines: serial, a hand-written side stream, in-step pieces) and
// through ferryd under each policy, and every configuration is checked for correctness.
//
//   exposed copy time = median warm step time with copies - median step time of the math alone
//   overlap           = 1 - exposed / copy time
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ferry/status.hpp"

namespace ferry::overlap {

// Where the steps' math runs. Everything is enqueued on one stream; on the host engine
// "enqueue" runs the work at once on the calling thread, and marks read the host clock.
// Not thread-safe: one thread drives an engine.
class StepEngine {
 public:
  virtual ~StepEngine() = default;
  virtual std::string kind() const = 0;  // "cuda" or "host"
  virtual int n() const = 0;
  // "chip", "driver", "cuda_runtime", "cublas", as "key", "value" pairs.
  virtual std::vector<std::pair<std::string, std::string>> Environment() = 0;

  virtual Status SetInputs(const std::vector<float>& a, const std::vector<float>& b) = 0;
  // Output buffer `buf` (0 or 1): device memory, n*n floats, column-major.
  virtual void* output(int buf) = 0;
  // Host engine: compute into this memory instead (a DeviceAllocation of a host-backend ferryd).
  virtual Status AdoptOutput(int buf, void* memory) {
    (void)buf, (void)memory;
    return NotSupported("device memory is the engine's own");
  }
  virtual size_t output_bytes() const { return static_cast<size_t>(n()) * n() * sizeof(float); }
  // C[buf][:, col0:col1] = A * B[:, col0:col1], on compute lane `lane` (0: the step stream).
  virtual Status Gemm(int buf, int col0, int col1, int lane) = 0;
  // Compute lanes: streams beside the step stream for the in-step blocks (block p on lane
  // p % lanes). A cut's narrow blocks leave most multiprocessors idle in their last wave; on
  // another lane the next block fills them. Lanes fork from the step stream (ForkLanes: they
  // wait for its work so far) and join it (JoinLanes: it waits for theirs), so steps stay in
  // order. Engines without streams run everything in order and take any count.
  virtual Status SetLanes(int lanes) { return lanes >= 1 ? Status::Ok() : InvalidArgument("lanes >= 1"); }
  virtual Status ForkLanes() { return Status::Ok(); }
  virtual Status JoinLanes() { return Status::Ok(); }
  // Fills output `buf` with a bit pattern (a float NaN) on the stream.
  virtual Status PoisonOutput(int buf, uint8_t byte) = 0;
  virtual void* stream(int lane = 0) = 0;  // for SharedEvent::Record (a lane's) and Transfer::StreamWait (0)

  virtual Status Mark(int i) = 0;                        // step boundary i on the stream (i < kMaxMarks)
  virtual Result<double> MarkSeconds(int a, int b) = 0;  // from mark a to mark b, both happened
  virtual Status WaitMark(int i) = 0;                    // host blocks until mark i has happened
  // When mark i happened, in microseconds on CLOCK_MONOTONIC (the clock ferryd's engine trace
  // uses), so a step's GPU times can be set beside another process's.
  virtual Result<double> MarkClockMicros(int) { return NotSupported("this engine's marks have no host clock"); }
  // Sets MarkClockMicros' time zero to now; called before the marks it will read, so that their
  // offsets from it (float milliseconds) stay small and fine-grained.
  virtual Status PinClock() { return NotSupported("this engine's marks have no host clock"); }
  virtual Status Sync() = 0;
  virtual Status ReadOutput(int buf, std::vector<float>& out) = 0;  // synchronous

  // In-process baselines (cuda only): pinned host buffers and a copy stream of this process.
  virtual bool has_in_process() const { return false; }
  virtual std::byte* pinned(int buf) {
    (void)buf;
    return nullptr;
  }
  virtual Status CopyOnStream(int buf, size_t offset, size_t bytes) {
    (void)buf, (void)offset, (void)bytes;
    return NotSupported("no in-process path");
  }
  // After the work enqueued so far on `lane`, copy on the copy stream; returns a token for StreamWaitCopy.
  virtual Result<int> CopyOnSideStream(int buf, size_t offset, size_t bytes, int lane) {
    (void)buf, (void)offset, (void)bytes, (void)lane;
    return NotSupported("no in-process path");
  }
  virtual Status StreamWaitCopy(int token) {
    (void)token;
    return NotSupported("no in-process path");
  }

  static constexpr int kMaxMarks = 4096;
};

Result<std::unique_ptr<StepEngine>> MakeCudaStepEngine(int device, int n);  // NotSupported without CUDA
std::unique_ptr<StepEngine> MakeHostStepEngine(int n);

struct PolicyInput {
  std::string source;  // a file name, or what made it ("tune candidate 3")
  std::string text;    // the policy file's contents
};
Result<PolicyInput> ReadPolicyFile(const std::string& path);

struct Options {
  std::string socket;                 // ferryd's control socket
  std::vector<PolicyInput> policies;  // to run under, in order
  bool in_process = true;             // also the in-process baselines (where the engine has them)
  bool copy_alone = true;             // also each policy's copy without the math
  int steps = 30;                     // timed steps per mode and round
  int warmup = 5;
  int rounds = 3;        // each with fresh random inputs
  int pieces = 6;        // in-step: the math cut into this many column blocks...
  double ratio = 0.5;    // ... each this fraction of the one before
  std::vector<int> cut;  // or these column widths (summing to n), in order
  int lanes = 2;         // in-step: compute streams the blocks take turns on (StepEngine::SetLanes)
  bool quiet = false;    // no progress bar
  std::string metrics;   // ferryd's /metrics address (HOST:PORT): compare its exposed time with ours
  std::string timeline;  // write each timed step's GPU times here (CSV, CLOCK_MONOTONIC us)
};

struct Stat {
  double median = 0, min = 0, max = 0;  // seconds
  size_t n = 0;
};

struct ModeResult {
  std::string name;      // e.g. "ferryd geometric, in-step"
  std::string path;      // "in-process" | "ferryd"
  std::string strategy;  // "compute" | "copy" | "serial" | "pipelined" | "in-step"
  std::string policy;    // ferryd paths: the policy's name and hash
  std::string policy_hash;
  std::string policy_file;
  Stat step;           // step time
  double exposed = 0;  // step median - compute median (copy modes)
  double overlap = 0;  // 1 - exposed / copy
  // Exposed copy time per step over the timed runs (warm-up included), two ways: the bench's
  // own (device events around its stream waits; the host clock on the host engine) and what
  // ferryd's ferry_exposed_seconds recorded meanwhile (the client library's reports, bounded
  // by ferryd). They agree when |own - metric| <= max(10% of the larger, 0.05 ms). Negative:
  // not measured (not a ferryd mode, or no --metrics).
  double own_exposed_per_step = -1, metric_exposed_per_step = -1;
  uint64_t metric_reports = 0;
  bool exposed_agree = false;
};

struct Check {
  std::string name, what;
  double bound = 0, worst = 0;  // worst value seen against its bound (counts for the bitwise ones)
  bool pass = true;
  std::string detail;  // the first failure
};

struct Report {
  std::string engine, daemon_backend, ferry_version, issued_at, hostname;
  std::vector<std::pair<std::string, std::string>> environment;
  int n = 0, steps = 0, warmup = 0, rounds = 0;
  std::vector<std::pair<int, int>> pieces;  // in-step column blocks
  int lanes = 1;                            // ... on this many compute streams
  double copy_seconds = 0;                  // pure copy, in-process where there is one, else ferryd
  Stat compute, compute_pieces;
  std::vector<ModeResult> modes;
  std::vector<Check> checks;
  std::vector<std::string> notes;
  bool checks_passed() const;
  const ModeResult* Find(const std::string& path, const std::string& strategy, const std::string& policy_name) const;
};

// Runs everything. Applies each policy in turn to the running ferryd (its user must be allowed
// to) and puts the policy that was running back at the end, also when a step fails.
Result<Report> Run(StepEngine& engine, const Options& options);

std::string ToJson(const Report& r);
std::string ToText(const Report& r);
std::string ToSvg(const Report& r);  // compute and exposed-copy bars to scale, per mode

// The column blocks of the in-step cut: `pieces` blocks, each `ratio` of the one before, the
// last two equal, rounded to multiples of `align` columns.
std::vector<std::pair<int, int>> GeometricColumns(int n, int pieces, double ratio, int align);

}  // namespace ferry::overlap
