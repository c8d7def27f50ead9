// Submission ring entries from arbitrary bytes, into a live in-process ferryd: every input is a
// run of 56-byte entries a hostile client writes into its ring (and sometimes a wild tail index).
// The daemon must reject or evict, never crash, and keep serving a well-behaved client.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>

#include "common/channel.hpp"
#include "common/fd.hpp"
#include "common/wire.hpp"
#include "daemon/server.hpp"
#include "ferry/client.hpp"
#include "fuzz_world.hpp"
#include "test_util.hpp"

namespace {

using namespace ferry;

struct Raw {
  UniqueFd sock, submit;
  Mapping ring;
  wire::HelloReply reply{};
  bool Open(const std::string& path) {
    auto s = ConnectUnix(path);
    if (!s.ok()) return false;
    sock = std::move(*s);
    wire::HelloRequest h{};
    h.client_version = wire::kVersion;
    if (!Send(sock.get(), wire::MsgType::kHello, 1, h).ok()) return false;
    auto m = RecvMessage(sock.get(), 2000);
    if (!m.ok() || m->fds.size() != 3) return false;
    reply = m->As<wire::HelloReply>();
    auto r = MapShared(m->fds[0].get(), reply.ring_bytes);
    if (!r.ok()) return false;
    ring = std::move(*r);
    submit = std::move(m->fds[1]);
    return true;
  }
  wire::RingHeader* hdr() { return reinterpret_cast<wire::RingHeader*>(ring.data()); }
};

using fuzz::World;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static World world;  // one daemon for the whole run, as in production
  World* w = &world;
  Raw raw;
  if (!raw.Open(w->d->socket_path())) return 0;
  auto* sq = wire::SubmissionEntries(raw.ring.data());
  const uint32_t n = raw.reply.sq_entries;
  size_t off = 0;
  if (size > 0 && data[0] == 0xFF && size >= 5) {  // a wild tail
    uint32_t tail;
    std::memcpy(&tail, data + 1, 4);
    raw.hdr()->sq_tail.value.store(tail);
    RingDoorbell(raw.submit.get());
    off = 5;
  }
  uint32_t tail = raw.hdr()->sq_tail.value.load();
  for (; off + sizeof(wire::SubmissionEntry) <= size; off += sizeof(wire::SubmissionEntry)) {
    if (tail - raw.hdr()->sq_head.value.load() >= n) break;
    std::memcpy(&sq[tail & (n - 1)], data + off, sizeof(wire::SubmissionEntry));
    raw.hdr()->sq_tail.value.store(++tail);
  }
  RingDoorbell(raw.submit.get());
  if (++w->inputs % 16 == 0) w->CheckStillServing();
  return 0;
}
