// The environment a record names: one block, built one way, for ferryd's snapshots and for the
// overlap and tune reports, so that they name what they ran on alike:
//   chip, gpu_uuid      the GPU's name and UUID
//   driver              the NVIDIA driver's release ("580.159.04", from the kernel module)
//   driver_cuda         the CUDA version the driver supports ("13.0")
//   cuda_runtime        the CUDA runtime's version ("13.0")
//   cublas              cuBLAS's version ("13.1.0")
//   host_id             a configured name, or a hash of /etc/machine-id (never the id itself)
// A value that is not known is "unknown" (or "none": there is no GPU) and KEY_reason says why.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace ferry::environment {

using Block = std::vector<std::pair<std::string, std::string>>;

struct Facts {
  std::string chip, gpu_uuid;             // empty: not known
  int cuda_driver = 0, cuda_runtime = 0;  // as CUDA reports them (13000); 0: not known
  std::string cublas;                     // "13.1.0"; empty: not known
  // Set when the run has no GPU (the host backend or engine): why, as the reason of each GPU
  // value, which are then "none".
  std::string no_gpu;
  std::string host_id;  // configured; empty: from the machine id
  std::string nvidia_version_path = "/proc/driver/nvidia/version";
  std::string machine_id_path = "/etc/machine-id";
};

// 13000 -> "13.0", 12080 -> "12.8"
std::string CudaVersionText(int version);
// The environment's block, in the order above, with a KEY_reason after each value not known
// and host_id_source after host_id.
Block Build(const Facts& facts);
// host_id and, after it, host_id_source (or host_id_reason when it is "unknown"): `configured`
// if set, else a hash of the machine id at `machine_id_path`.
Block HostId(const std::string& configured, const std::string& machine_id_path = "/etc/machine-id");
// {"KEY": "VALUE", ...} on one line.
std::string ToJson(const Block& block);
// FERRY_HOST_ID, the host id a benchmark's report names when set; empty otherwise.
std::string HostIdFromEnv();

}  // namespace ferry::environment
