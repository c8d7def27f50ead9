// ferryd's sessions and their control messages: admitting a connection (within the limits on
// connections that have not said hello), hello (who may connect, sessions per uid, the ring
// segment), buffers, device regions, events, stats and policy requests, the per-session and
// per-uid limits on them, replies that never block the loop, and ending a session.
// sessions.cc: a session's life; control_handlers.cc: the requests a live session makes.
// Event-loop thread only.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>

#include "common/channel.hpp"
#include "daemon/config.hpp"
#include "daemon/device_set.hpp"
#include "daemon/pinned_pool.hpp"
#include "daemon/policy_loader.hpp"
#include "daemon/poller.hpp"
#include "daemon/rejections.hpp"
#include "daemon/rings.hpp"
#include "daemon/running_policy.hpp"
#include "daemon/scheduler.hpp"
#include "daemon/session.hpp"

namespace ferry::daemon {

// The pool's gauges in ServerCounters, read again after anything that may have changed them.
inline void UpdatePoolCounters(const PinnedPool& pool, ServerCounters& counters) {
  counters.pool_free_bytes = pool.free_bytes();
  counters.pool_quarantined_bytes = pool.quarantined_bytes();
  counters.pool_zeroing_bytes = pool.zeroing_bytes();
  counters.pool_broken_bytes = pool.broken_bytes();
  for (uint32_t i = 0; i < pool.part_count() && i < counters.pool_part.size(); ++i) {
    counters.pool_part[i].free_bytes = pool.free_bytes(i);
  }
}

class Sessions {
 public:
  // What a session needs from the rest of ferryd; all must outlive it.
  struct Services {
    SessionMap& map;
    DeviceSet& backend;
    PinnedPool& pool;
    Poller& poller;
    Rings& rings;
    Scheduler& scheduler;
    const RunningPolicy& policy;
    PolicyLoader& policy_loader;
    ServerCounters& counters;
    Rejections& rejections;
    const std::vector<uint32_t>& gpu_pool_part;  // the pool part (NUMA node) of each GPU
  };
  // allowed_gid: none, only ferryd's own uid (and root) may connect.
  Sessions(const DaemonConfig& config, std::optional<gid_t> allowed_gid, Services services);
  Sessions(const Sessions&) = delete;
  Sessions& operator=(const Sessions&) = delete;

  // A new connection: a session that must say hello by the deadline returned, or 0 when it
  // is refused (closed) because too many connections have not said hello yet.
  uint64_t Admit(UniqueFd sock, const PeerCredentials& peer);
  // Evicts the sessions that did not say hello in time; returns the next deadline (UINT64_MAX: none).
  uint64_t EnforceHelloDeadlines(uint64_t now);
  // The session's socket is readable, writable or hung up.
  void OnSocketEvent(Session& s, uint32_t epoll_events);
  // After a policy switch: every session's class (and its scheduling weight) under the new one.
  void Reclassify();
  // A policy file that `load.session_id` sent (kApplyPolicy) was read: tells it the outcome.
  // previous_hash: the running policy's before the load was applied.
  void ReplyPolicyLoaded(const PolicyLoad& load, const std::string& previous_hash);

  // Stops serving a session now; its resources go once its copies in flight are done (the copy
  // engines may still be reading or writing its buffers). Evict: it misbehaved or failed
  // (counted, a warning); End: it ended normally (disconnected, ferryd stops).
  void Evict(Session& s, const std::string& reason) { Close(s, reason, Closing::kEvicted); }
  void End(Session& s, const std::string& reason) { Close(s, reason, Closing::kEnded); }

  uint64_t session_quota_bytes() const { return quota_; }

 private:
  // kTurnedAway: refused at hello for a limit or a uid not allowed (a warning, not counted as an
  // eviction: the client broke no rule).
  enum class Closing { kEnded, kTurnedAway, kEvicted };
  void Close(Session& s, const std::string& reason, Closing how);
  void LogRefusedConnection(const PeerCredentials& peer, const std::string& why);
  uint64_t HelloTimeoutNs() const { return uint64_t{config_.limits.hello_timeout_ms} * 1'000'000; }
  bool Authorized(const Session& s) const;

  // Replies never wait for the client: what does not fit in its socket buffer is queued (in
  // order, with copies of its fds) and sent when the socket is writable; a client that lets
  // more than limits.outbound_messages pile up is evicted.
  template <typename T>
  void Reply(Session& s, wire::MsgType type, uint32_t seq, const T& payload, const int* fds = nullptr,
             size_t nfds = 0) {
    static_assert(std::is_trivially_copyable_v<T>);
    ReplyFrame(s, type, seq, &payload, sizeof payload, fds, nfds);
  }
  void ReplyFrame(Session& s, wire::MsgType type, uint32_t seq, const void* payload, size_t size, const int* fds,
                  size_t nfds);
  void ReplySimple(Session& s, uint32_t seq, const Status& st);
  void FlushOutbound(Session& s);
  // A reply that could not be sent: a client found gone (EPIPE, ECONNRESET: killed between its
  // request and our answer) ends as a disconnect; any other failure evicts it.
  void ReplyNotSent(Session& s, const Status& why);
  Status RefuseFdsWhileRepliesWait(const Session& s);

  void HandleControl(Session& s);
  void Dispatch(Session& s, ReceivedMessage& msg);
  void HandleHello(Session& s, uint32_t seq, uint16_t version, const wire::HelloRequest& req);
  void HandleAlloc(Session& s, uint32_t seq, const wire::AllocBufferRequest& req);
  void HandleRegisterDevice(Session& s, uint32_t seq, const wire::RegisterDeviceRequest& req, UniqueFd fd);
  void HandleUnregister(Session& s, uint32_t seq, const wire::UnregisterDeviceRequest& req);
  void HandleRegisterEvent(Session& s, uint32_t seq, const wire::RegisterEventRequest& req);
  uint32_t AssignEventFlag(Session& s, uint32_t event_id);
  void HandleApplyPolicy(Session& s, uint32_t seq, const wire::ApplyPolicyRequest& req, UniqueFd fd);
  void HandleGetPolicy(Session& s, uint32_t seq, const wire::GetPolicyRequest& req);
  void HandleStats(Session& s, uint32_t seq);
  void HandleUseGpu(Session& s, uint32_t seq, const wire::UseGpuRequest& req);
  void HandleGpuStats(Session& s, uint32_t seq, const wire::GpuStatsRequest& req);

  const DaemonConfig& config_;
  const std::optional<gid_t> allowed_gid_;
  Services svc_;
  const uint64_t quota_;  // pool bytes one session may hold
  uint64_t next_session_id_ = 1;
  uint64_t last_refusal_log_ns_ = 0;
  uint64_t refusals_unlogged_ = 0;
};

}  // namespace ferry::daemon
