// A connection to ferryd that speaks the protocol by hand (hello, then its ring), for tests that
// do what libferry never would. The tests' raw clients build on it.
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <optional>
#include <string>
#include <thread>

#include "common/channel.hpp"
#include "common/fd.hpp"
#include "common/status_macros.hpp"
#include "common/wire.hpp"

namespace ferry::testing {

class RawConnection {
 public:
  // The hello; a refused one returns ferryd's reason.
  Status Open(const std::string& socket, const std::string& name = "raw") {
    FERRY_ASSIGN_OR_RETURN(sock_, ConnectUnix(socket));
    wire::HelloRequest h{};
    h.client_version = wire::kVersion;
    CopyCString(h.name, name);
    FERRY_RETURN_IF_ERROR(Send(sock_.get(), wire::MsgType::kHello, 1, h));
    FERRY_ASSIGN_OR_RETURN(ReceivedMessage m, RecvMessage(sock_.get(), 5000));
    if (m.type() != wire::MsgType::kHelloReply) return Internal("bad hello reply");
    reply_ = m.As<wire::HelloReply>();
    FERRY_RETURN_IF_ERROR(FromWire(reply_.status));
    if (m.fds.size() != 3) return Internal("hello reply without its three fds");
    FERRY_ASSIGN_OR_RETURN(ring_, MapShared(m.fds[0].get(), reply_.ring_bytes));
    submit_ = std::move(m.fds[1]);
    complete_ = std::move(m.fds[2]);
    return Status::Ok();
  }
  wire::RingHeader* header() { return reinterpret_cast<wire::RingHeader*>(ring_.data()); }
  wire::SubmissionEntry* sq() { return wire::SubmissionEntries(ring_.data()); }
  wire::CompletionEntry* cq() { return wire::CompletionEntries(ring_.data(), reply_.sq_entries); }
  void Kick() { RingDoorbell(submit_.get()); }
  // One entry into the ring, published and rung.
  void Push(const wire::SubmissionEntry& e) {
    const uint32_t tail = header()->sq_tail.value.load();
    sq()[tail & (reply_.sq_entries - 1)] = e;
    header()->sq_tail.value.store(tail + 1);
    Kick();
  }
  // The next completion; nullopt if none comes within `timeout`.
  std::optional<wire::CompletionEntry> Next(std::chrono::milliseconds timeout = std::chrono::seconds(5)) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      const uint32_t head = header()->cq_head.value.load();
      if (header()->cq_tail.value.load() != head) {
        wire::CompletionEntry c = cq()[head & (reply_.cq_entries - 1)];
        header()->cq_head.value.store(head + 1);
        return c;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return std::nullopt;
  }
  // Whether ferryd closes the connection within `timeout_ms`.
  bool DaemonHungUp(int timeout_ms = 2000) {
    auto m = RecvMessage(sock_.get(), timeout_ms);
    return !m.ok() && m.status().code() == Code::kUnavailable;
  }
  // Whether ferryd goes to sleep within 5 s (its sleeping bit in this ring) and sleeps on for
  // `span`, the bit set whenever looked at.
  bool DaemonSleepsFor(std::chrono::milliseconds span) {
    auto asleep = [&] { return header()->daemon_state.value.load() & wire::kDaemonSleeping; };
    for (const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5); !asleep();) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    for (const auto end = std::chrono::steady_clock::now() + span; std::chrono::steady_clock::now() < end;) {
      if (!asleep()) return false;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    return true;
  }
  int sock() const { return sock_.get(); }
  int complete_doorbell() const { return complete_.get(); }

  // A host event (`flags`: wire::kEventWantsFlag for a flag ferryd's lanes wait on).
  Result<wire::RegisterEventReply> RegisterEvent(uint32_t flags) {
    wire::RegisterEventRequest req{};
    req.kind = static_cast<uint32_t>(wire::EventHandleKind::kHost);
    req.flags = flags;
    FERRY_ASSIGN_OR_RETURN(ReceivedMessage m, Call(wire::MsgType::kRegisterEvent, req));
    const auto r = m.As<wire::RegisterEventReply>();
    FERRY_RETURN_IF_ERROR(FromWire(r.status));
    last_event_reply_fds_ = m.fds.size();
    return r;
  }
  // How many fds came with the last RegisterEvent's reply (device flags: one, the first time).
  size_t last_event_reply_fds() const { return last_event_reply_fds_; }
  std::atomic_ref<uint32_t> Flag(uint32_t index) {
    return std::atomic_ref<uint32_t>(wire::EventFlags(ring_.data(), reply_.sq_entries, reply_.cq_entries)[index]);
  }
  // As libferry's host device records: the value, then a wake for a lane asleep on the word.
  void Record(uint32_t index, uint32_t value) {
    Flag(index).store(value, std::memory_order_release);
    ::syscall(SYS_futex, &wire::EventFlags(ring_.data(), reply_.sq_entries, reply_.cq_entries)[index], FUTEX_WAKE,
              INT_MAX, nullptr, nullptr, 0);
  }

 protected:
  // One control request (with one fd, or none) and its reply.
  template <typename T>
  Result<ReceivedMessage> Call(wire::MsgType type, const T& request, int fd = -1) {
    FERRY_RETURN_IF_ERROR(Send(sock_.get(), type, ++seq_, request, fd >= 0 ? &fd : nullptr, fd >= 0 ? 1 : 0));
    return RecvMessage(sock_.get(), 5000);
  }

  UniqueFd sock_, submit_, complete_;
  Mapping ring_;
  wire::HelloReply reply_{};
  uint32_t seq_ = 1;
  size_t last_event_reply_fds_ = 0;
};

}  // namespace ferry::testing
