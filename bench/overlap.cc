#include "bench/overlap.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <ctime>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <sstream>

#include "common/status_macros.hpp"
#include "policy/policy.hpp"
#include "ferry/client.hpp"
#include "ferry/version.hpp"
#include "bench/bench_util.hpp"
#include "common/byte_size.hpp"
#include "common/json.hpp"
#include "common/time_format.hpp"
#include "common/fd.hpp"
#include "client/operator_control.hpp"

namespace ferry::overlap {
namespace {

constexpr uint8_t kHostPoison = 0xFF;    // 0xFFFFFFFF: a NaN no product makes
constexpr uint8_t kDevicePoison = 0xFE;  // 0xFEFEFEFE: a copy that ran before its math delivers this
constexpr int kSlots = 4;                // steps whose events and transfers may be live at once

enum class Kind {
  kCompute,         // the math alone, in one call: the reference for exposed time
  kComputePieces,   // the math alone, cut into the in-step column blocks
  kCopyInProcess,   // the copy alone: cudaMemcpyAsync on the step stream
  kCopyFerry,       // the copy alone, through ferryd, after its step's mark (see RunSteps)
  kSerial,          // in-process: math, then the copy on the same stream
  kSideStream,      // in-process: the copy on a second stream, under the next step's math
  kInStep,          // in-process: each block's copy starts when its math is done; all done by step end
  kFerryPipelined,  // ferryd: the copy after the math, waited for by the end of the next step
  kFerryInStep,     // ferryd: each block's copy after its math, all waited for by the step end
};

bool IsFerry(Kind k) { return k == Kind::kCopyFerry || k == Kind::kFerryPipelined || k == Kind::kFerryInStep; }
bool HasCompute(Kind k) { return k != Kind::kCopyInProcess && k != Kind::kCopyFerry; }
bool UsesPieces(Kind k) { return k == Kind::kComputePieces || k == Kind::kInStep || k == Kind::kFerryInStep; }
bool HasCopy(Kind k) { return k != Kind::kCompute && k != Kind::kComputePieces; }

const char* StrategyName(Kind k) {
  switch (k) {
    case Kind::kCompute:
    case Kind::kComputePieces:
      return "compute";
    case Kind::kCopyInProcess:
    case Kind::kCopyFerry:
      return "copy";
    case Kind::kSerial:
      return "serial";
    case Kind::kSideStream:
    case Kind::kFerryPipelined:
      return "pipelined";
    case Kind::kInStep:
    case Kind::kFerryInStep:
      return "in-step";
  }
  return "?";
}

Stat ToStat(const std::vector<double>& v) {
  auto s = bench::Summarize(v);
  return Stat{s.median, s.min, s.max, s.n};
}

// ferryd's exposed-time histogram, summed over its label sets: (seconds, reports).
Result<std::pair<double, uint64_t>> ScrapeExposed(const std::string& address) {
  const size_t colon = address.rfind(':');
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(std::atoi(address.substr(colon + 1).c_str())));
  if (colon == std::string::npos || ::inet_pton(AF_INET, address.substr(0, colon).c_str(), &sa.sin_addr) != 1) {
    return InvalidArgument("--metrics takes ferryd's metrics address as IPV4:PORT, not '" + address + "'");
  }
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  timeval tv{5, 0};
  ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    return Unavailable("cannot reach ferryd's metrics at " + address + ": " + std::strerror(errno));
  }
  const std::string req = "GET /metrics HTTP/1.0\r\nHost: " + address + "\r\n\r\n";
  if (::send(fd.get(), req.data(), req.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(req.size())) {
    return Unavailable("cannot scrape " + address);
  }
  std::string body;
  char buf[65536];
  for (ssize_t n; (n = ::recv(fd.get(), buf, sizeof buf, 0)) > 0;) body.append(buf, static_cast<size_t>(n));
  double sum = 0;
  uint64_t count = 0;
  bool seen = false;
  std::istringstream in(body);
  for (std::string line; std::getline(in, line);) {
    const bool is_sum = line.rfind("ferry_exposed_seconds_sum", 0) == 0;
    const bool is_count = line.rfind("ferry_exposed_seconds_count", 0) == 0;
    if (!is_sum && !is_count) continue;
    const double v = std::atof(line.c_str() + line.rfind(' ') + 1);
    seen = true;
    if (is_sum) sum += v;
    else count += static_cast<uint64_t>(v);
  }
  // No reports yet: no series at all.
  if (!seen && body.find("ferry_build_info") == std::string::npos) {
    return Unavailable("no ferryd metrics at " + address + "/metrics (is it ferryd's metrics address?)");
  }
  return std::make_pair(sum, count);
}

struct ModeSpec {
  Kind kind;
  std::string name;
  std::string policy_file;  // ferryd modes
};

class Runner {
 public:
  Runner(StepEngine& e, const Options& o) : e_(e), o_(o) {}

  Result<Report> Run();

 private:
  Status Setup();
  Status RunSteps(Kind kind, int steps, std::vector<double>* times, double* own_exposed = nullptr);
  Result<std::pair<double, uint64_t>> SettledExposed();
  Status CheckedRun(const ModeSpec& m, int round);
  void Fail(Check& c, const std::string& detail) {
    if (c.pass) c.detail = detail;
    c.pass = false;
  }
  Check& C(int i) { return report_.checks[static_cast<size_t>(i)]; }
  std::byte* HostOut(Kind k, int buf) { return IsFerry(k) ? host_[buf]->data() : e_.pinned(buf); }
  void RoundInputs(int round);
  void CompareToFp64(const std::vector<float>& c, Check& check, const char* which);

