// ferry-demo: connects to ferryd, moves random data both ways through it, checks every byte,
// and prints what it measured. The first thing to run on a new node.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/cli.hpp"
#include "ferry/client.hpp"

namespace {

constexpr const char* kUsage = R"(usage: ferry-demo [options]

Connects to ferryd, copies random data host->device and back through it, checks every byte
(the destination is poisoned first), and prints bandwidth and small-copy latency.

options:
  --socket PATH   ferryd's control socket (default: $FERRY_SOCKET or /run/ferry/ferryd.sock)
  --size BYTES    bytes per large copy (default 67108864 = 64 MiB; 64MiB works too)
  --reps N        timed repetitions (default 10)
  --json          print one JSON object instead of the table
  -h, --help      this help
)";

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

int Fail(const char* what, const ferry::Status& s) {
  std::fprintf(stderr, "ferry-demo: %s: %s\n", what, s.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  ferry::ConnectOptions opts;
  opts.name = "ferry-demo";
  size_t size = 64ull << 20;
  int reps = 10;
  bool json = false;
  ferry::cli::Args a(argc, argv);
  while (a.Next()) {
    if (a.IsHelp()) {
      return ferry::cli::Help(kUsage);
    } else if (a.Is("--socket") && a.HasValue()) {
      opts.socket_path = a.Value();
    } else if (a.Is("--size") && a.HasValue()) {
      if (!a.ByteSizeValue(4096, 1ull << 40, size)) {
        std::fprintf(stderr, "ferry-demo: --size takes a byte count from 4096 (4 KiB) to 1 TiB, e.g. 64MiB\n");
        return 2;
      }
    } else if (a.Is("--reps") && a.HasValue()) {
      if (!a.IntValue(1, 1000000, reps)) {
        std::fprintf(stderr, "ferry-demo: --reps takes a count from 1\n");
        return 2;
      }
    } else if (a.Is("--json")) {
      json = true;
    } else {
      std::fprintf(stderr, "ferry-demo: unknown option '%s' (try --help)\n", a.current().c_str());
      return 2;
    }
  }
  auto client = ferry::Client::Connect(opts);
  if (!client.ok()) return Fail("connect", client.status());
  const bool gpu = (*client)->backend() == ferry::BackendKind::kCuda;
  if (!json) {
    std::printf("ferry-demo: connected to ferryd, session %llu, backend %s\n",
                static_cast<unsigned long long>((*client)->session_id()),
                gpu ? "cuda (real GPU)" : "host (NO GPU: device memory simulated in host RAM; figures are memcpy, not PCIe)");
  }
  auto src = (*client)->AllocateHost(size);
  if (!src.ok()) return Fail("allocate host buffer", src.status());
  auto back = (*client)->AllocateHost(size);
  if (!back.ok()) return Fail("allocate host buffer", back.status());
  auto dev = (*client)->AllocateDevice(size);
  if (!dev.ok()) return Fail("allocate device memory", dev.status());
  auto region = (*client)->RegisterDevice(dev->data(), size);
  if (!region.ok()) return Fail("register device memory", region.status());

  std::mt19937_64 rng(std::random_device{}());
  auto* words = reinterpret_cast<uint64_t*>(src->data());
  for (size_t i = 0; i < size / 8; ++i) words[i] = rng();
  for (size_t i = size / 8 * 8; i < size; ++i) src->data()[i] = static_cast<std::byte>(rng());

  auto copy = [&](ferry::Direction d, ferry::HostBuffer& h, size_t n, ferry::Priority p) -> ferry::Result<double> {
    auto t0 = std::chrono::steady_clock::now();
    auto t = (*client)->Copy(d, h, 0, *region, 0, n, {.priority = p});
    if (!t.ok()) return t.status();
    if (ferry::Status done = t->Wait(std::chrono::seconds(30)); !done.ok()) return done;
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };

  // Correctness first: round trip with a poisoned destination, every byte checked.
  std::memset(back->data(), 0xA5, size);
  if (auto r = copy(ferry::Direction::kHostToDevice, *src, size, ferry::Priority::kBulk); !r.ok()) return Fail("copy", r.status());
  if (auto r = copy(ferry::Direction::kDeviceToHost, *back, size, ferry::Priority::kBulk); !r.ok()) return Fail("copy", r.status());
  if (std::memcmp(src->data(), back->data(), size) != 0) {
    std::fprintf(stderr, "ferry-demo: FAILED: data came back different\n");
    return 1;
  }

  std::vector<double> h2d, d2h, lat;
  for (int i = 0; i < reps + 1; ++i) {
    auto a = copy(ferry::Direction::kHostToDevice, *src, size, ferry::Priority::kBulk);
    auto b = copy(ferry::Direction::kDeviceToHost, *back, size, ferry::Priority::kBulk);
    if (!a.ok()) return Fail("copy", a.status());
    if (!b.ok()) return Fail("copy", b.status());
    if (i > 0) {  // the first is warm-up
      h2d.push_back(size / *a / 1e9);
      d2h.push_back(size / *b / 1e9);
    }
  }
  for (int i = 0; i < 200 * reps; ++i) {
    auto a = copy(ferry::Direction::kHostToDevice, *src, 4096, ferry::Priority::kLatency);
    if (!a.ok()) return Fail("copy", a.status());
    if (i >= 20) lat.push_back(*a * 1e6);
  }
  std::memset(back->data(), 0x5A, size);
  if (auto r = copy(ferry::Direction::kDeviceToHost, *back, size, ferry::Priority::kBulk); !r.ok()) return Fail("copy", r.status());
  const bool ok = std::memcmp(src->data(), back->data(), size) == 0;
  std::sort(lat.begin(), lat.end());
  const double p99 = lat[lat.size() * 99 / 100];
  if (json) {
    std::printf("{\"backend\":\"%s\",\"bytes\":%zu,\"reps\":%d,\"h2d_gbps_median\":%.3f,\"d2h_gbps_median\":%.3f,"
                "\"lat4k_us_p50\":%.2f,\"lat4k_us_p99\":%.2f,\"verified\":%s}\n",
                gpu ? "cuda" : "host", size, reps, Median(h2d), Median(d2h), Median(lat), p99, ok ? "true" : "false");
  } else {
    auto [h2dmin, h2dmax] = std::minmax_element(h2d.begin(), h2d.end());
    auto [d2hmin, d2hmax] = std::minmax_element(d2h.begin(), d2h.end());
    std::printf("%-28s %10s %10s %10s\n", "measured through ferryd", "median", "min", "max");
    std::printf("%-28s %10.2f %10.2f %10.2f GB/s\n", ("host->device " + std::to_string(size >> 20) + " MiB").c_str(),
                Median(h2d), *h2dmin, *h2dmax);
    std::printf("%-28s %10.2f %10.2f %10.2f GB/s\n", ("device->host " + std::to_string(size >> 20) + " MiB").c_str(),
                Median(d2h), *d2hmin, *d2hmax);
    std::printf("%-28s %10.2f %10.2f %10.2f us (p99 %.2f us)\n", "4 KiB round trip", Median(lat), lat.front(), lat.back(), p99);
    std::printf("data check: %s (%zu random bytes, poisoned destination, every byte compared)\n",
                ok ? "PASSED" : "FAILED", size);
  }
  return ok ? 0 : 1;
}
