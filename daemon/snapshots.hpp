// Signed, hash-chained measurement snapshots. Every interval ferryd writes DIR/snapshot-NNNNNN.json
// (what it measured in the window, on which machine, GPU, driver and policy, and the SHA-256 of
// the snapshot before it) and DIR/snapshot-NNNNNN.json.minisig (minisign format, trusted comment
// "ferry snapshot <record id> seq <n>"). A restart continues the chain found in DIR once its
// newest record (and the link to the one before) verifies with ferryd's own key; otherwise it
// starts a new chain after the highest sequence there, its first record naming why
// ("previous_chain_broken"), and never rewrites a file that is there.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/signing.hpp"
#include "daemon/server.hpp"

namespace ferry::daemon {

struct SnapshotOptions {
  std::string dir;
  std::string key_path;
  std::chrono::milliseconds interval{60000};
  std::string host_id;  // configured (snapshots.host_id); empty: a hash of /etc/machine-id
  std::string version;
  DeviceInfo device;
  // Fills device.cublas, on the writer's thread (loading cuBLAS to ask takes a fraction of a
  // second, kept off ferryd's start); null: device.cublas as given.
  std::function<std::string()> cublas_version;
  // Told (on the writer's thread) about each record written, and each one not written with a
  // bounded reason ("key_permissions", "write"); the metrics exporter listens.
  std::function<void(uint64_t seq, const std::string& record_id, const std::string& chain)> on_written;
  std::function<void(std::string_view reason)> on_failure;
  uint64_t first_sequence = 1;  // of a chain started in an empty dir (tests start high)
};

class SnapshotWriter : public ServerObserver {
 public:
  static Result<std::unique_ptr<SnapshotWriter>> Create(const SnapshotOptions& options);
  ~SnapshotWriter() override;  // writes the last (partial) window

  // The GPU the records name, when it was not known at Create (ferryd makes its GPUs' backends
  // while it builds its pool). Before Start.
  void SetDevice(const DeviceInfo& device) { opt_.device = device; }
  void Start();
  uint64_t last_sequence() const;

  void OnCopyDone(const CopyRecord& r) override;
  void OnExposed(const ExposedRecord& r) override;
  void OnPolicy(const Policy& now) override;
  void OnPolicyRefused() override {}
  void OnRejected(std::string_view reason) override;
  std::string chain() const;

  // Writes one snapshot of the window so far now (the timer does this every interval).
  Status WriteNow();

 private:
  SnapshotWriter() = default;
  Status Continue();  // finds the chain's end in dir
  Status VerifyTail(uint64_t seq, std::string* body);  // the newest record and its link back
  // Seconds; past kMaxSamples, a uniform sample (reservoir), so percentiles stay honest under load.
  struct Samples {
    std::vector<float> kept;
    uint64_t seen = 0;
    double sum = 0;
    void Add(double v, std::minstd_rand& rng);
  };
  struct Window {
    // Measured by ferryd.
    uint64_t copies = 0, failed = 0, bytes[2] = {0, 0};
    Samples copy, queued;
    // Reported by clients (exposed time), and ferryd's own time of the copies they reported.
    Samples exposed;
    double reported_copy_seconds = 0;
    uint64_t reports_refused = 0;
  };
  static constexpr size_t kMaxSamples = 200000;

  SnapshotOptions opt_;
  std::string host_id_;  // as the records name it (common/environment)
  signing::SecretKey key_;
  mutable std::mutex mu_;  // guards everything below
  Window window_;
  std::string policy_name_, policy_hash_;
  std::chrono::system_clock::time_point window_start_;
  uint64_t seq_ = 0;
  std::string prev_hash_;
  std::string chain_;               // id of the chain being written
  std::string chain_broken_;        // non-empty: the next record starts a new chain, and why
  bool stop_ = false;
  std::minstd_rand rng_{12345};
  std::condition_variable cv_;
  std::thread thread_;
};

// Forwards to several observers (metrics and snapshots).
class ObserverTee : public ServerObserver {
 public:
  void Add(ServerObserver* o) {
    if (o != nullptr) all_.push_back(o);
  }
  bool empty() const { return all_.empty(); }
  void OnCopyDone(const CopyRecord& r) override {
    for (auto* o : all_) o->OnCopyDone(r);
  }
  void OnExposed(const ExposedRecord& r) override {
    for (auto* o : all_) o->OnExposed(r);
  }
  void OnPolicy(const Policy& now) override {
    for (auto* o : all_) o->OnPolicy(now);
  }
  void OnPolicyRefused() override {
    for (auto* o : all_) o->OnPolicyRefused();
  }
  void OnRejected(std::string_view r) override {
    for (auto* o : all_) o->OnRejected(r);
  }

 private:
  std::vector<ServerObserver*> all_;
};

}  // namespace ferry::daemon
