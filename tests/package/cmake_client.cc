// Copies random data to ferryd's device memory and back through the installed libferry, with the
// destination poisoned each time, twice (a second pattern: bytes left from the first cannot pass),
// checking every byte. Built by tests/package/CMakeLists.txt against the installed package.
// usage: cmake_client BYTES
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>

#include <ferry/client.hpp>
#include <ferry/version.hpp>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: cmake_client BYTES\n");
    return 2;
  }
  const size_t n = std::strtoull(argv[1], nullptr, 10);
  auto fail = [](const char* what, const ferry::Status& s) {
    std::fprintf(stderr, "cmake_client: %s: %s\n", what, s.ToString().c_str());
    return 1;
  };
  auto client = ferry::Client::Connect({.name = "package-cmake-client"});
  if (!client.ok()) return fail("connect", client.status());
  auto src = (*client)->AllocateHost(n);
  if (!src.ok()) return fail("allocate host", src.status());
  auto back = (*client)->AllocateHost(n);
  if (!back.ok()) return fail("allocate host", back.status());
  auto dev = (*client)->AllocateDevice(n);
  if (!dev.ok()) return fail("allocate device", dev.status());
  auto region = (*client)->RegisterDevice(dev->data(), n);
  if (!region.ok()) return fail("register device", region.status());
  std::mt19937_64 rng(std::random_device{}());
  for (int round = 0; round < 2; ++round) {
    for (size_t i = 0; i < n; ++i) src->data()[i] = static_cast<std::byte>(rng());
    std::memset(back->data(), 0xA5 ^ round, n);
    // On the host backend device memory is host memory: poisoned too.
    if ((*client)->backend() == ferry::BackendKind::kHost) std::memset(dev->data(), 0x5A ^ round, n);
    for (auto [dir, host] : {std::pair{ferry::Direction::kHostToDevice, &*src}, {ferry::Direction::kDeviceToHost, &*back}}) {
      auto t = (*client)->Copy(dir, *host, 0, *region, 0, n);
      if (!t.ok()) return fail("copy", t.status());
      if (ferry::Status s = t->Wait(std::chrono::seconds(30)); !s.ok()) return fail("wait", s);
    }
    for (size_t i = 0; i < n; ++i) {
      if (back->data()[i] != src->data()[i]) {
        std::fprintf(stderr, "cmake_client: round %d: byte %zu came back 0x%02x, sent 0x%02x\n", round, i,
                     static_cast<unsigned>(back->data()[i]), static_cast<unsigned>(src->data()[i]));
        return 1;
      }
    }
  }
  std::printf("cmake_client: %zu bytes both ways twice, every byte checked, libferry %s\n", n, ferry::kVersionString);
  return 0;
}