  StepEngine& e_;
  const Options& o_;
  Report report_;
  std::unique_ptr<Client> client_;
  ctl::Control control_;
  std::optional<HostBuffer> host_[2];
  std::optional<DeviceAllocation> dev_alloc_[2];
  std::optional<DeviceRegion> region_[2];
  std::vector<SharedEvent> events_;
  std::vector<std::pair<int, int>> pieces_;
  std::vector<float> a_, b_, prev_a_, ref_, ref_pieces_;
  int block_i_ = 0, block_j_ = 0, block_ = 0;
  std::map<std::string, std::vector<double>> times_;
  std::map<std::string, ModeResult> meta_;
  std::map<std::string, double> own_exposed_, metric_exposed_;  // seconds, over the timed runs
  std::map<std::string, uint64_t> metric_reports_, compared_steps_;
  std::string mode_name_;  // the mode and round RunSteps times now, for the timeline
  int round_ = 0;
  std::string timeline_;  // --timeline's lines so far
};

Status Runner::Setup() {
  const int n = e_.n();
  ConnectOptions co;
  co.socket_path = o_.socket;
  co.name = "ferry-overlap";
  FERRY_ASSIGN_OR_RETURN(client_, Client::Connect(co));
  const bool daemon_gpu = client_->backend() == BackendKind::kCuda;
  report_.daemon_backend = daemon_gpu ? "cuda" : "host";
  if (daemon_gpu != (e_.kind() == "cuda")) {
    return InvalidArgument(std::string("ferryd runs the ") + report_.daemon_backend +
                           " backend but the math runs on the " + e_.kind() +
                           (daemon_gpu ? "; run this on the GPU" : "; start ferryd with --backend cuda"));
  }
  FERRY_RETURN_IF_ERROR(control_.Open(o_.socket));
  const size_t bytes = e_.output_bytes();
  for (int b = 0; b < 2; ++b) {
    FERRY_ASSIGN_OR_RETURN(HostBuffer h, client_->AllocateHost(bytes));
    host_[b].emplace(std::move(h));
    if (!daemon_gpu) {
      FERRY_ASSIGN_OR_RETURN(DeviceAllocation d, client_->AllocateDevice(bytes));
      FERRY_RETURN_IF_ERROR(e_.AdoptOutput(b, d.data()));
      dev_alloc_[b].emplace(std::move(d));
    }
    FERRY_ASSIGN_OR_RETURN(DeviceRegion r, client_->RegisterDevice(e_.output(b), bytes));
    region_[b].emplace(std::move(r));
  }
  for (int i = 0; i < kSlots * static_cast<int>(pieces_.size()); ++i) {
    FERRY_ASSIGN_OR_RETURN(SharedEvent ev, client_->CreateEvent());
    events_.push_back(std::move(ev));
  }
  a_.resize(static_cast<size_t>(n) * n);
  b_.resize(a_.size());
  return Status::Ok();
}

// One mode's steps. Step k ends at mark k + 1; the host stays at most two steps ahead of the
// GPU, so events and transfers of kSlots steps back are free to reuse.
// ferryd's exposed-time metric once the reports sent so far are in it: a control request
// wakes ferryd to read its rings, then the exporter (it applies them every 50 ms) settles.
Result<std::pair<double, uint64_t>> Runner::SettledExposed() {
  FERRY_RETURN_IF_ERROR(client_->Stats().status());
  FERRY_ASSIGN_OR_RETURN(auto last, ScrapeExposed(o_.metrics));
  for (int i = 0; i < 40; ++i) {
    ::usleep(120'000);
    FERRY_ASSIGN_OR_RETURN(auto now, ScrapeExposed(o_.metrics));
    if (now.second == last.second) return now;
    last = now;
  }
  return last;
}

// Marks from here on time each step's waits for its ferryd copies: wait mark k is set before
// step k's waits, and step mark k + 1 right after them.
constexpr int kWaitMarks = StepEngine::kMaxMarks / 2;

Status Runner::RunSteps(Kind kind, int steps, std::vector<double>* times, double* own_exposed) {
  const int n = e_.n();
  const size_t col_bytes = static_cast<size_t>(n) * sizeof(float);
  const std::vector<std::pair<int, int>> whole{{0, n}};
  const auto& blocks = UsesPieces(kind) ? pieces_ : whole;
  std::vector<Transfer> xfers[kSlots];
  int tokens[kSlots] = {0, 0, 0, 0};
  if (steps + 1 >= kWaitMarks) return InvalidArgument("too many steps");
  double untimed_wait = 0;
  if (times && !o_.timeline.empty()) FERRY_RETURN_IF_ERROR(e_.PinClock());
  FERRY_RETURN_IF_ERROR(e_.Mark(0));
  for (int k = 0; k < steps; ++k) {
    const int buf = k % 2, slot = k % kSlots, prev = (k + kSlots - 1) % kSlots;
    if (k >= 2) FERRY_RETURN_IF_ERROR(e_.WaitMark(k - 1));
    xfers[slot].clear();
    const int lanes = UsesPieces(kind) ? o_.lanes : 1;
    if (lanes > 1) FERRY_RETURN_IF_ERROR(e_.ForkLanes());
    for (size_t p = 0; p < blocks.size(); ++p) {
      const auto [c0, c1] = blocks[p];
      const size_t off = static_cast<size_t>(c0) * col_bytes, len = static_cast<size_t>(c1 - c0) * col_bytes;
      const int lane = static_cast<int>(p) % lanes;
      if (HasCompute(kind)) FERRY_RETURN_IF_ERROR(e_.Gemm(buf, c0, c1, lane));
      switch (kind) {
        case Kind::kCopyInProcess:
        case Kind::kSerial:
          FERRY_RETURN_IF_ERROR(e_.CopyOnStream(buf, off, len));
          break;
        case Kind::kSideStream:
        case Kind::kInStep: {
          FERRY_ASSIGN_OR_RETURN(tokens[slot], e_.CopyOnSideStream(buf, off, len, lane));
          break;
        }
        case Kind::kCopyFerry:
        case Kind::kFerryPipelined:
        case Kind::kFerryInStep: {
          CopyOptions co;
          co.stream_waitable = true;
          // Every ferryd copy starts after an event on the step stream, the copy alone
          // included. Without it, the host (up to two steps ahead of the GPU) submits step
          // k's copy while step k - 1 still waits for its own, so copy k runs before mark k
          // and the row times part of a copy (a 64 MiB copy in 0.40 ms, past the bus).
          // After its step's mark, the row times one copy from mark to mark, as the
          // in-process row (the copy in the step stream's order) does.
          SharedEvent& ev = events_[static_cast<size_t>(slot) * pieces_.size() + p];
          FERRY_RETURN_IF_ERROR(ev.Record(e_.stream(lane)));
          co.after = &ev;
          FERRY_ASSIGN_OR_RETURN(
              Transfer t, client_->Copy(Direction::kDeviceToHost, *host_[buf], off, *region_[buf], off, len, co));
          xfers[slot].push_back(std::move(t));
          break;
        }
        default:
          break;
      }
    }
    if (lanes > 1) FERRY_RETURN_IF_ERROR(e_.JoinLanes());
    if (own_exposed || !o_.timeline.empty()) FERRY_RETURN_IF_ERROR(e_.Mark(kWaitMarks + k));
    switch (kind) {
      case Kind::kSideStream:
        if (k >= 1) FERRY_RETURN_IF_ERROR(e_.StreamWaitCopy(tokens[prev]));
        break;
      case Kind::kInStep:
        FERRY_RETURN_IF_ERROR(e_.StreamWaitCopy(tokens[slot]));
        break;
      case Kind::kCopyFerry:
      case Kind::kFerryInStep:
        FERRY_RETURN_IF_ERROR(client_->StreamWait(xfers[slot], e_.stream()));
        break;
      case Kind::kFerryPipelined:
        if (k >= 1) FERRY_RETURN_IF_ERROR(client_->StreamWait(xfers[prev], e_.stream()));
        break;
      default:
        break;
    }
    FERRY_RETURN_IF_ERROR(e_.Mark(k + 1));
  }
  // The pipelined modes' last copy is still running: wait for it (untimed).
  if (steps > 0 && kind == Kind::kSideStream) FERRY_RETURN_IF_ERROR(e_.StreamWaitCopy(tokens[(steps - 1) % kSlots]));
  if (steps > 0 && kind == Kind::kFerryPipelined) {
    const auto t0 = std::chrono::steady_clock::now();
    for (Transfer& t : xfers[(steps - 1) % kSlots]) FERRY_RETURN_IF_ERROR(t.Wait(std::chrono::seconds(10)));
    untimed_wait = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  FERRY_RETURN_IF_ERROR(e_.Sync());
  if (IsFerry(kind)) {
    // Host waits report the copies' own status; a stream wait does not, so ask each copy.
    for (auto& slot : xfers) {
      for (Transfer& t : slot) FERRY_RETURN_IF_ERROR(t.Wait(std::chrono::seconds(10)));
    }
  }
  if (own_exposed) {
    *own_exposed = untimed_wait;
    for (int k = 0; k < steps; ++k) {
      FERRY_ASSIGN_OR_RETURN(double s, e_.MarkSeconds(kWaitMarks + k, k + 1));
      *own_exposed += s;
    }
  }
  if (times) {
    for (int k = std::min(o_.warmup, steps - 1); k < steps; ++k) {
      FERRY_ASSIGN_OR_RETURN(double s, e_.MarkSeconds(k, k + 1));
      times->push_back(s);
    }
  }
  if (times && !o_.timeline.empty()) {
    for (int k = std::min(o_.warmup, steps - 1); k < steps; ++k) {
      FERRY_ASSIGN_OR_RETURN(double start, e_.MarkClockMicros(k));
      FERRY_ASSIGN_OR_RETURN(double waits, e_.MarkClockMicros(kWaitMarks + k));
      FERRY_ASSIGN_OR_RETURN(double end, e_.MarkClockMicros(k + 1));
      char line[160];
      std::snprintf(line, sizeof line, ",%d,%d,%.3f,%.3f,%.3f\n", round_, k, start, waits, end);
      timeline_ += "\"" + mode_name_ + "\"" + line;
    }
  }
  return Status::Ok();
}

void Runner::RoundInputs(int round) {
  std::mt19937_64 rng(0x5eed0000ull + static_cast<uint64_t>(round) * 7919 + static_cast<uint64_t>(::getpid()));
  prev_a_ = a_;
  auto fill = [&](std::vector<float>& v) {
    for (size_t i = 0; i + 1 < v.size(); i += 2) {
      const uint64_t r = rng();
      v[i] = static_cast<float>(static_cast<int32_t>(r >> 40) - (1 << 23)) * (1.0f / (1 << 23));
      v[i + 1] = static_cast<float>(static_cast<int32_t>((r >> 16) & 0xFFFFFF) - (1 << 23)) * (1.0f / (1 << 23));
    }
  };
  fill(a_);
  fill(b_);
  const int n = e_.n();
  block_ = std::min(n, 128);
  block_i_ = static_cast<int>(rng() % static_cast<uint64_t>(n - block_ + 1));
  block_j_ = static_cast<int>(rng() % static_cast<uint64_t>(n - block_ + 1));
  // C1: fresh, random inputs.
  Check& c = C(0);
  size_t same = 0;
  if (prev_a_.size() == a_.size()) {
    for (size_t i = 0; i < a_.size(); ++i) same += a_[i] == prev_a_[i];
  }
  double sum = 0, sq = 0;
  for (float x : a_) sum += x, sq += static_cast<double>(x) * x;
  const double mean = sum / static_cast<double>(a_.size());
  const double sd = std::sqrt(sq / static_cast<double>(a_.size()) - mean * mean);
  const double frac = static_cast<double>(same) / static_cast<double>(a_.size());
  c.worst = std::max(c.worst, frac);
  if (frac > c.bound || sd < 0.5) {
    Fail(c, "round " + std::to_string(round) + ": " + std::to_string(frac) + " of A equal to the last round's, sd " +
                std::to_string(sd));
  }
}

void Runner::CompareToFp64(const std::vector<float>& c, Check& check, const char* which) {
  const int n = e_.n();
  double worst = 0;
  std::vector<double> acc(static_cast<size_t>(block_));
  for (int j = block_j_; j < block_j_ + block_; ++j) {
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int k = 0; k < n; ++k) {
      const double bkj = b_[static_cast<size_t>(j) * n + k];
      const float* ak = a_.data() + static_cast<size_t>(k) * n + block_i_;
      for (int i = 0; i < block_; ++i) acc[static_cast<size_t>(i)] += static_cast<double>(ak[i]) * bkj;
    }
    for (int i = 0; i < block_; ++i) {
      const double got = c[static_cast<size_t>(j) * n + block_i_ + i];
      worst = std::max(worst, std::fabs(acc[static_cast<size_t>(i)] - got));
    }
  }
  check.worst = std::max(check.worst, worst);
  if (!(worst <= check.bound)) Fail(check, std::string(which) + ": max |error| " + std::to_string(worst));
}

// Runs `m` for two more steps with both host destinations and both device outputs poisoned,
// then checks what arrived, byte for byte.
Status Runner::CheckedRun(const ModeSpec& m, int round) {
  const size_t bytes = e_.output_bytes();
  FERRY_RETURN_IF_ERROR(e_.Sync());
  for (int b = 0; b < 2; ++b) {
    if (HasCopy(m.kind)) std::memset(HostOut(m.kind, b), kHostPoison, bytes);
    if (HasCompute(m.kind)) FERRY_RETURN_IF_ERROR(e_.PoisonOutput(b, kDevicePoison));
  }
  FERRY_RETURN_IF_ERROR(RunSteps(m.kind, 2, nullptr));
  std::vector<float> dev;
  const std::string where = m.name + ", round " + std::to_string(round);
  for (int b = 0; b < 2; ++b) {
    FERRY_RETURN_IF_ERROR(e_.ReadOutput(b, dev));
    if (m.kind == Kind::kCompute) {
      if (b == 0) ref_ = dev;
      continue;
    }
    if (m.kind == Kind::kComputePieces) {
      if (b == 0) ref_pieces_ = dev;
      continue;
    }
    const auto* host = reinterpret_cast<const uint32_t*>(HostOut(m.kind, b));
    const size_t words = bytes / 4;
    size_t host_poison = 0, dev_poison = 0, differ = 0;
    uint32_t hp, dp;
    std::memset(&hp, kHostPoison, 4);
    std::memset(&dp, kDevicePoison, 4);
    const auto* d = reinterpret_cast<const uint32_t*>(dev.data());
    for (size_t i = 0; i < words; ++i) {
      host_poison += host[i] == hp;
      dev_poison += host[i] == dp;
      differ += host[i] != d[i];
    }
    Check& exact = IsFerry(m.kind) ? C(2) : C(3);
    C(1).worst = std::max(C(1).worst, static_cast<double>(host_poison));
    if (host_poison) Fail(C(1), where + ": " + std::to_string(host_poison) + " words never written");
    exact.worst = std::max(exact.worst, static_cast<double>(differ));
    if (differ)
      Fail(exact,
           where + ": " + std::to_string(differ) + " of " + std::to_string(words) + " words differ from the device's");
    if (!HasCompute(m.kind)) continue;
    C(8).worst = std::max(C(8).worst, static_cast<double>(dev_poison));
    if (dev_poison)
      Fail(C(8), where + ": " + std::to_string(dev_poison) + " words copied before their math wrote them");
    const std::vector<float>& ref = UsesPieces(m.kind) ? ref_pieces_ : ref_;
    const bool same = std::memcmp(dev.data(), ref.data(), bytes) == 0;
    C(7).worst = std::max(C(7).worst, same ? 0.0 : 1.0);
    if (!same) Fail(C(7), where + ": the product differs from the reference product of the same cut");
  }
  if (m.kind == Kind::kComputePieces) {
    // C5..C7: the cut product against the whole one, and both against float64 on a block.
    double worst = 0;
    for (size_t i = 0; i < ref_.size(); ++i)
      worst = std::max(worst, static_cast<double>(std::fabs(ref_[i] - ref_pieces_[i])));
    C(4).worst = std::max(C(4).worst, worst);
    if (!(worst <= C(4).bound)) Fail(C(4), "round " + std::to_string(round) + ": max |diff| " + std::to_string(worst));
    CompareToFp64(ref_, C(5), "unchunked");
    CompareToFp64(ref_pieces_, C(6), "chunked");
  }
  return Status::Ok();
}

Result<Report> Runner::Run() {
  const int n = e_.n();
  const int align = n >= 512 ? 64 : 8;
  if (o_.cut.empty()) {
    pieces_ = GeometricColumns(n, o_.pieces, o_.ratio, align);
  } else {
    int at = 0;
    for (int w : o_.cut) {
      if (w <= 0 || at + w > n)
        return InvalidArgument("--cut widths must be positive and sum to n = " + std::to_string(n));
      pieces_.emplace_back(at, at + w);
      at += w;
    }
    if (at != n) return InvalidArgument("--cut widths sum to " + std::to_string(at) + ", not n = " + std::to_string(n));
  }
  report_.engine = e_.kind();
  report_.ferry_version = kVersionString;
  report_.n = n;
  report_.steps = o_.steps;
  report_.warmup = o_.warmup;
  report_.rounds = o_.rounds;
  report_.pieces = pieces_;
  report_.lanes = o_.lanes;
  FERRY_RETURN_IF_ERROR(e_.SetLanes(o_.lanes));
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  report_.hostname = host;
  report_.issued_at = IsoTimeUtcNow();
  // The bounds, fixed before anything runs. FP32 sums of n products of numbers in [-1, 1):
  // the error grows like sqrt(n) * 2^-24 * |c|, about 1e-4 at n = 4096; the bound allows 20x.
  const double fp_bound = 5e-7 * n;
  report_.checks = {
      {"fresh-inputs",
       "each round's A and B are new uniform random numbers: at most this fraction equal to the last round's, sd > 0.5",
       1e-3, 0, true, ""},
      {"destination-written", "host destinations poisoned (0xFF) before each checked step: poisoned words left", 0, 0,
       true, ""},
      {"ferryd-copy-exact", "bytes copied through ferryd equal the device's bytes: words differing", 0, 0, true, ""},
      {"in-process-copy-exact", "bytes copied in-process equal the device's bytes: words differing", 0, 0, true, ""},
      {"chunked-vs-unchunked", "max |chunked product - unchunked product| over all n*n entries", fp_bound, 0, true, ""},
      {"unchunked-vs-fp64", "max |unchunked FP32 product - float64 CPU product| on a random 128x128 block", fp_bound, 0,
       true, ""},
      {"chunked-vs-fp64", "max |chunked FP32 product - float64 CPU product| on the same block", fp_bound, 0, true, ""},
      {"schedule-keeps-result", "every mode's product is bitwise the reference product of its cut (1: differs)", 0, 0,
       true, ""},
      {"copy-after-math",
       "device outputs poisoned (0xFE) before each checked step's math: poisoned words that reached the host", 0, 0,
       true, ""},
  };
  if (!o_.timeline.empty() && e_.kind() != "cuda") {
    return InvalidArgument("--timeline needs the GPU engine: the host engine's steps have no GPU times");
  }
  FERRY_RETURN_IF_ERROR(Setup());
  report_.environment = e_.Environment();

  std::vector<ModeSpec> modes{{Kind::kCompute, "compute (math alone)", ""},
                              {Kind::kComputePieces, "compute, cut in blocks", ""}};
  if (e_.has_in_process() && o_.in_process) {
    modes.push_back({Kind::kCopyInProcess, "copy alone, in-process", ""});
    modes.push_back({Kind::kSerial, "in-process serial", ""});
    modes.push_back({Kind::kSideStream, "in-process side stream", ""});
    modes.push_back({Kind::kInStep, "in-process in-step blocks", ""});
  }
  for (size_t i = 0; i < o_.policies.size(); ++i) {
    FERRY_ASSIGN_OR_RETURN(auto p, policy::ParsePolicy(o_.policies[i].text, o_.policies[i].source));
    const std::string tag = std::to_string(i);
    if (o_.copy_alone) modes.push_back({Kind::kCopyFerry, "ferryd " + p->name + ", copy alone", tag});
    modes.push_back({Kind::kFerryPipelined, "ferryd " + p->name + ", pipelined", tag});
    modes.push_back({Kind::kFerryInStep, "ferryd " + p->name + ", in-step blocks", tag});
  }
  FERRY_ASSIGN_OR_RETURN(std::string original, control_.RunningPolicyText(/*as_yaml=*/true));
  FERRY_ASSIGN_OR_RETURN(ctl::PolicyInfo original_info, control_.RunningPolicy());

  std::unique_ptr<bench::Progress> progress;
  if (!o_.quiet) progress = std::make_unique<bench::Progress>(modes.size() * static_cast<size_t>(o_.rounds));
  auto body = [&]() -> Status {
    for (int round = 0; round < o_.rounds; ++round) {
      RoundInputs(round);
      FERRY_RETURN_IF_ERROR(e_.SetInputs(a_, b_));
      std::string applied;
      ctl::PolicyInfo applied_info;
      for (const ModeSpec& m : modes) {
        ModeResult& meta = meta_[m.name];
        if (IsFerry(m.kind) && applied != m.policy_file) {
          const PolicyInput& in = o_.policies[std::stoul(m.policy_file)];
          FERRY_ASSIGN_OR_RETURN(applied_info, control_.ApplyPolicyText(in.text, in.source));
          applied = m.policy_file;
        }
        if (IsFerry(m.kind)) {
          meta.policy = applied_info.name;
          meta.policy_hash = applied_info.hash;
        }
        meta.name = m.name;
        meta.path = IsFerry(m.kind) ? "ferryd" : "in-process";
        meta.strategy = StrategyName(m.kind);
        meta.policy_file = m.policy_file.empty() ? "" : o_.policies[std::stoul(m.policy_file)].source;
        std::vector<double>& t = times_[m.name];
        const bool compare = IsFerry(m.kind) && !o_.metrics.empty();
        std::pair<double, uint64_t> before{0, 0};
        if (compare) {
          FERRY_ASSIGN_OR_RETURN(before, SettledExposed());
        }
        double own = 0;
        mode_name_ = m.name;
        round_ = round;
        FERRY_RETURN_IF_ERROR(RunSteps(m.kind, o_.warmup + o_.steps, &t, compare ? &own : nullptr).WithContext(m.name));
        if (compare) {
          FERRY_ASSIGN_OR_RETURN(auto after, SettledExposed());
          own_exposed_[m.name] += own;
          metric_exposed_[m.name] += after.first - before.first;
          metric_reports_[m.name] += after.second - before.second;
          compared_steps_[m.name] += o_.warmup + o_.steps;
        }
        FERRY_RETURN_IF_ERROR(CheckedRun(m, round).WithContext(m.name + " (checked steps)"));
        if (progress) progress->Step(m.name + ", round " + std::to_string(round + 1));
      }
    }
    return Status::Ok();
  };
  Status st = body();
  if (st.ok() && !o_.timeline.empty()) {
    st = WriteFileAtomically(o_.timeline,
                             "# each timed step's GPU times, us on CLOCK_MONOTONIC: step start, its waits for the "
                             "copies enqueued (the math done), step end\nmode,round,step,start_us,waits_us,end_us\n" +
                                 timeline_)
             .WithContext("writing the timeline");
  }
  // Put back what was running, whatever happened.
  auto restored = control_.ApplyPolicyText(original, "policy running before the overlap benchmark");
  if (!st.ok()) return st;
  if (!restored.ok()) return restored.status().WithContext("restoring the policy that was running");
  if (restored->hash != original_info.hash) {
    report_.notes.push_back("the restored policy's hash " + restored->hash + " differs from the original " +
                            original_info.hash);
  }

  for (const ModeSpec& m : modes) {
    ModeResult r = meta_[m.name];
    r.step = ToStat(times_[m.name]);
    if (const uint64_t steps = compared_steps_[m.name]; steps > 0) {
      r.own_exposed_per_step = own_exposed_[m.name] / static_cast<double>(steps);
      r.metric_exposed_per_step = metric_exposed_[m.name] / static_cast<double>(steps);
      r.metric_reports = metric_reports_[m.name];
      const double a = r.own_exposed_per_step, b = r.metric_exposed_per_step;
      r.exposed_agree = std::fabs(a - b) <= std::max(0.10 * std::max(a, b), 0.05e-3);
    }
    report_.modes.push_back(r);
  }
  const ModeResult* compute = report_.Find("in-process", "compute", "");
  report_.compute = compute->step;
  report_.compute_pieces = report_.modes[1].step;
  const ModeResult* copy = e_.has_in_process() ? report_.Find("in-process", "copy", "") : nullptr;
  if (!copy) {
    for (const auto& r : report_.modes) {
      if (r.strategy == "copy") {
        copy = &r;
        break;
      }
    }
  }
  report_.copy_seconds = copy ? copy->step.median : 0;
  for (ModeResult& r : report_.modes) {
    if (r.strategy == "compute" || r.strategy == "copy") continue;
    r.exposed = r.step.median - report_.compute.median;
    r.overlap = report_.copy_seconds > 0 ? 1 - r.exposed / report_.copy_seconds : 0;
  }
  // Where the daemon path loses to the in-process one, say so, with the difference.
  for (const ModeResult& r : report_.modes) {
    if (r.path != "ferryd" || r.strategy == "copy") continue;
    const ModeResult* base = report_.Find("in-process", r.strategy, "");
    if (base && r.exposed > base->exposed + 0.02e-3) {
      char line[256];
      std::snprintf(line, sizeof line, "%s exposes %.3f ms more than %s", r.name.c_str(),
                    (r.exposed - base->exposed) * 1e3, base->name.c_str());
      report_.notes.push_back(line);
    }
  }
  return report_;
}


std::string StatJson(const Stat& s) {
  return "{\"median\": " + json::Number(s.median) + ", \"min\": " + json::Number(s.min) + ", \"max\": " + json::Number(s.max) +
         ", \"n\": " + std::to_string(s.n) + "}";
}

}  // namespace

bool Report::checks_passed() const {
  return std::all_of(checks.begin(), checks.end(), [](const Check& c) { return c.pass; });
}

const ModeResult* Report::Find(const std::string& path, const std::string& strategy,
                               const std::string& policy_name) const {
  for (const ModeResult& m : modes) {
    if (m.path == path && m.strategy == strategy && (policy_name.empty() || m.policy == policy_name)) return &m;
  }
  return nullptr;
}

Result<PolicyInput> ReadPolicyFile(const std::string& path) {
  FERRY_ASSIGN_OR_RETURN(auto p, policy::LoadPolicyFile(path));  // the same errors as ferryd's
  std::ifstream in(path);
  PolicyInput r{path, std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>())};
  if (!in) return NotFound("cannot read " + path);
  return r;
}

