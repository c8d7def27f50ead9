// Control-plane conversations from arbitrary bytes, into a live in-process ferryd: each input is
// a run of messages (type, claimed length, payload) a hostile client sends after its hello, with
// headers right or wrong. ferryd must answer, refuse or evict, never crash or stall, and keep
// serving a well-behaved client (checked every 16 inputs, every byte).
#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <memory>
#include <optional>
#include <vector>

#include "common/channel.hpp"
#include "common/fd.hpp"
#include "common/wire.hpp"
#include "ferry/client.hpp"
#include "fuzz_world.hpp"
#include "test_util.hpp"

namespace {

using namespace ferry;

using fuzz::World;

// Reads whatever ferryd answered so far; the fds it sent are closed with the messages.
void Drain(int fd) {
  for (int i = 0; i < 64; ++i) {
    auto m = RecvMessage(fd, 0);
    if (!m.ok()) return;
  }
}

// Waits until ferryd has handled everything sent before: it answers a stats request last (or
// has closed the connection). Without this, closing first would let ferryd drop the unread rest.
void Settle(int fd, uint32_t seq) {
  wire::StatsRequest r{};
  if (!Send(fd, wire::MsgType::kStats, seq, r).ok()) return;
  for (int i = 0; i < 256; ++i) {
    auto m = RecvMessage(fd, 5000);
    if (!m.ok() || m->header.seq == seq) return;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static World world;  // one daemon for the whole run, as in production
  World* w = &world;
  auto sock = ConnectUnix(w->d->socket_path());
  if (!sock.ok()) __builtin_trap();  // ferryd stopped accepting
  const int fd = sock->get();
  // The first byte says whether to say hello properly first (most inputs) or start with garbage.
  if (size == 0 || data[0] % 8 != 0) {
    wire::HelloRequest h{};
    h.client_version = wire::kVersion;
    std::memcpy(h.name, "fuzz", 4);
    if (!Send(fd, wire::MsgType::kHello, 1, h).ok()) return 0;
    (void)RecvMessage(fd, 5000);
  }
  size_t off = size == 0 ? 0 : 1;
  std::vector<uint8_t> msg;
  for (uint32_t seq = 2; off + 5 <= size && seq < 64; ++seq) {
    // type (2 bytes), a mode byte, then the payload length (2 bytes) and the payload.
    uint16_t type, len;
    std::memcpy(&type, data + off, 2);
    const uint8_t mode = data[off + 2];
    std::memcpy(&len, data + off + 3, 2);
    off += 5;
    len = static_cast<uint16_t>(std::min<size_t>(len % 512, size - off));
    // Mostly requests ferryd knows, with the right header; now and then anything at all.
    static constexpr uint16_t kKnown[] = {3, 5, 7, 9, 11, 15, 17, 19, 20, 1};
    if ((mode & 0x80) == 0) type = kKnown[type % std::size(kKnown)];
    wire::MsgHeader h{};
    h.magic = mode == 0xFF ? 0xdeadbeef : wire::kMagic;
    h.version = mode == 0xFE ? static_cast<uint16_t>(len) : wire::kVersion;
    h.type = type;
    const size_t expected = wire::PayloadLength(static_cast<wire::MsgType>(type));
    const bool wrong_length = (mode & 0x0C) == 0x0C;
    h.length = wrong_length ? len : static_cast<uint32_t>(expected);
    h.seq = seq;
    msg.assign(reinterpret_cast<uint8_t*>(&h), reinterpret_cast<uint8_t*>(&h) + sizeof h);
    const size_t body = wrong_length ? len : expected;
    for (size_t i = 0; i < body; ++i) msg.push_back(i < len ? data[off + i] : 0);
    off += len;
    if (::send(fd, msg.data(), msg.size(), MSG_DONTWAIT | MSG_NOSIGNAL) < 0) break;
    Drain(fd);
  }
  Settle(fd, 1000);
  sock->reset();
  if (++w->inputs % 16 == 0) w->CheckStillServing();
  return 0;
}
