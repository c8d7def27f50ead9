#include "common/channel.hpp"
#include "common/status_macros.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <thread>
#include <cerrno>

namespace ferry {
namespace {

Result<sockaddr_un> UnixAddress(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof addr.sun_path) return InvalidArgument("socket path too long: " + path);
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  return addr;
}

}  // namespace

size_t wire::PayloadLength(MsgType type) {
  switch (type) {
    case MsgType::kHello: return sizeof(PayloadOf<MsgType::kHello>::type);
    case MsgType::kHelloReply: return sizeof(PayloadOf<MsgType::kHelloReply>::type);
    case MsgType::kAllocBuffer: return sizeof(PayloadOf<MsgType::kAllocBuffer>::type);
    case MsgType::kAllocBufferReply: return sizeof(PayloadOf<MsgType::kAllocBufferReply>::type);
    case MsgType::kFreeBuffer: return sizeof(PayloadOf<MsgType::kFreeBuffer>::type);
    case MsgType::kRegisterDevice: return sizeof(PayloadOf<MsgType::kRegisterDevice>::type);
    case MsgType::kRegisterDeviceReply: return sizeof(PayloadOf<MsgType::kRegisterDeviceReply>::type);
    case MsgType::kUnregisterDevice: return sizeof(PayloadOf<MsgType::kUnregisterDevice>::type);
    case MsgType::kRegisterEvent: return sizeof(PayloadOf<MsgType::kRegisterEvent>::type);
    case MsgType::kRegisterEventReply: return sizeof(PayloadOf<MsgType::kRegisterEventReply>::type);
    case MsgType::kSimpleReply: return sizeof(PayloadOf<MsgType::kSimpleReply>::type);
    case MsgType::kStats: return sizeof(PayloadOf<MsgType::kStats>::type);
    case MsgType::kStatsReply: return sizeof(PayloadOf<MsgType::kStatsReply>::type);
    case MsgType::kApplyPolicy: return sizeof(PayloadOf<MsgType::kApplyPolicy>::type);
    case MsgType::kPolicyReply: return sizeof(PayloadOf<MsgType::kPolicyReply>::type);
    case MsgType::kGetPolicy: return sizeof(PayloadOf<MsgType::kGetPolicy>::type);
    case MsgType::kUseGpu: return sizeof(PayloadOf<MsgType::kUseGpu>::type);
    case MsgType::kUseGpuReply: return sizeof(PayloadOf<MsgType::kUseGpuReply>::type);
    case MsgType::kGpuStats: return sizeof(PayloadOf<MsgType::kGpuStats>::type);
    case MsgType::kGpuStatsReply: return sizeof(PayloadOf<MsgType::kGpuStatsReply>::type);
  }
  return 0;
}

Result<UniqueFd> ListenUnix(const std::string& path, mode_t mode) {
  FERRY_RETURN_IF_ERROR(UnixAddress(path).status());  // the final name must fit too
  UniqueFd fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return ErrnoStatus("socket", errno);
  // Bind and listen under a temporary name, then rename into place: whoever sees `path` can
  // connect at once, and an old socket there is replaced in one step.
  const std::string tmp = path + ".new-" + std::to_string(::getpid());
  FERRY_ASSIGN_OR_RETURN(sockaddr_un tmp_addr, UnixAddress(tmp));
  ::unlink(tmp.c_str());
  // Bind under a restrictive umask so the socket is never briefly open to everyone.
  mode_t old = ::umask(0177);
  int rc = ::bind(fd.get(), reinterpret_cast<sockaddr*>(&tmp_addr), sizeof tmp_addr);
  int err = errno;
  ::umask(old);
  if (rc != 0) return ErrnoStatus("bind(" + tmp + ")", err);
  Status st;
  if (::chmod(tmp.c_str(), mode) != 0) st = ErrnoStatus("chmod(" + tmp + ")", errno);
  if (st.ok() && ::listen(fd.get(), kListenBacklog) != 0) st = ErrnoStatus("listen", errno);
  if (st.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) st = ErrnoStatus("rename(" + tmp + ", " + path + ")", errno);
  if (!st.ok()) {
    ::unlink(tmp.c_str());
    return st;
  }
  return fd;
}

