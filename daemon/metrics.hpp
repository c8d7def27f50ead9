// ferryd's Prometheus exporter: /metrics on the configured address (prometheus-cpp). Counters
// and histograms are fed by the server as ServerObserver; gauges are read from ServerCounters
// at scrape time. Label sets are bounded: direction, client class, policy name, result, reason;
// never a pid, client name or request.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "daemon/server.hpp"
#include "ferry/status.hpp"

namespace ferry::daemon {

struct MetricsInfo {
  std::string version;
  // The first GPU's (its backend and CUDA versions) and every GPU's (ferry_gpu_info, per-GPU
  // counters); a device without a backend: given later, by SetGpus.
  DeviceInfo device;
  std::vector<DeviceInfo> gpus;
};

class MetricsExporter : public ServerObserver {
 public:
  // Binds `address` ("127.0.0.1:9477"; port 0 picks a free one). Counters come from the
  // server (attach with Attach() once the server exists).
  static Result<std::unique_ptr<MetricsExporter>> Create(const std::string& address, const MetricsInfo& info);
  ~MetricsExporter() override;

  void Attach(const Server* server);  // gauges read from it at scrape time; null detaches
  // The GPUs, once known (ferryd makes them while it builds its pool): once, before Attach.
  void SetGpus(const std::vector<DeviceInfo>& gpus);
  int port() const;                   // the bound port

  void OnCopyDone(const CopyRecord& r) override;
  void OnExposed(const ExposedRecord& r) override;
  void OnPolicy(const Policy& now) override;
  void OnPolicyRefused() override;
  void OnRejected(std::string_view reason) override;

  // From the snapshot writer (any thread): the newest signed record, an outside anchor for
  // ferryctl verify --expect-latest; and a snapshot not written (reason: a bounded set).
  void OnSnapshotWritten(uint64_t sequence, const std::string& record_id, const std::string& chain);
  void OnSnapshotFailed(std::string_view reason);

  class Impl;

 private:
  explicit MetricsExporter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ferry::daemon
