#include "bench/block_lists.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>

#include "bench/bench_util.hpp"
#include "bench/list_clients.hpp"
#include "common/byte_size.hpp"

namespace ferry::bench {

const char* DirectionName(Direction direction) { return direction == Direction::kHostToDevice ? "h2d" : "d2h"; }

std::string BlockWorkload::name() const {
  return std::to_string(count) + " x " + FormatByteSize(block_bytes) + (shuffled ? "" : " in order");
}

std::string BlockWorkload::key() const {
  std::string size = FormatByteSize(block_bytes);
  size.erase(std::remove(size.begin(), size.end(), ' '), size.end());
  return "blocks-" + std::to_string(count) + "x" + size + (shuffled ? "" : "-in-order");
}

std::vector<BlockWorkload> ShuffledBlockWorkloads() {
  return {{4096, 16 << 10, true}, {2048, 64 << 10, true}, {512, 256 << 10, true}};
}

BlockIndices MakeBlockIndices(size_t count, bool shuffled, uint64_t seed) {
  BlockIndices b;
  b.src.resize(count);
  std::iota(b.src.begin(), b.src.end(), 0u);
  b.dst = b.src;
  if (shuffled) {
    std::mt19937_64 rng(seed);
    std::shuffle(b.src.begin(), b.src.end(), rng);
    std::shuffle(b.dst.begin(), b.dst.end(), rng);
  }
  return b;
}

std::optional<size_t> FirstWrongBlock(const BlockIndices& indices, size_t block_bytes, const std::byte* src,
                                      const std::byte* dst) {
  for (size_t i = 0; i < indices.src.size(); ++i) {
    if (std::memcmp(dst + indices.dst[i] * block_bytes, src + indices.src[i] * block_bytes, block_bytes) != 0) {
      return i;
    }
  }
  return std::nullopt;
}

Result<ListRegions> AllocateListRegions(Client& client, const std::vector<BlockWorkload>& workloads) {
  size_t bytes = 0;
  for (const BlockWorkload& w : workloads) bytes = std::max(bytes, w.region_bytes());
  auto host = client.AllocateHost(bytes);
  if (!host.ok()) return Status(host.status().code(), "AllocateHost: " + host.status().message());
  auto device = client.AllocateDevice(bytes);
  if (!device.ok()) return Status(device.status().code(), "AllocateDevice: " + device.status().message());
  auto region = client.RegisterDevice(device->data(), bytes);
  if (!region.ok()) return Status(region.status().code(), "RegisterDevice: " + region.status().message());
  return ListRegions{std::move(*host), std::move(*device), std::move(*region)};
}

int RunBlocksOnHostBackend(const ConnectOptions& options, const HostBlocksOptions& run) {
  using namespace std::chrono_literals;
  auto fail = [](const char* what, const Status& s) {
    std::fprintf(stderr, "ferry-bench: %s: %s\n", what, s.ToString().c_str());
    return 1;
  };
  ConnectOptions co = options;
  co.name = "ferry-bench";
  auto client = Client::Connect(co);
  if (!client.ok()) return fail("connect", client.status());
  if ((*client)->backend() != BackendKind::kHost) {
    std::fprintf(stderr,
                 "ferry-bench: ferryd runs the cuda backend: the blocks section compares ferry with in-process "
                 "CUDA copies; run a ferry-bench built with CUDA on the GPU\n");
    return 2;
  }
  std::vector<BlockWorkload> workloads = ShuffledBlockWorkloads();
  workloads.push_back({1024, 64 << 10, false});
  std::erase_if(workloads, [&](const BlockWorkload& w) { return 2 * w.region_bytes() > run.max_bytes; });
  if (workloads.empty()) return fail("--max-size", InvalidArgument("no list's two regions fit in it"));
  auto regions = AllocateListRegions(**client, workloads);
  if (!regions.ok())
    return fail(
        "the lists' memory (the host run needs a pool buffer as large as its largest list's region, 128 MiB for every "
        "list)",
        regions.status());
  HostBuffer* const host = &regions->host;
  DeviceAllocation* const device = &regions->device;
  DeviceRegion* const registered = &regions->region;
  const size_t region = device->size();

  std::printf(
      "\nblock lists through ferryd's host backend (no GPU: ferry's CopyBlocks alone, without the in-process\n"
      "columns and targets, which need a GPU; GB/s of the host backend's memcpy, not of a bus; median [min, max])\n");
  const int reps = run.quick ? 3 : 10;
  bool all_ok = true;
  std::vector<std::byte> reference(region);
  for (size_t wi = 0; wi < workloads.size(); ++wi) {
    const BlockWorkload& w = workloads[wi];
    const size_t n = w.region_bytes();
    const BlockIndices indices = MakeBlockIndices(w.count, w.shuffled, 0xb10c0000 + wi);
    for (Direction dir : {Direction::kHostToDevice, Direction::kDeviceToHost}) {
      const bool h2d = dir == Direction::kHostToDevice;
      std::byte* src = h2d ? host->data() : static_cast<std::byte*>(device->data());
      std::byte* dst = h2d ? static_cast<std::byte*>(device->data()) : host->data();
      FillRandom(src, n, 0xb10c1000 + 2 * wi + (h2d ? 0 : 1));
      std::memcpy(reference.data(), src, n);
      std::memset(dst, 0xA5, n);
      std::vector<double> gbps;
      for (int rep = -1; rep < reps; ++rep) {
        const double t0 = NowSeconds();
        auto t = (*client)->CopyBlocks(dir, *host, 0, *registered, 0, indices.list(w.block_bytes));
        if (!t.ok()) return fail("CopyBlocks", t.status());
        if (Status s = t->Wait(30s); !s.ok()) return fail("CopyBlocks' wait", s);
        if (rep >= 0) gbps.push_back(static_cast<double>(n) / (NowSeconds() - t0) / 1e9);
      }
      const std::optional<size_t> wrong = FirstWrongBlock(indices, w.block_bytes, reference.data(), dst);
      all_ok = all_ok && !wrong && std::memcmp(src, reference.data(), n) == 0;
      const Summary s = Summarize(gbps);
      const std::string check =
          wrong ? "FAIL: block " + std::to_string(*wrong) + " of the list arrived wrong" : "every byte checked";
      std::printf("  %-22s %s  ferry %7.2f [%6.2f, %6.2f]  %s\n", w.name().c_str(), DirectionName(dir), s.median, s.min,
                  s.max, check.c_str());
    }
  }
  std::printf("%s\n", all_ok ? "every list arrived intact" : "FAIL: a list did not arrive intact");
  if (!all_ok || run.clients < 2) return all_ok ? 0 : 1;
  std::fflush(stdout);
  auto rows = RunListClients(options, run.clients, reps, run.max_bytes, nullptr);
  if (!rows.ok()) return fail(("--clients " + std::to_string(run.clients)).c_str(), rows.status());
  PrintListClients(*rows, run.clients, reps);
  return 0;
}

}  // namespace ferry::bench