std::vector<std::pair<int, int>> GeometricColumns(int n, int pieces, double ratio, int align) {
  pieces = std::max(1, pieces);
  std::vector<double> w(static_cast<size_t>(pieces));
  double x = 1, total = 0;
  for (int i = 0; i < pieces; ++i) {
    w[static_cast<size_t>(i)] = (i == pieces - 1 && pieces > 1) ? w[static_cast<size_t>(i) - 1] : x;
    total += w[static_cast<size_t>(i)];
    x *= ratio;
  }
  std::vector<std::pair<int, int>> out;
  int at = 0;
  for (int i = 0; i < pieces; ++i) {
    int cols = static_cast<int>(std::lround(w[static_cast<size_t>(i)] / total * n / align)) * align;
    cols = std::max(cols, align);
    if (i == pieces - 1 || at + cols > n) cols = n - at;
    if (cols <= 0) break;
    out.emplace_back(at, at + cols);
    at += cols;
  }
  return out;
}

Result<Report> Run(StepEngine& engine, const Options& options) {
  Runner r(engine, options);
  return r.Run();
}

std::string ToJson(const Report& r) {
  std::ostringstream j;
  j << "{\n  \"format\": \"ferry-overlap-report/1\",\n  \"issued_at\": " << json::String(r.issued_at)
    << ",\n  \"host\": " << json::String(r.hostname) << ",\n  \"ferry_version\": " << json::String(r.ferry_version)
    << ",\n  \"engine\": " << json::String(r.engine) << ",\n  \"daemon_backend\": " << json::String(r.daemon_backend)
    << ",\n  \"environment\": {";
  for (size_t i = 0; i < r.environment.size(); ++i) {
    j << (i ? ", " : "") << json::String(r.environment[i].first) << ": " << json::String(r.environment[i].second);
  }
  j << "},\n  \"workload\": {\"n\": " << r.n << ", \"bytes\": " << static_cast<uint64_t>(r.n) * r.n * 4
    << ", \"steps\": " << r.steps << ", \"warmup\": " << r.warmup << ", \"rounds\": " << r.rounds << ", \"blocks\": [";
  for (size_t i = 0; i < r.pieces.size(); ++i)
    j << (i ? ", " : "") << "[" << r.pieces[i].first << ", " << r.pieces[i].second << "]";
  j << "], \"compute_streams\": " << r.lanes << "},\n  \"compute_seconds\": " << StatJson(r.compute)
    << ",\n  \"compute_blocks_seconds\": " << StatJson(r.compute_pieces)
    << ",\n  \"copy_seconds\": " << json::Number(r.copy_seconds) << ",\n  \"modes\": [\n";
  for (size_t i = 0; i < r.modes.size(); ++i) {
    const ModeResult& m = r.modes[i];
    j << "    {\"name\": " << json::String(m.name) << ", \"path\": " << json::String(m.path)
      << ", \"strategy\": " << json::String(m.strategy);
    if (!m.policy.empty())
      j << ", \"policy\": " << json::String(m.policy) << ", \"policy_hash\": " << json::String(m.policy_hash);
    j << ", \"step_seconds\": " << StatJson(m.step);
    if (m.strategy != "compute" && m.strategy != "copy")
      j << ", \"exposed_seconds\": " << json::Number(m.exposed) << ", \"overlap\": " << json::Number(m.overlap);
    if (m.own_exposed_per_step >= 0) {
      j << ", \"exposed_per_step\": {\"bench_seconds\": " << json::Number(m.own_exposed_per_step)
        << ", \"ferryd_metric_seconds\": " << json::Number(m.metric_exposed_per_step)
        << ", \"ferryd_metric_reports\": " << m.metric_reports << ", \"agree\": " << (m.exposed_agree ? "true" : "false")
        << ", \"rule\": \"|bench - metric| <= max(10% of the larger, 0.05 ms)\"}";
    }
    j << "}" << (i + 1 < r.modes.size() ? "," : "") << "\n";
  }
  j << "  ],\n  \"checks\": [\n";
  for (size_t i = 0; i < r.checks.size(); ++i) {
    const Check& c = r.checks[i];
    j << "    {\"name\": " << json::String(c.name) << ", \"what\": " << json::String(c.what)
      << ", \"bound\": " << json::Number(c.bound) << ", \"worst\": " << json::Number(c.worst)
      << ", \"pass\": " << (c.pass ? "true" : "false");
    if (!c.pass) j << ", \"first_failure\": " << json::String(c.detail);
    j << "}" << (i + 1 < r.checks.size() ? "," : "") << "\n";
  }
  j << "  ],\n  \"notes\": [";
  for (size_t i = 0; i < r.notes.size(); ++i) j << (i ? ", " : "") << json::String(r.notes[i]);
  j << "],\n  \"checks_passed\": " << (r.checks_passed() ? "true" : "false") << "\n}\n";
  return j.str();
}

