// The event loop's epoll: every fd it watches carries a tag that says what it is.
#pragma once

#include <sys/epoll.h>

#include <cerrno>
#include <cstdint>
#include <functional>
#include <utility>

#include "common/fd.hpp"
#include "ferry/status.hpp"

namespace ferry::daemon {

// Tags of ferryd's own fds.
inline constexpr uint64_t kListenTag = 1;
inline constexpr uint64_t kStopTag = 2;
inline constexpr uint64_t kBackendTag = 3;
inline constexpr uint64_t kReloadTag = 4;
inline constexpr uint64_t kZeroedTag = 5;
inline constexpr uint64_t kPolicyLoadedTag = 8;  // the policy loader finished a file
// A session's fds (and a client's pidfd) are tagged with its id (the pid) and their kind.
inline constexpr uint64_t kSocketKind = 0;
inline constexpr uint64_t kDoorbellKind = 1;
inline constexpr uint64_t kPeerExitKind = 2;  // the pidfd of an ended session's client, while its slabs are quarantined
constexpr uint64_t SessionTag(uint64_t id, uint64_t kind) { return (id << 8) | 0x10 | kind; }

class Poller {
 public:
  static Result<Poller> Create() {
    Poller p;
    p.epoll_.reset(::epoll_create1(EPOLL_CLOEXEC));
    if (!p.epoll_.valid()) return ErrnoStatus("epoll_create1", errno);
    return p;
  }

  Status Watch(int fd, uint64_t tag, uint32_t events = EPOLLIN) {
    if (watch_fault_) {
      if (Status fault = watch_fault_(tag); !fault.ok()) return fault;
    }
    return Control(EPOLL_CTL_ADD, fd, tag, events);
  }
  // Test seam: asked before each Watch with the fd's tag; an error fails the Watch, as one of
  // epoll_ctl's would (ENOSPC past fs.epoll.max_user_watches, ENOMEM).
  void set_watch_fault(std::function<Status(uint64_t tag)> fault) { watch_fault_ = std::move(fault); }
  Status Modify(int fd, uint64_t tag, uint32_t events) { return Control(EPOLL_CTL_MOD, fd, tag, events); }
  void Unwatch(int fd) {
    if (fd >= 0) ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, fd, nullptr);
  }
  // epoll_wait: the number of events, or -1 with errno.
  int Wait(epoll_event* events, int max, int timeout_ms) { return ::epoll_wait(epoll_.get(), events, max, timeout_ms); }

 private:
  Status Control(int op, int fd, uint64_t tag, uint32_t events) {
    epoll_event ev{};
    ev.events = events;
    ev.data.u64 = tag;
    if (::epoll_ctl(epoll_.get(), op, fd, &ev) != 0) return ErrnoStatus("epoll_ctl", errno);
    return Status::Ok();
  }

  UniqueFd epoll_;
  std::function<Status(uint64_t tag)> watch_fault_;
};

}  // namespace ferry::daemon