Result<UniqueFd> ConnectUnix(const std::string& path, int timeout_ms) {
  FERRY_ASSIGN_OR_RETURN(sockaddr_un addr, UnixAddress(path));
  // Non-blocking: a Unix socket's connect waits, regardless of any timeout, while the
  // listener's backlog is full; non-blocking it says EAGAIN and we retry until the deadline.
  UniqueFd fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return ErrnoStatus("socket", errno);
  const uint64_t start = MonotonicNanos();
  for (uint32_t attempt = 0;; ++attempt) {
    if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) break;
    int err = errno;
    if (err == EINTR) continue;
    if (err == EAGAIN) {
      const uint64_t waited_ms = (MonotonicNanos() - start) / 1'000'000;
      if (timeout_ms >= 0 && waited_ms >= static_cast<uint64_t>(timeout_ms)) {
        return Timeout("ferryd at " + path + " did not accept the connection within " + std::to_string(timeout_ms) +
                       " ms (its listen backlog is full)");
      }
      // Short sleeps first (a backlog drains within a loop turn), then at most 10 ms.
      ::usleep(std::min<uint32_t>(100u << std::min(attempt, 7u), 10'000));
      continue;
    }
    Status s = ErrnoStatus("connect(" + path + ")", err);
    if (err == ENOENT || err == ECONNREFUSED) {
      return Unavailable("ferryd is not running at " + path + " (" + s.message() + ")");
    }
    return s;
  }
  int flags = ::fcntl(fd.get(), F_GETFL);
  if (flags < 0 || ::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK) != 0) return ErrnoStatus("fcntl(O_NONBLOCK)", errno);
  return fd;
}

Result<Greeting> HelloUntilReady(const std::string& path, const wire::HelloRequest& hello,
                                 std::chrono::milliseconds timeout, std::chrono::milliseconds retry_every) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto left_ms = [&] {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    return static_cast<int>(std::max<int64_t>(left.count(), 1));
  };
  for (;;) {
    Greeting g;
    auto sock = ConnectUnix(path, left_ms());
    if (!sock.ok() && sock.status().code() == Code::kTimeout) {
      return Timeout("ferryd at " + path + " did not accept the connection within " + std::to_string(timeout.count()) +
                     " ms (its listen backlog is full)");
    }
    FERRY_ASSIGN_OR_RETURN(g.sock, std::move(sock));
    FERRY_RETURN_IF_ERROR(Send(g.sock.get(), wire::MsgType::kHello, 1, hello));
    FERRY_ASSIGN_OR_RETURN(g.reply, RecvMessage(g.sock.get(), left_ms(), Sender::kFerryd));
    if (g.reply.type() != wire::MsgType::kHelloReply || g.reply.header.seq != 1) {
      return ProtocolError("ferryd at " + path + " answered hello with another message");
    }
    const auto starting = g.reply.As<wire::HelloReply>().status.flags & wire::kReplyStarting;
    if (starting == 0 || std::chrono::steady_clock::now() + retry_every >= deadline) return g;
    std::this_thread::sleep_for(retry_every);
  }
}

