#include <thread>

#include "daemon/backend.hpp"
#include "daemon/config.hpp"

namespace ferry::daemon {
namespace {

Result<std::vector<std::unique_ptr<Backend>>> HostGpus(const DaemonConfig& config, uint32_t streams) {
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
  std::vector<std::unique_ptr<Backend>> out;
  for (int ordinal : ordinals) {
    HostBackendOptions o;
    o.streams_per_direction = streams;
    o.ordinal = ordinal;
    o.numa_node = ordinal % static_cast<int>(config.host_numa_nodes);
    auto b = CreateHostBackend(o);
    if (!b.ok()) return b.status();
    out.push_back(std::move(*b));
  }
  return out;
}

// A context per GPU takes a few hundred milliseconds to make: they are made side by side.
Result<std::vector<std::unique_ptr<Backend>>> CudaGpus(const DaemonConfig& config, uint32_t streams) {
  auto ordinals = ResolveCudaDevices(config.devices);
  if (!ordinals.ok()) return ordinals.status();
  std::vector<Result<std::unique_ptr<Backend>>> made;
  for (size_t i = 0; i < ordinals->size(); ++i) made.emplace_back(Internal("not made"));
  std::vector<std::thread> threads;
  for (size_t i = 0; i < ordinals->size(); ++i) {
    auto make = [&, i] { made[i] = CreateCudaBackend((*ordinals)[i], streams, config.trace_engine); };
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

Result<std::vector<std::unique_ptr<Backend>>> CreateBackends(const DaemonConfig& config, std::string* why) {
  // Every stream a policy may use exists from the start, so switching policies never creates any.
  const uint32_t streams = kStreamsPerDirection;
  switch (config.backend) {
    case BackendChoice::kHost:
      *why = std::string("backend: host (as configured)") +
             (config.trace_engine ? "; --trace-engine ignored: the host backend has no copy engines" : "");
      return HostGpus(config, streams);
    case BackendChoice::kCuda:
      *why = "backend: cuda (as configured)";
      return CudaGpus(config, streams);
    case BackendChoice::kAuto: {
      auto cuda = CudaGpus(config, streams);
      if (cuda.ok()) {
        *why = "backend: cuda (auto: a GPU answered)";
        return cuda;
      }
      *why = "backend: host (auto: " + cuda.status().message() + ")";
      return HostGpus(config, streams);
    }
  }
  return Internal("unknown backend choice");
}

}  // namespace ferry::daemon
