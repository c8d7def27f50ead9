#include <thread>

#include "daemon/backend.hpp"
#include "daemon/config.hpp"

namespace ferry::daemon {
namespace {

Result<std::vector<GpuLocation>> LocateHostGpus(const DaemonConfig& config) {
  std::vector<int> ordinals;
  if (config.devices.empty()) {
    for (uint32_t i = 0; i < config.host_gpus; ++i) ordinals.push_back(static_cast<int>(i));
  }
  for (const std::string& d : config.devices) {
    if (d.compare(0, 4, "GPU-") == 0) {
      return InvalidArgument("devices names " + d + ", but the host backend's simulated GPUs have ordinals only");
    }
    const int ordinal = std::stoi(d);
    if (ordinal >= static_cast<int>(config.host_gpus)) {
      return InvalidArgument("devices names GPU " + d + ", but the host backend simulates " +
                             std::to_string(config.host_gpus) + " (host.gpus)");
    }
    ordinals.push_back(ordinal);
  }
  std::vector<GpuLocation> out;
  for (int ordinal : ordinals) out.push_back({ordinal, ordinal % static_cast<int>(config.host_numa_nodes), ""});
  return out;
}

Result<std::vector<std::unique_ptr<Backend>>> HostGpus(const std::vector<GpuLocation>& gpus, uint32_t streams,
                                                       const HostLink& link, uint64_t gpu_memory_bytes) {
  std::vector<std::unique_ptr<Backend>> out;
  for (const GpuLocation& g : gpus) {
    HostBackendOptions o;
    o.streams_per_direction = streams;
    o.ordinal = g.ordinal;
    o.numa_node = g.numa_node;
    o.link = link;
    o.device_memory_bytes = gpu_memory_bytes;
    auto b = CreateHostBackend(o);
    if (!b.ok()) return b.status();
    out.push_back(std::move(*b));
  }
  return out;
}

const char* HostOnlyNote(const DaemonConfig& config) {
  return config.host_link.paced() ? "; host.copy_rate and host.slow ignored: they simulate a link on the host backend" : "";
}

// A context per GPU takes a few hundred milliseconds to make: they are made side by side.
Result<std::vector<std::unique_ptr<Backend>>> CudaGpus(const DaemonConfig& config, const std::vector<GpuLocation>& gpus,
                                                       uint32_t streams) {
  std::vector<Result<std::unique_ptr<Backend>>> made;
  for (size_t i = 0; i < gpus.size(); ++i) made.emplace_back(Internal("not made"));
  std::vector<std::thread> threads;
  for (size_t i = 0; i < gpus.size(); ++i) {
    auto make = [&, i] { made[i] = CreateCudaBackend(gpus[i], streams, config.trace_engine, config.issue_threads); };
    try {
      threads.emplace_back(make);
    } catch (const std::system_error&) {
      make();  // out of threads: made here, one after another
    }
  }
  for (auto& t : threads) t.join();
  std::vector<std::unique_ptr<Backend>> out;
  for (auto& m : made) {
    if (!m.ok()) return m.status();
    out.push_back(std::move(*m));
  }
  return out;
}

}  // namespace

Result<std::vector<GpuLocation>> LocateGpus(const DaemonConfig& config, wire::BackendKind* kind, std::string* why) {
  switch (config.backend) {
    case BackendChoice::kHost:
      *kind = wire::BackendKind::kHost;
      *why = std::string("backend: host (as configured)") +
             (config.trace_engine ? "; --trace-engine ignored: the host backend has no copy engines" : "");
      return LocateHostGpus(config);
    case BackendChoice::kCuda:
      *kind = wire::BackendKind::kCuda;
      *why = std::string("backend: cuda (as configured)") + HostOnlyNote(config);
      return LocateCudaGpus(config.devices);
    case BackendChoice::kAuto: {
      auto cuda = LocateCudaGpus(config.devices);
      if (cuda.ok()) {
        *kind = wire::BackendKind::kCuda;
        *why = std::string("backend: cuda (auto: a GPU answered)") + HostOnlyNote(config);
        return cuda;
      }
      *kind = wire::BackendKind::kHost;
      *why = "backend: host (auto: " + cuda.status().message() + ")";
      return LocateHostGpus(config);
    }
  }
  return Internal("unknown backend choice");
}

Result<std::vector<std::unique_ptr<Backend>>> CreateBackends(const DaemonConfig& config, wire::BackendKind kind,
                                                             const std::vector<GpuLocation>& gpus) {
  // Every stream a policy may use exists from the start, so switching policies never creates any.
  const uint32_t streams = kStreamsPerDirection;
  if (kind == wire::BackendKind::kHost) return HostGpus(gpus, streams, config.host_link, config.host_gpu_memory_bytes);
  return CudaGpus(config, gpus, streams);
}

Result<std::vector<std::unique_ptr<Backend>>> CreateBackends(const DaemonConfig& config, std::string* why) {
  wire::BackendKind kind = wire::BackendKind::kHost;
  auto gpus = LocateGpus(config, &kind, why);
  if (!gpus.ok()) return gpus.status();
  return CreateBackends(config, kind, *gpus);
}

}  // namespace ferry::daemon