std::string ToText(const Report& r) {
  std::ostringstream t;
  char line[512];
  t << "overlap: " << r.n << "x" << r.n << " float32 matmul per step, its "
    << FormatByteSize(static_cast<size_t>(r.n) * r.n * 4) << " output copied device to host\n";
  t << "engine " << r.engine << ", ferryd backend " << r.daemon_backend;
  for (const auto& [k, v] : r.environment) t << ", " << k << " " << v;
  t << ", ferry " << r.ferry_version << "\n";
  t << r.rounds << " rounds of fresh random inputs x " << r.steps << " timed steps (after " << r.warmup
    << " warm-up) per mode; medians [min .. max] in ms; in-step blocks (columns):";
  for (const auto& [a, b] : r.pieces) t << " " << (b - a);
  if (r.lanes > 1) t << ", on " << r.lanes << " compute streams in turn";
  t << "\n\n";
  std::snprintf(line, sizeof line, "%-38s %-26s %10s %24s %10s %8s\n", "mode", "policy", "step", "[min .. max]",
                "exposed", "overlap");
  t << line;
  for (const ModeResult& m : r.modes) {
    const bool copy_mode = m.strategy != "compute" && m.strategy != "copy";
    char exposed[32] = "", overlap[32] = "", range[64];
    if (copy_mode) {
      std::snprintf(exposed, sizeof exposed, "%.3f", m.exposed * 1e3);
      std::snprintf(overlap, sizeof overlap, "%.1f%%", m.overlap * 100);
    }
    std::snprintf(range, sizeof range, "[%.3f .. %.3f]", m.step.min * 1e3, m.step.max * 1e3);
    std::string pol = m.policy.empty() ? "-" : m.policy + " " + m.policy_hash.substr(0, 8);
    std::snprintf(line, sizeof line, "%-38s %-26s %10.3f %24s %10s %8s\n", m.name.c_str(), pol.c_str(),
                  m.step.median * 1e3, range, exposed, overlap);
    t << line;
  }
  std::snprintf(line, sizeof line,
                "\ncompute %.3f ms, copy %.3f ms (exposed = step - compute; overlap = 1 - exposed / copy)\n",
                r.compute.median * 1e3, r.copy_seconds * 1e3);
  t << line;
  bool compared = false;
  for (const ModeResult& m : r.modes) {
    if (m.own_exposed_per_step < 0) continue;
    if (!compared) {
      t << "\nexposed copy time per step, the bench's own measurement (" << (r.engine == "host" ? "host clock" : "GPU events")
        << " around its waits) beside ferryd's ferry_exposed_seconds (clients' reports, bounded by ferryd):\n";
      std::snprintf(line, sizeof line, "%-38s %12s %14s %9s %6s\n", "mode", "bench ms", "ferryd ms", "reports", "agree");
      t << line;
      compared = true;
    }
    std::snprintf(line, sizeof line, "%-38s %12.4f %14.4f %9llu %6s\n", m.name.c_str(), m.own_exposed_per_step * 1e3,
                  m.metric_exposed_per_step * 1e3, static_cast<unsigned long long>(m.metric_reports),
                  m.exposed_agree ? "yes" : "NO");
    t << line;
  }
  if (compared) t << "(agree: |bench - ferryd| <= max(10% of the larger, 0.05 ms))\n";
  t << "\nchecks (bounds fixed before the run):\n";
  for (const Check& c : r.checks) {
    std::snprintf(line, sizeof line, "  %-4s %-22s worst %-10.3g bound %-10.3g %s\n", c.pass ? "ok" : "FAIL",
                  c.name.c_str(), c.worst, c.bound, c.what.c_str());
    t << line;
    if (!c.pass) t << "       first failure: " << c.detail << "\n";
  }
  for (const std::string& n : r.notes) t << "note: " << n << "\n";
  return t.str();
}

