#include "daemon/config.hpp"
#include "daemon/backend.hpp"

namespace ferry::daemon {

Result<std::unique_ptr<Backend>> CreateBackend(const DaemonConfig& config, std::string* why) {
  // Every stream a policy may use exists from the start, so switching policies never creates any.
  const uint32_t streams = kStreamsPerDirection;
  switch (config.backend) {
    case BackendChoice::kHost:
      *why = std::string("backend: host (as configured)") +
             (config.trace_engine ? "; --trace-engine ignored: the host backend has no copy engines" : "");
      return CreateHostBackend({streams});
    case BackendChoice::kCuda:
      *why = "backend: cuda (as configured)";
      return CreateCudaBackend(config.device, streams, config.trace_engine);
    case BackendChoice::kAuto: {
      auto cuda = CreateCudaBackend(config.device, streams, config.trace_engine);
      if (cuda.ok()) {
        *why = "backend: cuda (auto: a GPU answered)";
        return cuda;
      }
      *why = "backend: host (auto: " + cuda.status().message() + ")";
      return CreateHostBackend({streams});
    }
  }
  return Internal("unknown backend choice");
}

}  // namespace ferry::daemon
