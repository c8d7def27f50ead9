#include "bench/transfer_sweep.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "bench/bench_util.hpp"
#include "common/byte_size.hpp"
#include "common/status_macros.hpp"
#include "ferry/client.hpp"

namespace ferry::bench {

// Copies through ferryd under the running policy: every size both ways, every byte of one
// round trip per size checked (random data, poisoned destination).
Result<std::vector<Bandwidth>> TransferSweep(const std::string& socket, size_t max_size, int reps, bool largest_only) {
  ConnectOptions co;
  co.socket_path = socket;
  co.name = "ferry-tune";
  FERRY_ASSIGN_OR_RETURN(auto client, Client::Connect(co));
  FERRY_ASSIGN_OR_RETURN(HostBuffer host, client->AllocateHost(2 * max_size));
  FERRY_ASSIGN_OR_RETURN(DeviceAllocation dev, client->AllocateDevice(max_size));
  FERRY_ASSIGN_OR_RETURN(DeviceRegion region, client->RegisterDevice(dev.data(), max_size));
  std::vector<Bandwidth> out;
  std::vector<size_t> sizes;
  for (size_t s = 64 << 10; s <= max_size && !largest_only; s *= 16) sizes.push_back(s);
  if (sizes.empty() || sizes.back() != max_size) sizes.push_back(max_size);
  for (size_t bytes : sizes) {
    // Round trip first, checked: host[0, n) -> device -> host[max, max + n).
    FillRandom(host.data(), bytes, static_cast<uint64_t>(bytes) * 2654435761u + static_cast<uint64_t>(::getpid()));
    std::memset(host.data() + max_size, 0xA5, bytes);
    FERRY_ASSIGN_OR_RETURN(Transfer up, client->Copy(Direction::kHostToDevice, host, 0, region, 0, bytes));
    FERRY_RETURN_IF_ERROR(up.Wait(std::chrono::seconds(10)));
    FERRY_ASSIGN_OR_RETURN(Transfer down, client->Copy(Direction::kDeviceToHost, host, max_size, region, 0, bytes));
    FERRY_RETURN_IF_ERROR(down.Wait(std::chrono::seconds(10)));
    if (std::memcmp(host.data(), host.data() + max_size, bytes) != 0) {
      return Internal("transfer sweep: a " + FormatByteSize(bytes) + " round trip through ferryd came back different");
    }
    // Small sizes in batches (many in flight, as servers send them), large ones one at a time.
    // Copies in one batch go to disjoint device ranges (concurrent writes to one range race).
    const size_t batch = std::max<size_t>(1, std::min<size_t>({64, (16u << 20) / bytes, max_size / bytes}));
    for (const Direction d : {Direction::kHostToDevice, Direction::kDeviceToHost}) {
      std::vector<double> gbps;
      for (int r = 0; r < reps + 1; ++r) {
        std::vector<Transfer> ts;
        const double t0 = NowSeconds();
        for (size_t i = 0; i < batch; ++i) {
          const size_t off = i * bytes, len = bytes;
          FERRY_ASSIGN_OR_RETURN(Transfer t, client->Copy(d, host, d == Direction::kHostToDevice ? off : max_size + off,
                                                          region, off, len));
          ts.push_back(std::move(t));
        }
        for (Transfer& t : ts) FERRY_RETURN_IF_ERROR(t.Wait(std::chrono::seconds(10)));
        const double s = NowSeconds() - t0;
        if (r > 0) gbps.push_back(static_cast<double>(batch * bytes) / s / 1e9);  // r = 0: warm-up
      }
      out.push_back({bytes, d == Direction::kHostToDevice ? "h2d" : "d2h", Summarize(gbps).median});
    }
  }
  return out;
}

}  // namespace ferry::bench
