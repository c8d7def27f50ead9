// Control messages from arbitrary bytes, through a real SEQPACKET socket pair and the decoder
// ferryd uses: rejected with an error, or accepted with exactly the length its type has.
#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>

#include "common/channel.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static int fds[2] = {-1, -1};
  if (fds[0] < 0 && ::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds) != 0) return 0;
  if (size > 4096) size = 4096;
  if (::send(fds[0], data, size, MSG_DONTWAIT) < 0) return 0;
  auto m = ferry::RecvMessage(fds[1], 100);
  if (m.ok()) {
    if (m->header.magic != ferry::wire::kMagic || m->payload.size() != ferry::wire::PayloadLength(m->type())) {
      __builtin_trap();
    }
  }
  return 0;
}
