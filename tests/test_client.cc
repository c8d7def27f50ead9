// A client process for ferry's real-process tests.
//   ferry_test_client roundtrip SOCKET BYTES REPS   copies random data both ways, checks every byte
//   ferry_test_client hold SOCKET BYTES             takes buffers, keeps copies going, prints "ready",
//                                                   and runs until killed
//   ferry_test_client mixed SOCKET BYTES REPS       like roundtrip, with random sizes up to BYTES and
//                                                   latency-class copies mixed in
// Exit status: 0 all bytes correct, 1 a byte differed, 2 a ferry call failed, 64 usage.
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <string_view>

#include "ferry/client.hpp"

using namespace std::chrono_literals;

namespace {

int Fail(const char* what, const ferry::Status& s) {
  std::fprintf(stderr, "ferry_test_client: %s: %s\n", what, s.ToString().c_str());
  return 2;
}

void Fill(std::byte* p, size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<std::byte>(rng());
}

int Run(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (argc < 4 || (mode != "roundtrip" && mode != "hold" && mode != "mixed") || (mode != "hold" && argc < 5)) {
    std::fprintf(stderr, "usage: %s roundtrip|mixed SOCKET BYTES REPS [--device N] | hold SOCKET BYTES [--device N]\n",
                 argv[0]);
    return 64;
  }
  const bool hold = mode == "hold";
  const bool mixed = mode == "mixed";
  const size_t n = std::stoull(argv[3]);
  const int reps = hold ? 1 : std::stoi(argv[4]);
  int device = -1;  // --device N: the GPU (on the host backend, the simulated GPU) to copy to
  for (int i = hold ? 4 : 5; i + 1 < argc; ++i) {
    if (std::string_view(argv[i]) == "--device") device = std::stoi(argv[i + 1]);
  }
  auto client = ferry::Client::Connect({.socket_path = argv[2], .name = mode, .device = device});
  if (!client.ok()) return Fail("connect", client.status());
  auto& c = **client;
  auto src = c.AllocateHost(n);
  auto dst = c.AllocateHost(n);
  auto dev = c.AllocateDevice(n);
  if (!src.ok()) return Fail("allocate host", src.status());
  if (!dst.ok()) return Fail("allocate host", dst.status());
  if (!dev.ok()) return Fail("allocate device", dev.status());
  auto region = c.RegisterDevice(dev->data(), dev->size());
  if (!region.ok()) return Fail("register", region.status());
  const uint64_t seed = std::random_device{}() ^ static_cast<uint64_t>(::getpid());
  std::mt19937_64 sizes(seed);
  for (int rep = 0; hold || rep < reps; ++rep) {
    const size_t len = mixed ? 1 + sizes() % n : n;
    const ferry::CopyOptions opts{.priority = mixed && rep % 3 == 0 ? ferry::Priority::kLatency : ferry::Priority::kBulk};
    Fill(src->data(), len, seed + rep);
    std::memset(dst->data(), 0xA5, len);
    auto up = c.Copy(ferry::Direction::kHostToDevice, *src, 0, *region, 0, len, opts);
    if (!up.ok()) return Fail("copy h2d", up.status());
    if (auto s = up->Wait(10s); !s.ok()) return Fail("wait h2d", s);
    auto down = c.Copy(ferry::Direction::kDeviceToHost, *dst, 0, *region, 0, len, opts);
    if (!down.ok()) return Fail("copy d2h", down.status());
    if (auto s = down->Wait(10s); !s.ok()) return Fail("wait d2h", s);
    if (std::memcmp(src->data(), dst->data(), len) != 0) {
      std::fprintf(stderr, "ferry_test_client: bytes differ in rep %d\n", rep);
      return 1;
    }
    if (hold && rep == 0) {
      std::printf("ready\n");
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return Run(argc, argv); }
