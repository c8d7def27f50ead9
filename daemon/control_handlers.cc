// The control requests of a session that said hello: buffers, device regions, events, stats,
// staging settings and policies (Sessions, declared in sessions.hpp).
#include <unistd.h>

#include <cerrno>
#include <vector>

#include "common/log.hpp"
#include "daemon/fd_usage.hpp"
#include "daemon/sessions.hpp"

namespace ferry::daemon {

// Queued replies hold dup'd fds (an AllocBuffer reply up to kMaxFdsPerMessage), so requests
// whose reply carries fds are refused while replies wait for the client to read them: the
// fds ferryd holds for a client that does not read stay bounded by one reply's.
Status Sessions::RefuseFdsWhileRepliesWait(const Session& s) {
  if (s.outbound.empty()) return Status::Ok();
  Status st = ResourceExhausted(std::to_string(s.outbound.size()) +
                                " replies are waiting for this client to read them; read them, then ask again");
  svc_.rejections.Count(st);
  return st;
}

void Sessions::HandleAlloc(Session& s, uint32_t seq, const wire::AllocBufferRequest& req) {
  wire::AllocBufferReply r{};
  if (Status waiting = RefuseFdsWhileRepliesWait(s); !waiting.ok()) {
    r.status = ToWire(waiting);
    return Reply(s, wire::MsgType::kAllocBufferReply, seq, r);
  }
  if (s.arena->buffer_count() >= config_.limits.buffers_per_session) {
    const Status st = ResourceExhausted("this session already holds " + std::to_string(s.arena->buffer_count()) +
                                        " buffers (limits.buffers_per_session): free some first");
    r.status = ToWire(st);
    svc_.rejections.Count(st);
    return Reply(s, wire::MsgType::kAllocBufferReply, seq, r);
  }
  // One reply carries an fd per slab the buffer spans.
  auto a = s.arena->Allocate(req.size, wire::kMaxFdsPerMessage);
  UpdatePoolCounters(svc_.pool, svc_.counters);  // slabs may be the session's now, refused or not
  if (!a.ok()) {
    r.status = ToWire(a.status());
    svc_.rejections.Count(a.status());
    return Reply(s, wire::MsgType::kAllocBufferReply, seq, r);
  }
  // Fresh descriptions, closed once sent: the client's (and whoever it passes them to) are the
  // only ones outside ferryd, which is what the quarantine's probe counts.
  std::vector<UniqueFd> grants;
  std::vector<int> fds;
  for (uint32_t i = 0; i < a->slab_count; ++i) {
    auto fd = svc_.pool.OpenForClient(a->first_slab + i);
    if (!fd.ok()) {
      s.arena->Free(a->pool_offset).ok();
      r.status = ToWire(fd.status());
      return Reply(s, wire::MsgType::kAllocBufferReply, seq, r);
    }
    fds.push_back(fd->get());
    grants.push_back(std::move(*fd));
  }
  svc_.counters.buffers_allocated++;
  r.status = ToWire(Status::Ok());
  r.pool_offset = a->pool_offset;
  r.size = a->size;
  r.first_slab = a->first_slab;
  r.slab_count = a->slab_count;
  Reply(s, wire::MsgType::kAllocBufferReply, seq, r, fds.data(), fds.size());
}

void Sessions::HandleRegisterDevice(Session& s, uint32_t seq, const wire::RegisterDeviceRequest& req, UniqueFd fd) {
  wire::RegisterDeviceReply r{};
  auto refuse = [&](const Status& st) {
    r.status = ToWire(st);
    svc_.rejections.Count(st);
    Reply(s, wire::MsgType::kRegisterDeviceReply, seq, r);
  };
  // Each region is a mapping or a device handle in ferryd: bounded per session and per uid, so
  // that no client can use up the process's map count (vm.max_map_count) or fds for the others.
  const Limits& lim = config_.limits;
  if (s.regions.size() >= lim.regions_per_session) {
    return refuse(ResourceExhausted("this session already has " + std::to_string(s.regions.size()) +
                                    " device regions (limits.regions_per_session): unregister some first"));
  }
  uint64_t of_uid = 0;
  for (auto& [id, sp] : svc_.map) {
    if (sp->peer.uid == s.peer.uid) of_uid += sp->regions.size();
  }
  if (of_uid >= lim.regions_per_uid) {
    return refuse(ResourceExhausted("uid " + std::to_string(s.peer.uid) + " already has " + std::to_string(of_uid) +
                                    " device regions over all its sessions (limits.regions_per_uid): unregister "
                                    "some first"));
  }
  // Opened by the session's GPU, whose backend checks that the memory is on it (asked of the
  // driver, not of the client).
  auto region = svc_.backend.OpenDeviceRegionOn(s.gpu, req, std::move(fd));
  if (!region.ok()) {
    if (region.status().code() == Code::kResourceExhausted) {
      FERRY_LOG(kWarning) << "session " << s.id << " '" << s.name << "' (uid " << s.peer.uid
                          << "): cannot open a device region: " << region.status().message() << " (" << FdUsage()
                          << ")";
    }
    return refuse(region.status());
  }
  uint32_t id = s.next_region_id++;
  s.regions[id].region = std::move(*region);
  r.status = ToWire(Status::Ok());
  r.region_id = id;
  Reply(s, wire::MsgType::kRegisterDeviceReply, seq, r);
}

void Sessions::HandleUnregister(Session& s, uint32_t seq, const wire::UnregisterDeviceRequest& req) {
  auto it = s.regions.find(req.region_id);
  if (it == s.regions.end() || it->second.unregistering) {
    return ReplySimple(s, seq, NotFound("no device region " + std::to_string(req.region_id)));
  }
  if (it->second.in_flight > 0) {
    it->second.unregistering = true;
  } else {
    s.regions.erase(it);
  }
  ReplySimple(s, seq, Status::Ok());
}

void Sessions::HandleRegisterEvent(Session& s, uint32_t seq, const wire::RegisterEventRequest& req) {
  wire::RegisterEventReply r{};
  if (s.events.size() >= config_.limits.events_per_session) {
    r.status = ToWire(ResourceExhausted("this session already has " + std::to_string(s.events.size()) +
                                        " events (limits.events_per_session)"));
    svc_.rejections.Count(RejectReason::kExhausted);
    return Reply(s, wire::MsgType::kRegisterEventReply, seq, r);
  }
  if ((req.flags & ~(wire::kEventWantsFlag | wire::kEventTakesDeviceFlag)) != 0) {
    r.status = ToWire(InvalidArgument("unknown event flags " + std::to_string(req.flags)));
    svc_.rejections.Count(RejectReason::kProtocol);
    return Reply(s, wire::MsgType::kRegisterEventReply, seq, r);
  }
  auto ev = svc_.backend.OpenEventOn(s.gpu, req);
  if (!ev.ok()) {
    r.status = ToWire(ev.status());
    return Reply(s, wire::MsgType::kRegisterEventReply, seq, r);
  }
  uint32_t id = s.next_event_id++;
  s.events[id] = std::move(*ev);
  r.status = ToWire(Status::Ok());
  r.event_id = id;
  // A client that cannot map device flags gets none once the session's are there.
  const bool takes_device = (req.flags & wire::kEventTakesDeviceFlag) != 0;
  const bool flag = (req.flags & wire::kEventWantsFlag) != 0 && (takes_device || s.flag_place != Session::FlagPlace::kDevice);
  r.flag_index = flag ? AssignEventFlag(s, id) : wire::kNoFlag;
  UniqueFd shared;  // the device flags, with the first reply that names them
  if (r.flag_index != wire::kNoFlag && s.flag_place == Session::FlagPlace::kUndecided) {
    s.flag_place = Session::FlagPlace::kRing;
    if (takes_device) {
      if (auto d = svc_.backend.ShareDeviceFlags(s.gpu, s.id, s.flags); d.ok()) {
        s.flag_place = Session::FlagPlace::kDevice;
        shared = std::move(d->fd);
        r.flag_memory_bytes = d->bytes;
        FERRY_LOG(kDebug) << "session " << s.id << " '" << s.name << "': event flags in device memory (" << d->bytes
                          << " bytes on GPU " << s.gpu << ", shared by fd)";
      } else if (d.status().code() != Code::kNotSupported) {
        FERRY_LOG(kWarning) << "session " << s.id << " '" << s.name << "': its event flags stay in host memory ("
                            << d.status().ToString() << ")";
      }
    }
  }
  r.flag_place = s.flag_place == Session::FlagPlace::kDevice ? wire::kFlagOnDevice : wire::kFlagInRing;
  const int fds[1] = {shared.get()};
  Reply(s, wire::MsgType::kRegisterEventReply, seq, r, shared.valid() ? fds : nullptr, shared.valid() ? 1 : 0);
}

// GPU-side "after": the event gets a flag word, zeroed, when the backend can wait on flags and
// one is left; else kNoFlag, and its "after" copies are handed off on the host. The session's
// flag area was registered with the backend at its hello.
uint32_t Sessions::AssignEventFlag(Session& s, uint32_t event_id) {
  if (!config_.handoff_on_gpu || !svc_.backend.waits_on_flags() || !s.flags_registered ||
      s.next_flag >= wire::kEventFlags) {
    return wire::kNoFlag;
  }
  const uint32_t index = s.next_flag++;
  std::atomic_ref<uint32_t>(s.flags[index]).store(0, std::memory_order_relaxed);
  s.event_flags[event_id] = Session::EventFlag{index};
  return index;
}

void Sessions::HandleStats(Session& s, uint32_t seq) {
  const ServerCounters& c = svc_.counters;
  wire::StatsReply r{};
  r.status = ToWire(Status::Ok());
  r.sessions = c.sessions;
  r.copies_completed = c.copies_completed;
  r.bytes_h2d = c.bytes_h2d;
  r.bytes_d2h = c.bytes_d2h;
  r.pool_bytes = svc_.pool.size();
  r.pool_free_bytes = svc_.pool.free_bytes();
  r.evictions = c.evictions;
  r.rejected = c.rejected;
  r.backend = static_cast<uint32_t>(svc_.backend.kind());
  r.reserved = svc_.backend.gpu_count();
  Reply(s, wire::MsgType::kStatsReply, seq, r);
}

// Before the session uses the pool or registers anything: its buffers are then all near its GPU,
// and everything it registered is on it.
void Sessions::HandleUseGpu(Session& s, uint32_t seq, const wire::UseGpuRequest& req) {
  wire::UseGpuReply r{};
  auto refuse = [&](const Status& st) {
    r.status = ToWire(st);
    svc_.rejections.Count(st);
    Reply(s, wire::MsgType::kUseGpuReply, seq, r);
  };
  // Slabs count, not only live buffers: a new arena would send the old one's slabs (still mapped
  // by the client) to quarantine, outside the session's quota, and the session could take its
  // quota again at every kUseGpu.
  if ((s.arena && (s.arena->buffer_count() != 0 || s.arena->owned_bytes() != 0)) || !s.regions.empty() ||
      !s.events.empty()) {
    return refuse(InvalidArgument("a session names its GPU before it allocates or registers anything"));
  }
  auto gpu = svc_.backend.Find(req);
  if (!gpu.ok()) return refuse(gpu.status());
  svc_.counters.gpu[s.gpu].sessions--;
  s.gpu = *gpu;
  svc_.counters.gpu[s.gpu].sessions++;
  // Its buffers from now on come from the pool part on its GPU's NUMA node (it has none yet;
  // slabs an arena kept go to quarantine as a session's do).
  s.arena = std::make_unique<SessionArena>(svc_.pool, s.id, quota_, s.peer.uid, config_.limits.pool_bytes_per_uid,
                                           svc_.gpu_pool_part[s.gpu]);
  svc_.scheduler.SetGpu(s.id, s.gpu);
  const DeviceInfo& info = svc_.backend.info(s.gpu);
  r.status = ToWire(Status::Ok());
  r.gpu = s.gpu;
  r.numa_node = info.numa_node;
  CopyCString(r.uuid, info.uuid);
  if (svc_.backend.gpu_count() > 1) {
    FERRY_LOG(kInfo) << "session " << s.id << " '" << s.name << "' copies to GPU " << s.gpu << " (" << info.uuid << ")";
  }
  Reply(s, wire::MsgType::kUseGpuReply, seq, r);
}

void Sessions::HandleGpuStats(Session& s, uint32_t seq, const wire::GpuStatsRequest& req) {
  wire::GpuStatsReply r{};
  if (req.gpu >= svc_.backend.gpu_count()) {
    r.status = ToWire(NotFound("no GPU " + std::to_string(req.gpu) + " (ferryd serves " +
                               std::to_string(svc_.backend.gpu_count()) + ")"));
    return Reply(s, wire::MsgType::kGpuStatsReply, seq, r);
  }
  const DeviceInfo& info = svc_.backend.info(req.gpu);
  const GpuCounters& c = svc_.counters.gpu[req.gpu];
  r.status = ToWire(Status::Ok());
  r.ordinal = info.ordinal;
  r.numa_node = info.numa_node;
  CopyCString(r.uuid, info.uuid);
  CopyCString(r.name, info.name);
  r.sessions = c.sessions;
  r.copies_completed = c.copies_completed;
  r.bytes_h2d = c.bytes_h2d;
  r.bytes_d2h = c.bytes_d2h;
  const uint32_t part = svc_.gpu_pool_part[req.gpu];
  r.pool_bytes = svc_.pool.part(part).bytes;
  r.pool_free_bytes = svc_.pool.free_bytes(part);
  Reply(s, wire::MsgType::kGpuStatsReply, seq, r);
}

// Policies change how every client is served: only ferryd's own user (or root) may apply one.
// The file is read and parsed on the policy loader's thread; ReplyPolicyLoaded answers.
void Sessions::HandleApplyPolicy(Session& s, uint32_t seq, const wire::ApplyPolicyRequest& req, UniqueFd fd) {
  wire::PolicyReply r{};
  const std::string source = ReadCString(req.source) + " (ferryctl, pid " + std::to_string(s.peer.pid) + ")";
  auto reply = [&](const Status& st) {
    r.status = ToWire(st);
    CopyCString(r.name, svc_.policy->name);
    CopyCString(r.hash, svc_.policy->Hash());
    Reply(s, wire::MsgType::kPolicyReply, seq, r);
  };
  if (s.peer.uid != 0 && s.peer.uid != ::geteuid()) {
    svc_.rejections.Count(RejectReason::kPermission);
    return reply(PermissionDenied("only ferryd's user or root may apply a policy"));
  }
  if (!fd.valid()) return reply(InvalidArgument("apply-policy carries the policy file as a file descriptor"));
  PolicyLoad load;
  load.fd = std::move(fd);
  load.name = ReadCString(req.source);
  load.session_id = s.id;
  load.seq = seq;
  load.dry_run = req.dry_run != 0;
  load.source = source;
  if (!svc_.policy_loader.Submit(std::move(load))) {
    return reply(ResourceExhausted("ferryd is already reading " + std::to_string(PolicyLoader::kMaxQueued) +
                                   " policy files; try again when they are done"));
  }
}

void Sessions::ReplyPolicyLoaded(const PolicyLoad& load, const std::string& previous_hash) {
  auto it = svc_.map.find(load.session_id);
  if (load.reload || it == svc_.map.end() || it->second->dead) return;  // reloads, and applies whose client has gone
  Session& s = *it->second;
  wire::PolicyReply r{};
  r.status = ToWire(load.status);
  const Policy& named = load.status.ok() ? *load.policy : *svc_.policy;
  CopyCString(r.name, named.name);
  CopyCString(r.hash, named.Hash());
  if (load.status.ok()) CopyCString(r.previous_hash, previous_hash);
  Reply(s, wire::MsgType::kPolicyReply, load.seq, r);
}

void Sessions::HandleGetPolicy(Session& s, uint32_t seq, const wire::GetPolicyRequest& req) {
  wire::PolicyReply r{};
  if (Status waiting = RefuseFdsWhileRepliesWait(s); !waiting.ok()) {
    r.status = ToWire(waiting);
    return Reply(s, wire::MsgType::kPolicyReply, seq, r);
  }
  if (req.format != wire::kPolicyFormatCanonical && req.format != wire::kPolicyFormatYaml) {
    r.status = ToWire(InvalidArgument("unknown policy format " + std::to_string(req.format)));
    return Reply(s, wire::MsgType::kPolicyReply, seq, r);
  }
  const Policy& running = *svc_.policy;
  const std::string text = req.format == wire::kPolicyFormatYaml
                               ? "# running policy " + running.Hash() + ", as a policy file\n" + running.ToYaml()
                               : "# running policy, canonical form\n" + running.Canonical();
  CopyCString(r.name, running.name);
  CopyCString(r.hash, running.Hash());
  auto fd = CreateSealedMemfd("ferry-policy", text.size());
  Status st = fd.ok() ? Status::Ok() : fd.status();
  if (st.ok() && ::pwrite(fd->get(), text.data(), text.size(), 0) != static_cast<ssize_t>(text.size())) {
    st = ErrnoStatus("pwrite", errno);
  }
  r.status = ToWire(st);
  if (!st.ok()) return Reply(s, wire::MsgType::kPolicyReply, seq, r);
  int f = fd->get();
  Reply(s, wire::MsgType::kPolicyReply, seq, r, &f, 1);
}

}  // namespace ferry::daemon
