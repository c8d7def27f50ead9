// A live in-process ferryd and one well-behaved client of it, for the fuzz targets that attack
// ferryd as a client would: CheckStillServing traps unless a 4 KiB copy of random bytes still
// arrives whole.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>

#include "ferry/client.hpp"
#include "test_util.hpp"

namespace ferry::fuzz {

struct World {
  std::unique_ptr<ferry::testing::DaemonHarness> d = std::make_unique<ferry::testing::DaemonHarness>();
  std::unique_ptr<Client> good;
  std::optional<HostBuffer> host;
  std::optional<DeviceAllocation> dev;
  std::optional<DeviceRegion> region;
  uint64_t inputs = 0;
  World() {
    good = std::move(*d->Connect("good"));
    host.emplace(std::move(*good->AllocateHost(1 << 16)));
    dev.emplace(std::move(*good->AllocateDevice(1 << 16)));
    region.emplace(std::move(*good->RegisterDevice(dev->data(), dev->size())));
  }
  void CheckStillServing() {
    ferry::testing::FillRandom(host->data(), 4096, inputs);
    auto t = good->Copy(Direction::kHostToDevice, *host, 0, *region, 0, 4096);
    if (!t.ok() || !t->Wait(std::chrono::seconds(5)).ok() || std::memcmp(dev->data(), host->data(), 4096) != 0) {
      __builtin_trap();
    }
  }
};

}  // namespace ferry::fuzz