Result<UniqueFd> AcceptUnix(int listen_fd) {
  UniqueFd fd(::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
  if (!fd.valid()) return ErrnoStatus("accept", errno);
  return fd;
}

Result<PeerCredentials> GetPeerCredentials(int fd) {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return ErrnoStatus("SO_PEERCRED", errno);
  return PeerCredentials{cred.pid, cred.uid, cred.gid};
}

std::vector<std::byte> FrameMessage(wire::MsgType type, uint32_t seq, const void* payload, size_t len) {
  wire::MsgHeader h{wire::kMagic, wire::kVersion, static_cast<uint16_t>(type), static_cast<uint32_t>(len), seq};
  std::vector<std::byte> frame(sizeof h + len);
  std::memcpy(frame.data(), &h, sizeof h);
  if (len > 0) std::memcpy(frame.data() + sizeof h, payload, len);
  return frame;
}

Result<bool> TrySendFramed(int fd, const std::vector<std::byte>& frame, const int* fds, size_t nfds) {
  if (nfds > wire::kMaxFdsPerMessage) return Internal("too many fds for one message");
  iovec iov{const_cast<std::byte*>(frame.data()), frame.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  std::vector<char> control;
  if (nfds > 0) {
    control.resize(CMSG_SPACE(nfds * sizeof(int)));
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(nfds * sizeof(int));
    std::memcpy(CMSG_DATA(c), fds, nfds * sizeof(int));
  }
  for (;;) {
    ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return false;
    if (n < 0) return ErrnoStatus("sendmsg", errno);
    if (static_cast<size_t>(n) != frame.size()) return ProtocolError("short send on control socket");
    return true;
  }
}

Status SendMessage(int fd, wire::MsgType type, uint32_t seq, const void* payload, size_t len, const int* fds,
                   size_t nfds) {
  const std::vector<std::byte> frame = FrameMessage(type, seq, payload, len);
  for (;;) {
    FERRY_ASSIGN_OR_RETURN(bool sent, TrySendFramed(fd, frame, fds, nfds));
    if (sent) return Status::Ok();
    pollfd p{fd, POLLOUT, 0};
    int rc = ::poll(&p, 1, 1000);
    if (rc < 0 && errno == EINTR) continue;
    if (rc <= 0) return Timeout("control socket full for 1 s");
  }
}

Result<ReceivedMessage> RecvMessage(int fd, int timeout_ms, Sender from) {
  constexpr size_t kMaxPayload = 1024;
  ReceivedMessage out;
  out.payload.resize(kMaxPayload);
  std::vector<char> control(CMSG_SPACE(wire::kMaxFdsPerMessage * sizeof(int)));
  iovec iov[2] = {{&out.header, sizeof out.header}, {out.payload.data(), out.payload.size()}};
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = 2;
  msg.msg_control = control.data();
  msg.msg_controllen = control.size();
  ssize_t n;
  for (;;) {
    n = ::recvmsg(fd, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) {
      FERRY_ASSIGN_OR_RETURN(bool readable, WaitReadable(fd, timeout_ms));
      if (!readable) return Timeout("no reply on the control socket within " + std::to_string(timeout_ms) + " ms");
      continue;
    }
    break;
  }
  if (n < 0) return ErrnoStatus("recvmsg", errno);
  // Take ownership of every fd first, so that a rejected message leaks none.
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int f;
        std::memcpy(&f, CMSG_DATA(c) + i * sizeof(int), sizeof f);
        out.fds.emplace_back(f);
      }
    }
  }
  if (n == 0) return Unavailable("peer closed the control socket");
  if ((msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0) return ProtocolError("control message truncated");
  if (static_cast<size_t>(n) < sizeof out.header) return ProtocolError("control message shorter than its header");
  const wire::MsgHeader& h = out.header;
  if (h.magic != wire::kMagic) return ProtocolError("bad magic on control message");
  const size_t got = static_cast<size_t>(n) - sizeof h;
  if (h.version != wire::kVersion) {
    // A hello's layout is frozen across versions: it reaches ferryd, which answers naming both.
    const bool frozen_hello = from == Sender::kClient && h.type == static_cast<uint16_t>(wire::MsgType::kHello) &&
                              h.length == sizeof(wire::HelloRequest) && got == sizeof(wire::HelloRequest);
    if (frozen_hello) {
      out.payload.resize(got);
      return out;
    }
    // So is the status that starts a reply: a hello answered by a ferryd of another version.
    if (from == Sender::kFerryd && h.type == static_cast<uint16_t>(wire::MsgType::kHelloReply) &&
        got >= sizeof(wire::ReplyStatus) &&
        h.length == got) {
      wire::ReplyStatus st;
      std::memcpy(&st, out.payload.data(), sizeof st);
      const std::string said = st.code != 0 ? ": " + ReadCString(st.message) : "";
      return ProtocolError("ferryd speaks protocol " + std::to_string(h.version) + ", this client speaks protocol " +
                           std::to_string(wire::kVersion) + said +
                           " (use a libferry from the same ferry release as the running ferryd)");
    }
    return ProtocolError("protocol version " + std::to_string(h.version) + " spoken, " +
                         std::to_string(wire::kVersion) + " expected (a peer built from another ferry release)");
  }
  size_t want = wire::PayloadLength(static_cast<wire::MsgType>(h.type));
  if (want == 0) return ProtocolError("unknown control message type " + std::to_string(h.type));
  if (h.length != want) {
    return ProtocolError("control message of type " + std::to_string(h.type) + ": its header claims " +
                         std::to_string(h.length) + " payload bytes and the message has " + std::to_string(got) +
                         "; this type has " + std::to_string(want) +
                         " (a corrupt message, or a peer built from another ferry version)");
  }
  if (got != want) {
    return ProtocolError("control message of type " + std::to_string(h.type) + " has " + std::to_string(got) +
                         " payload bytes; its header and its type say " + std::to_string(want) +
                         " (a truncated message, or a peer built from another ferry version)");
  }
  out.payload.resize(want);
  return out;
}

wire::ReplyStatus ToWire(const Status& s) {
  wire::ReplyStatus w{};
  w.code = static_cast<int32_t>(s.code());
  CopyCString(w.message, s.message());
  return w;
}

Status FromWire(const wire::ReplyStatus& w) {
  if (w.code == 0) return Status::Ok();
  int32_t c = w.code;
  Code code = (c > 0 && c <= static_cast<int32_t>(Code::kAborted)) ? static_cast<Code>(c) : Code::kInternal;
  return Status(code, ReadCString(w.message));
}

}  // namespace ferry
