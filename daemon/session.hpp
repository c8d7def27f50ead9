// One client connection of ferryd and everything it holds: its socket and queued replies, its
// rings, buffers, device regions and events, and what is needed to judge its wait reports.
// Plain state, shared by the rooms that serve it (sessions.cc: control messages; rings.cc: the
// data plane; server.cc: the loop), on the event-loop thread only. Its copies' scheduling
// state is the scheduler's, kept by session id.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/channel.hpp"
#include "common/fd.hpp"
#include "common/wire.hpp"
#include "daemon/backend.hpp"
#include "daemon/pinned_pool.hpp"
#include "policy/policy.hpp"

namespace ferry::daemon {

struct RegionState {
  std::unique_ptr<DeviceRegion> region;
  uint32_t in_flight = 0;
  bool unregistering = false;
};

// A reply that did not fit in the client's socket buffer, waiting for it to read.
struct OutboundMessage {
  std::vector<std::byte> frame;  // header and payload
  std::vector<UniqueFd> fds;     // our own copies of the fds it carries
};

// How many of a session's refused requests were logged (Rings::Reject).
struct RejectLog {
  uint32_t logged = 0;
  uint64_t unlogged = 0;       // refused since the last line
  uint64_t summarized_ns = 0;  // when the last line was written
};

// One of the session's recent copies, to check its wait reports (kReportWait) against.
struct ReportableCopy {
  uint64_t copy_id = 0;
  uint64_t written_after_ns = 0;  // sq_seen_empty_ns when the copy was read off the ring
  uint64_t accepted_ns = 0, done_ns = 0;
  Direction direction = Direction::kHostToDevice;
  bool reported = false;
};

struct Session {
  uint64_t id = 0;
  PeerCredentials peer;
  std::string name;
  UniqueFd sock;
  UniqueFd peer_pidfd;  // readable once the client process has exited; invalid where pidfd_open fails
  bool hello_done = false;
  bool dead = false;
  uint64_t accepted_ns = 0;
  // Replies wait here, in order, while the client's socket is full; the loop never blocks on it.
  std::deque<OutboundMessage> outbound;
  bool watching_writable = false;  // EPOLLOUT on sock while outbound is not empty

  UniqueFd ring_fd, submit_efd, complete_efd;
  Mapping ring;
  wire::RingHeader* hdr = nullptr;
  wire::SubmissionEntry* sq = nullptr;
  wire::CompletionEntry* cq = nullptr;
  uint32_t sq_entries = 0, cq_entries = 0;  // daemon's copies; never read back from shared memory
  uint32_t sq_head = 0, cq_tail = 0;
  uint32_t* done_words = nullptr;  // in `ring`; null unless the engines write them (flags_registered)
  uint32_t staging_generation = 0;  // ours: the client can write the ring's copy
  uint32_t in_flight = 0;
  uint64_t blocks_in_flight = 0;  // of its block lists in flight
  // Its ring holds entries left for want of room (in_flight or blocks_in_flight at their caps):
  // nothing to read until one of its copies finishes, which clears it.
  bool submissions_blocked = false;
  std::deque<wire::CompletionEntry> backlog;
  // When ferryd last saw the submission ring with nothing unread: every entry read later was
  // written after this, so it bounds how long a client can have waited for that copy.
  uint64_t sq_seen_empty_ns = 0;

  std::unique_ptr<SessionArena> arena;
  std::map<uint32_t, RegionState> regions;
  uint32_t next_region_id = 1;
  // The GPU its copies go to (kUseGpu; ferryd's index), which its device memory and events are
  // on, and its pool buffers near. Named before it uses any: until then the first GPU.
  uint32_t gpu = 0;
  std::map<uint32_t, std::unique_ptr<SharedEvent>> events;
  uint32_t next_event_id = 1;
  // GPU-side "after" (RegisterEventReply::flag_index): the events that have a flag word, in the
  // ring segment's flag area or in the session's device flags (flag_place). ferryd only ever
  // waits on a flag, and writes it only to let its own waits go when the session ends
  // (ReleaseFlagWaits).
  struct EventFlag {
    uint32_t index = 0;
  };
  std::map<uint32_t, EventFlag> event_flags;  // by event id
  // The session's copies on its lanes, by copy id (the order they went to the lanes): the flag
  // each waits on and the value it waits for. The values are the client's: no one value need
  // satisfy every wait on a flag (cyclically, two half the counter apart never are both met).
  struct LaneWait {
    uint32_t index = 0;
    uint32_t value = 0;
  };
  std::map<uint64_t, LaneWait> lane_waits;
  uint32_t* flags = nullptr;                  // the event flags, in `ring`
  // Where the engines see them, fixed at the first flagged event (Backend::ShareDeviceFlags):
  // on the device, a flag's word in `flags` is never read (ReleaseFlagWaits writes the device's).
  enum class FlagPlace { kUndecided, kRing, kDevice };
  FlagPlace flag_place = FlagPlace::kUndecided;
  bool flag_release_failed = false;           // said once in the log
  uint32_t next_flag = 0;                     // events live as long as the session: no free list
  bool flags_registered = false;              // the flag area, with the backend (RegisterFlags)
  ClientClass klass;

  // The session's recent copies, by user_tag: bounded (the oldest are forgotten first), each
  // reportable once. Two rings' worth at least: a client may have a whole ring of copies out and
  // report its waits on them only after the next ring's worth went in.
  static constexpr size_t kMinReportableCopies = 4096;
  size_t max_reportable_copies() const { return std::max<size_t>(kMinReportableCopies, 2 * size_t{sq_entries}); }
  std::unordered_map<uint64_t, ReportableCopy> reportable;
  std::deque<std::pair<uint64_t, uint64_t>> reportable_order;  // (user_tag, copy_id), oldest first
  RejectLog reject_log;
};

// Every session, by id (the order deficit round robin visits them in).
using SessionMap = std::map<uint64_t, std::unique_ptr<Session>>;

}  // namespace ferry::daemon
