// Signed, hash-chained measurement snapshots. Every interval ferryd writes DIR/snapshot-NNNNNN.json
// (what it measured in the window, on which machine, GPU, driver and policy, and the SHA-256 of
// the snapshot before it) and DIR/snapshot-NNNNNN.json.minisig (minisign format, trusted comment
// "ferry snapshot <record id> seq <n>"). A restart continues the chain found in DIR.
#pragma once

#include <chrono>
#include <condition_variable>
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
  std::string host_id;  // empty: /etc/machine-id
  std::string version, gpu_name, gpu_uuid, driver, cuda_runtime, cublas;
};

class SnapshotWriter : public ServerObserver {
 public:
  static Result<std::unique_ptr<SnapshotWriter>> Create(const SnapshotOptions& options);
  ~SnapshotWriter() override;  // writes the last (partial) window

  void Start();
  uint64_t last_sequence() const;

  void OnCopyDone(const CopyRecord& r) override;
  void OnExposed(Direction direction, std::string_view client_class, std::string_view policy, double seconds) override;
  void OnPolicy(const Policy& now) override;
  void OnPolicyRefused() override {}
  void OnRejected(std::string_view) override {}

  // Writes one snapshot of the window so far now (the timer does this every interval).
  Status WriteNow();

 private:
  SnapshotWriter() = default;
  Status Continue();  // finds the chain's end in dir
  struct Window {
    uint64_t copies = 0, failed = 0, bytes[2] = {0, 0};
    std::vector<float> exposed;  // seconds; capped, see kMaxSamples
    uint64_t exposed_seen = 0;
  };
  static constexpr size_t kMaxSamples = 200000;

  SnapshotOptions opt_;
  signing::SecretKey key_;
  mutable std::mutex mu_;  // guards everything below
  Window window_;
  std::string policy_name_, policy_hash_;
  std::chrono::system_clock::time_point window_start_;
  uint64_t seq_ = 0;
  std::string prev_hash_;
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
  void OnExposed(Direction d, std::string_view c, std::string_view p, double s) override {
    for (auto* o : all_) o->OnExposed(d, c, p, s);
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
