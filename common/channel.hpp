// The control channel: SOCK_SEQPACKET Unix sockets carrying wire::MsgHeader-framed messages
// with file descriptors as SCM_RIGHTS. Every received message is validated here (magic,
// version, type, exact length, no truncation) before anyone looks at its payload.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "common/fd.hpp"
#include "common/wire.hpp"

namespace ferry {

struct PeerCredentials {
  pid_t pid = -1;
  uid_t uid = static_cast<uid_t>(-1);
  gid_t gid = static_cast<gid_t>(-1);
};

struct ReceivedMessage {
  wire::MsgHeader header{};
  std::vector<std::byte> payload;
  std::vector<UniqueFd> fds;

  wire::MsgType type() const { return static_cast<wire::MsgType>(header.type); }
  template <typename T>
  T As() const {  // length was checked against the type on receipt
    T out;
    std::memcpy(&out, payload.data(), sizeof(T));
    return out;
  }
};

constexpr int kListenBacklog = 64;  // connections the kernel holds for the listener to accept

// Listens on `path` (an existing socket file there is replaced) with the file mode `mode`.
Result<UniqueFd> ListenUnix(const std::string& path, mode_t mode);
// Gives up with kTimeout after timeout_ms (< 0: waits as long as the kernel does) while the
// listener's backlog is full.
Result<UniqueFd> ConnectUnix(const std::string& path, int timeout_ms = -1);
Result<UniqueFd> AcceptUnix(int listen_fd);
Result<PeerCredentials> GetPeerCredentials(int fd);

// A message framed for the wire: header and payload, as one buffer.
std::vector<std::byte> FrameMessage(wire::MsgType type, uint32_t seq, const void* payload, size_t len);
// Sends a framed message without waiting: true when it went, false when the socket's buffer is
// full (EAGAIN; nothing was sent, the caller keeps the message).
Result<bool> TrySendFramed(int fd, const std::vector<std::byte>& frame, const int* fds = nullptr, size_t nfds = 0);

// Waits up to 1 s for room on a full socket.
Status SendMessage(int fd, wire::MsgType type, uint32_t seq, const void* payload, size_t len,
                   const int* fds = nullptr, size_t nfds = 0);
template <typename T>
Status Send(int fd, wire::MsgType type, uint32_t seq, const T& payload, const int* fds = nullptr,
            size_t nfds = 0) {
  static_assert(std::is_trivially_copyable_v<T>);
  return SendMessage(fd, type, seq, &payload, sizeof payload, fds, nfds);
}

// Who sent the messages a receiver reads: its clients (ferryd's side) or ferryd (a client's).
enum class Sender { kClient, kFerryd };

// Blocks until one message arrives (timeout_ms < 0: forever). kUnavailable on orderly EOF.
// A message of another protocol version is refused, except a kHello from a client (its layout
// is frozen: header.version tells ferryd to answer with both versions) and a kHelloReply from
// ferryd, whose refusal names both versions and carries what ferryd said.
Result<ReceivedMessage> RecvMessage(int fd, int timeout_ms = -1, Sender from = Sender::kClient);

// A hello answered: the connection and ferryd's kHelloReply (sent with seq 1), whose status
// the caller reads (a refusal, or "starting" when ferryd was still starting at the deadline).
struct Greeting {
  UniqueFd sock;
  ReceivedMessage reply;
};
// Connects and says `hello`, again on a new connection every `retry_every` while ferryd
// answers that it is starting (wire::kReplyStarting), until `timeout` has passed since the
// call: each connect and each wait for a reply gets what is left of it, so the whole call
// takes at most `timeout` (and one retry's sleep).
Result<Greeting> HelloUntilReady(const std::string& path, const wire::HelloRequest& hello,
                                 std::chrono::milliseconds timeout, std::chrono::milliseconds retry_every);

// Sets a NUL-terminated message into a fixed wire buffer.
template <size_t N>
void CopyCString(char (&dst)[N], std::string_view src) {
  size_t n = src.size() < N - 1 ? src.size() : N - 1;
  std::memcpy(dst, src.data(), n);
  std::memset(dst + n, 0, N - n);
}
// Reads a wire string that may not be terminated (never trust the peer).
template <size_t N>
std::string ReadCString(const char (&src)[N]) {
  return std::string(src, strnlen(src, N));
}

wire::ReplyStatus ToWire(const Status& s);
Status FromWire(const wire::ReplyStatus& w);

}  // namespace ferry
