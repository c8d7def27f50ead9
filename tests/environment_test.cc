// The environment block every record names (common/environment): the NVIDIA driver's release
// from the kernel module's version file, CUDA versions as "13.0", a host id that is a stable
// hash of the machine id (never the id itself) or a configured name, and a reason beside every
// value that is not known.
#include "common/environment.hpp"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <map>

namespace ferry {
namespace {

using environment::Block;

std::map<std::string, std::string> AsMap(const Block& b) { return {b.begin(), b.end()}; }

class EnvironmentBlock : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string t = (std::filesystem::temp_directory_path() / "ferry-env-XXXXXX").string();
    ASSERT_NE(::mkdtemp(t.data()), nullptr);
    dir_ = t;
    f_.nvidia_version_path = dir_ + "/version";
    f_.machine_id_path = dir_ + "/machine-id";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void Write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }
  std::string dir_;
  environment::Facts f_;
};

TEST_F(EnvironmentBlock, AGpuRunNamesDriverCudaCublasGpuAndHost) {
  Write(f_.nvidia_version_path,
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (dvs-builder@U22)  Thu\n"
        "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n");
  Write(f_.machine_id_path, "0123456789abcdef0123456789abcdef\n");
  f_.chip = "NVIDIA H200";
  f_.gpu_uuid = "GPU-322a5733-de08-66e5-eec8-d9ca754716fb";
  f_.cuda_driver = 13000;
  f_.cuda_runtime = 12080;
  f_.cublas = "13.1.0";
  const Block b = environment::Build(f_);
  std::vector<std::string> keys;
  for (const auto& [k, v] : b) keys.push_back(k);
  EXPECT_EQ(keys, (std::vector<std::string>{"chip", "gpu_uuid", "driver", "driver_cuda", "cuda_runtime", "cublas",
                                            "host_id", "host_id_source"}));
  auto m = AsMap(b);
  EXPECT_EQ(m["chip"], "NVIDIA H200");
  EXPECT_EQ(m["gpu_uuid"], "GPU-322a5733-de08-66e5-eec8-d9ca754716fb");
  EXPECT_EQ(m["driver"], "580.159.04");
  EXPECT_EQ(m["driver_cuda"], "13.0");
  EXPECT_EQ(m["cuda_runtime"], "12.8");
  EXPECT_EQ(m["cublas"], "13.1.0");
  EXPECT_EQ(m["host_id"].size(), 32u);
  EXPECT_EQ(m["host_id"].find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_EQ(m["host_id"].find("0123456789abcdef"), std::string::npos) << "the machine id itself must not be in records";
  EXPECT_EQ(m["host_id_source"], "SHA-256 of " + f_.machine_id_path);
  EXPECT_EQ(AsMap(environment::Build(f_))["host_id"], m["host_id"]) << "the same host, the same id";
  Write(f_.machine_id_path, "fedcba9876543210fedcba9876543210\n");
  EXPECT_NE(AsMap(environment::Build(f_))["host_id"], m["host_id"]) << "another machine, another id";
}

TEST_F(EnvironmentBlock, TheProprietaryModulesVersionLineToo) {
  Write(f_.nvidia_version_path,
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n");
  EXPECT_EQ(AsMap(environment::Build(f_))["driver"], "550.54.15");
}

TEST_F(EnvironmentBlock, EveryValueNotKnownSaysWhy) {
  f_.chip = "NVIDIA H200";
  const auto m = AsMap(environment::Build(f_));  // no version file, no machine id, no versions
  for (const char* k : {"gpu_uuid", "driver", "driver_cuda", "cuda_runtime", "cublas", "host_id"}) {
    EXPECT_EQ(m.at(k), "unknown") << k;
    ASSERT_TRUE(m.count(std::string(k) + "_reason")) << k;
    EXPECT_FALSE(m.at(std::string(k) + "_reason").empty()) << k;
  }
  EXPECT_NE(m.at("driver_reason").find("no NVIDIA kernel module"), std::string::npos) << m.at("driver_reason");
  EXPECT_NE(m.at("host_id_reason").find(f_.machine_id_path + ": No such file or directory"), std::string::npos)
      << m.at("host_id_reason");
  EXPECT_EQ(m.count("chip_reason"), 0u);
  // An empty machine id (as in many containers) is said to be empty, not some stale errno.
  Write(f_.machine_id_path, "");
  EXPECT_NE(AsMap(environment::Build(f_)).at("host_id_reason").find(f_.machine_id_path + " is empty"),
            std::string::npos);
  Write(f_.nvidia_version_path, "something else\n");
  EXPECT_NE(AsMap(environment::Build(f_)).at("driver_reason").find("names no driver release"), std::string::npos);
}

TEST_F(EnvironmentBlock, NoGpuIsNoneWithTheReasonAndAConfiguredHostIdIsUsedAsIs) {
  Write(f_.nvidia_version_path, "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build\n");
  f_.no_gpu = "the host backend: copies in host memory, no GPU";
  f_.host_id = "node-17";
  const auto m = AsMap(environment::Build(f_));
  for (const char* k : {"chip", "gpu_uuid", "driver", "driver_cuda", "cuda_runtime", "cublas"}) {
    EXPECT_EQ(m.at(k), "none") << k;
    EXPECT_EQ(m.at(std::string(k) + "_reason"), f_.no_gpu) << k;
  }
  EXPECT_EQ(m.at("host_id"), "node-17");
  EXPECT_EQ(m.at("host_id_source"), "configured");
}

TEST(Environment, CudaVersionsAsTheToolkitNamesThem) {
  EXPECT_EQ(environment::CudaVersionText(13000), "13.0");
  EXPECT_EQ(environment::CudaVersionText(12080), "12.8");
  EXPECT_EQ(environment::CudaVersionText(11020), "11.2");
}

TEST(Environment, JsonIsOneObjectWithEveryPairInOrder) {
  EXPECT_EQ(environment::ToJson({{"chip", "NVIDIA \"H200\""}, {"driver", "580.159.04"}}),
            "{\"chip\": \"NVIDIA \\\"H200\\\"\", \"driver\": \"580.159.04\"}");
  EXPECT_EQ(environment::ToJson({}), "{}");
}

}  // namespace
}  // namespace ferry