std::string ToSvg(const Report& r) {
  std::vector<const ModeResult*> rows;
  for (const ModeResult& m : r.modes) {
    if (m.strategy != "copy") rows.push_back(&m);
  }
  double scale_max = 0;
  for (const ModeResult* m : rows) scale_max = std::max(scale_max, m->step.median);
  const int left = 300, width = 560, row_h = 26, top = 56;
  const int height = top + static_cast<int>(rows.size()) * row_h + 50;
  std::ostringstream s;
  s << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << left + width + 140 << "\" height=\"" << height
    << "\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  s << "<text x=\"10\" y=\"20\" font-size=\"15\">One step: " << r.n << "x" << r.n
    << " matmul (blue) and the copy time it exposes (red), to scale</text>\n";
  s << "<text x=\"10\" y=\"38\" fill=\"#555\">";
  for (const auto& [k, v] : r.environment) {
    if (k == "chip" || k == "driver" || k == "cuda_runtime" || k == "cublas") s << k << " " << v << "  ";
  }
  s << "ferry " << r.ferry_version << "; medians of warm steps</text>\n";
  auto px = [&](double sec) { return scale_max > 0 ? sec / scale_max * width : 0; };
  for (size_t i = 0; i < rows.size(); ++i) {
    const ModeResult& m = *rows[i];
    const int y = top + static_cast<int>(i) * row_h;
    const double compute = m.strategy == "compute" ? m.step.median : r.compute.median;
    const double exposed = m.strategy == "compute" ? 0 : std::max(0.0, m.exposed);
    s << "<text x=\"" << left - 8 << "\" y=\"" << y + 15 << "\" text-anchor=\"end\">" << m.name << "</text>\n";
    s << "<rect x=\"" << left << "\" y=\"" << y + 3 << "\" width=\"" << json::Number(px(compute)) << "\" height=\"" << row_h - 8
      << "\" fill=\"#4878d0\"/>\n";
    if (exposed > 0) {
      s << "<rect x=\"" << json::Number(left + px(compute)) << "\" y=\"" << y + 3 << "\" width=\"" << json::Number(px(exposed))
        << "\" height=\"" << row_h - 8 << "\" fill=\"#d65f5f\"/>\n";
    }
    char label[96];
    if (m.strategy == "compute")
      std::snprintf(label, sizeof label, "%.3f ms", m.step.median * 1e3);
    else
      std::snprintf(label, sizeof label, "%.3f ms, exposed %.3f", m.step.median * 1e3, m.exposed * 1e3);
    s << "<text x=\"" << json::Number(left + px(compute + exposed) + 6) << "\" y=\"" << y + 15 << "\">" << label << "</text>\n";
  }
  const int axis_y = top + static_cast<int>(rows.size()) * row_h + 8;
  s << "<line x1=\"" << left << "\" y1=\"" << axis_y << "\" x2=\"" << left + width << "\" y2=\"" << axis_y
    << "\" stroke=\"black\"/>\n";
  for (int k = 0; k <= 4; ++k) {
    const double sec = scale_max * k / 4;
    s << "<text x=\"" << json::Number(left + px(sec)) << "\" y=\"" << axis_y + 16 << "\" text-anchor=\"middle\">"
      << json::Number(std::round(sec * 1e5) / 100) << " ms</text>\n";
  }
  s << "</svg>\n";
  return s.str();
}

}  // namespace ferry::overlap
