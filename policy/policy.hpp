// Scheduling policies (policies/*.yaml): how ferryd cuts copies into pieces, how many copy
// streams it feeds, how much it keeps on the engines at once, and how it shares them between
// clients. A Policy is immutable once parsed; the server holds the current one by shared_ptr and
// every accepted copy keeps the one it started under. The model alone (parse, print, compare):
// ferryd and the operator's tools share it without the tools linking the daemon.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/status.hpp"

namespace ferry::policy {

enum class Schedule {
  kSerial,      // whole copies, one at a time, one stream: the baseline
  kSideStream,  // whole copies on their own streams, running under the clients' compute
  kChunked,     // fixed-size chunks over N streams
  kGeometric,   // chunks shrinking toward the tail, so the last (exposed) piece is small
};

enum class StreamPriority { kGreatest, kLeast };

struct ClientClass {
  std::string name;
  uint32_t weight = 1;            // share of the copy engines against other clients with bulk work
  bool latency_allowed = true;    // may its latency-class copies use the latency stream
};

struct ClientRule {
  std::string name_glob;  // fnmatch(3) against the client's name
  int64_t uid = -1;       // -1: any
  std::string class_name;
};

struct Policy;

// A part of a policy that applies to some GPUs only: their engines run `policy`, the policy with
// the override's engine settings (schedule, streams, limits, batching) put over its own.
// Classes, client rules and staging are node-wide and cannot be overridden.
struct GpuOverride {
  std::vector<int> ordinals;       // CUDA ordinals, as in ferryd's `devices` list
  std::vector<std::string> uuids;  // "GPU-..." (or a simulated GPU's "host-gpu-N"), lower case
  std::shared_ptr<const Policy> policy;
  bool Matches(int ordinal, std::string_view uuid) const;
  std::string MatchText() const;  // "1, GPU-..." as written
  // "key: the node's -> the override's" for each setting it changes of `node`, its policy.
  std::vector<std::string> Changes(const Policy& node) const;
};

struct Policy {
  // The defaults are policies/chunked.yaml (a test keeps the two equal).
  std::string name = "chunked";
  std::string description;
  Schedule schedule = Schedule::kChunked;
  uint64_t chunk_bytes = 64ull << 20;     // chunked
  uint64_t first_chunk_bytes = 0;         // geometric: 0 = (1 - ratio) of the copy
  double ratio = 0.5;                     // geometric: each chunk this fraction of the one before
  uint64_t min_chunk_bytes = 1ull << 20;  // geometric: no chunk smaller (except a copy's remainder)
  uint32_t bulk_streams = 4;              // per direction
  StreamPriority bulk_priority = StreamPriority::kLeast;
  uint64_t in_flight_bytes = 128ull << 20;        // per direction: bulk bytes on the engines at once, all clients
  uint64_t client_in_flight_bytes = 0;            // per client; 0: same as in_flight_bytes
  uint32_t max_copies_in_flight = 0;              // 0: unlimited (serial: 1)
  uint64_t latency_max_bytes = 1ull << 20;        // larger "latency" copies are scheduled as bulk
  uint64_t batch_threshold_bytes = 1ull << 20;    // pieces up to this size are batched per stream
  // A client's small copies adjacent on both sides are joined into one engine copy, up to this
  // size (0: never). 16 MiB: 1024 x 64 KiB in order went at 47.4 and 46.6 GB/s through ferryd
  // on an H100, against 45.1 and 45.2 in runs of 4 MiB and 42.8 and 42.1 in runs of 1 MiB.
  uint64_t join_bytes = 16ull << 20;
  // Staging pageable memory (Client::CopyStaged): the client library's threads copy each chunk
  // (at most this size) into one of this many pool buffers together while ferryd DMAs the
  // chunks already staged. 12 threads: on the H200's host, with streaming stores, 12 reached 40
  // GB/s at every size from 64 MiB in both rounds of an A/B where 8 did in one and 16 in none
  // (run 20 of docs/measurements/h200-poll-2026-12-03.txt). The client uses at most the CPUs it may run on.
  uint64_t staging_chunk_bytes = 8ull << 20;
  uint32_t staging_threads = 12;
  uint32_t staging_buffers = 16;
  std::vector<ClientClass> classes{{"default", 1, true}};
  std::vector<ClientRule> clients;
  std::string default_class = "default";
  // In the file's order; a GPU runs the first that names it, else this policy.
  std::vector<GpuOverride> gpu_overrides;

  // The policy the engines of this GPU run: its override's, or this one. `self` is this
  // policy's own shared_ptr (what the caller holds).
  const std::shared_ptr<const Policy>& ForGpu(const std::shared_ptr<const Policy>& self, int ordinal,
                                              std::string_view uuid) const;

  // Every setting, one "key: value" per line, sorted: what `policy show` prints and what the
  // hash covers (so two files that say the same thing have the same hash).
  std::string Canonical() const;
  std::string Hash() const;  // first 16 hex digits of SHA-256(Canonical())
  // A policy file that parses back to this policy (same Canonical()): what `ferryctl tune`
  // writes and what a tool saves to restore the running policy later.
  std::string ToYaml() const;
  const ClientClass& ClassFor(const std::string& client_name, int64_t uid) const;
  // The piece lengths for a copy of `length` bytes under this policy.
  void Pieces(uint64_t length, std::vector<uint64_t>& out) const;
};

inline constexpr uint32_t kMaxBulkStreams = 8;  // == daemon's kBulkStreamsPerBank

// Every error names file:line:col and what was expected.
Result<std::shared_ptr<const Policy>> ParsePolicy(const std::string& text, const std::string& name);
Result<std::shared_ptr<const Policy>> LoadPolicyFile(const std::string& path);
// "key: old -> new" for each setting that differs.
std::vector<std::string> DiffPolicies(const Policy& a, const Policy& b);
// The same, from canonical text (what `policy show` prints; "#" lines are ignored).
std::vector<std::string> DiffCanonical(const std::string& a, const std::string& b);
std::string_view ScheduleName(Schedule s);
// The policy's own settings as canonical key -> value ("streams.bulk_priority" -> "least"),
// without its GPU overrides' lines.
std::map<std::string, std::string> CanonicalSettings(const Policy& p);

}  // namespace ferry::policy

// ferryd's code names the model as its own (the policy was the daemon's before it was a library).
namespace ferry::daemon {
using policy::ClientClass;
using policy::ClientRule;
using policy::DiffCanonical;
using policy::DiffPolicies;
using policy::GpuOverride;
using policy::kMaxBulkStreams;
using policy::LoadPolicyFile;
using policy::ParsePolicy;
using policy::Policy;
using policy::Schedule;
using policy::ScheduleName;
using policy::StreamPriority;
}  // namespace ferry::daemon
