#include "common/environment.hpp"

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "common/json.hpp"
#include "common/signing.hpp"

namespace ferry::environment {
namespace {

// "NVRM version: NVIDIA UNIX [Open ]Kernel Module [for x86_64]  580.159.04  Release Build ...":
// the first token after "Module" that is digits and dots is the driver's release.
bool NvidiaDriverRelease(const std::string& path, std::string& out, std::string& why) {
  std::ifstream f(path);
  if (!f) {
    why = "no NVIDIA kernel module loaded (" + path + ": " + std::strerror(errno) + ")";
    return false;
  }
  std::string line;
  std::getline(f, line);
  const auto k = line.find("Module");
  std::istringstream words(k == std::string::npos ? line : line.substr(k));
  for (std::string w; words >> w;) {
    if (std::isdigit(static_cast<unsigned char>(w[0])) && w.find_first_not_of("0123456789.") == std::string::npos) {
      out = w;
      return true;
    }
  }
  why = path + " names no driver release: '" + line.substr(0, 120) + "'";
  return false;
}

}  // namespace

std::string CudaVersionText(int version) {
  return std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10);
}

Block Build(const Facts& f) {
  Block b;
  const bool gpu = f.no_gpu.empty();
  auto put = [&](const std::string& key, const std::string& value, const std::string& why_not) {
    if (!value.empty()) {
      b.emplace_back(key, value);
      return;
    }
    b.emplace_back(key, gpu ? "unknown" : "none");
    b.emplace_back(key + "_reason", gpu ? why_not : f.no_gpu);
  };
  put("chip", f.chip, "the GPU did not say its name");
  put("gpu_uuid", f.gpu_uuid, "the GPU did not say its UUID");
  std::string driver, why;
  if (gpu && !NvidiaDriverRelease(f.nvidia_version_path, driver, why)) driver.clear();
  put("driver", driver, why);
  put("driver_cuda", f.cuda_driver > 0 ? CudaVersionText(f.cuda_driver) : "", "cudaDriverGetVersion failed");
  put("cuda_runtime", f.cuda_runtime > 0 ? CudaVersionText(f.cuda_runtime) : "", "cudaRuntimeGetVersion failed");
  put("cublas", f.cublas, "no cuBLAS library found (libcublas.so)");
  for (auto& kv : HostId(f.host_id, f.machine_id_path)) b.push_back(std::move(kv));
  return b;
}

Block HostId(const std::string& configured, const std::string& machine_id_path) {
  if (!configured.empty()) return {{"host_id", configured}, {"host_id_source", "configured"}};
  errno = 0;
  std::ifstream m(machine_id_path);
  const int err = errno;
  const bool opened = m.is_open();
  std::string id;
  if (opened) std::getline(m, id);
  if (id.empty()) {
    return {{"host_id", "unknown"},
            {"host_id_reason", machine_id_path +
                                   (opened ? std::string(" is empty")
                                           : ": " + std::string(err != 0 ? std::strerror(err) : "cannot be opened")) +
                                   ", and no host id is configured (snapshots.host_id, FERRY_HOST_ID)"}};
  }
  // The machine id itself stays private (machine-id(5)): records carry a hash of it, as stable.
  return {{"host_id", signing::Sha256Hex("ferry host id\n" + id).substr(0, 32)},
          {"host_id_source", "SHA-256 of " + machine_id_path}};
}

std::string ToJson(const Block& block) {
  std::string out = "{";
  for (size_t i = 0; i < block.size(); ++i) {
    out += (i ? ", " : "") + json::String(block[i].first) + ": " + json::String(block[i].second);
  }
  return out + "}";
}

std::string HostIdFromEnv() {
  const char* v = std::getenv("FERRY_HOST_ID");
  return v == nullptr ? "" : v;
}

}  // namespace ferry::environment
