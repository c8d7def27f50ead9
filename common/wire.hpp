// The ferry wire protocol: the one definition both ferryd and libferry compile against.
//
// Two planes:
//  - control: a SOCK_SEQPACKET Unix socket. Every message is MsgHeader + one fixed-size payload
//    struct; magic, version, type and length are checked on every message. File descriptors
//    (memfds, eventfds) travel as SCM_RIGHTS ancillary data.
//  - data: one shared ring segment per session holding a submission ring (client produces) and a
//    completion ring (daemon produces). Entries are fixed-size and carry offsets, never pointers.
//
// Everything here is trivially copyable and has a fixed layout; sizes are pinned by static_asserts
// so that a change to the layout is a deliberate protocol version bump.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace ferry::wire {

inline constexpr uint32_t kMagic = 0x59525246;  // "FRRY" little-endian
// 2: a kReportWait names the copy it waited for. 3: the ring segment carries the running policy's
// staging settings (kGetStaging is gone); a kReportWait carries only its tag and length.
// 4: block-list copies (kBlocksHostToDevice, kBlocksDeviceToHost: BlockListEntry); an event's
// flag in the ring segment (RegisterEventReply::flag_index, SubmissionEntry::wait_value) that the
// client's stream writes and ferryd's copy streams wait on, on the GPU.
// 5: one ferryd serves several GPUs: a session names its GPU (kUseGpu) before it uses the pool
// or registers anything; kGpuStats answers per GPU.
// 6: ferryd takes the client's waiting bits when it rings the completion doorbell
// (TakeClientWaiting): a client sets them again each time before it sleeps.
// 7: an event's flag may live in device memory ferryd owns and shares with the session
// (RegisterEventReply::flag_place, the memory's fd with the first such reply).
// Frozen in every version, so that two versions can tell each other apart: MsgHeader, the
// kHello payload (HelloRequest) and the ReplyStatus that starts every reply. ferryd answers a
// hello of any version, naming both.
inline constexpr uint16_t kVersion = 7;
inline constexpr size_t kMaxFdsPerMessage = 200;  // below the kernel's SCM_MAX_FD (253)
inline constexpr size_t kNameBytes = 32;
inline constexpr size_t kMessageBytes = 160;
inline constexpr size_t kCudaIpcHandleBytes = 64;  // sizeof(cudaIpcMemHandle_t) == sizeof(cudaIpcEventHandle_t)

enum class MsgType : uint16_t {
  kHello = 1,
  kHelloReply = 2,
  kAllocBuffer = 3,
  kAllocBufferReply = 4,
  kFreeBuffer = 5,
  kRegisterDevice = 7,
  kRegisterDeviceReply = 8,
  kUnregisterDevice = 9,
  kRegisterEvent = 11,
  kRegisterEventReply = 12,
  kSimpleReply = 14,  // answer to requests that return only a status
  kStats = 15,
  kStatsReply = 16,
  kApplyPolicy = 17,  // operator only: carries one fd, the policy file
  kPolicyReply = 18,
  kGetPolicy = 19,    // reply carries one fd: a memfd with the running policy, canonical form
  // 20, 21: kGetStaging, kStagingReply in version 2 (the ring segment carries staging since 3)
  kUseGpu = 22,
  kUseGpuReply = 23,
  kGpuStats = 24,
  kGpuStatsReply = 25,
};

struct MsgHeader {
  uint32_t magic;
  uint16_t version;
  uint16_t type;    // MsgType
  uint32_t length;  // payload bytes after the header; must equal sizeof(payload struct of type)
  uint32_t seq;     // echoed in the reply
};
static_assert(sizeof(MsgHeader) == 16);

// Every reply starts with this.
// ReplyStatus::flags of a hello's refusal: ferryd is still starting (building its pool) and will
// take the hello once it is ready; message says how far it got.
inline constexpr uint32_t kReplyStarting = 1;
struct ReplyStatus {
  int32_t code;  // ferry::Code
  uint32_t flags;  // kReplyStarting; other bits 0
  char message[kMessageBytes];  // NUL-terminated when code != 0
};
static_assert(sizeof(ReplyStatus) == 168);

enum class BackendKind : uint32_t { kHost = 0, kCuda = 1 };

struct HelloRequest {
  uint32_t client_version;  // kVersion of the client's build
  uint32_t flags;
  char name[kNameBytes];  // free-form client name for logs; NUL-padded
};
static_assert(sizeof(HelloRequest) == 40);
// Carries 3 fds: ring segment memfd, submit doorbell eventfd, completion doorbell eventfd.
struct HelloReply {
  ReplyStatus status;
  uint64_t session_id;
  uint32_t backend;  // BackendKind
  int32_t device_ordinal;
  uint32_t sq_entries;
  uint32_t cq_entries;
  uint64_t ring_bytes;
  uint64_t pool_bytes;
  uint64_t slab_bytes;
  uint64_t session_quota_bytes;
};
static_assert(sizeof(HelloReply) == 224);

// The GPU a session copies to, named right after the hello, before the session takes pool
// memory or registers device memory or events (its buffers come from the pool of the GPU's NUMA
// node; its device memory must be on that GPU, which ferryd checks from the memory itself).
// A session that names none copies to ferryd's first GPU.
inline constexpr size_t kGpuUuidBytes = 16;
inline constexpr size_t kGpuTextBytes = 48;
struct UseGpuRequest {
  int32_t ordinal;   // host backend: the simulated GPU; cuda: the client's ordinal (for messages only)
  uint32_t reserved;
  uint8_t uuid[kGpuUuidBytes];  // cuda: the GPU's UUID (cudaDeviceProp::uuid); host backend: zeros
};
static_assert(sizeof(UseGpuRequest) == 24);
struct UseGpuReply {
  ReplyStatus status;
  uint32_t gpu;        // ferryd's index of the GPU (0 .. gpu_count - 1)
  int32_t numa_node;   // where the session's pool memory lives; -1: not known
  char uuid[kGpuTextBytes];  // "GPU-..."; NUL-terminated
};
static_assert(sizeof(UseGpuReply) == 224);

struct AllocBufferRequest {
  uint64_t size;
};
static_assert(sizeof(AllocBufferRequest) == 8);
// Carries slab_count fds, the memfds of slabs first_slab .. first_slab + slab_count - 1.
// The buffer lives at pool_offset; pool_offset - first_slab * slab_bytes is its offset in the
// mapping of those slabs laid side by side.
struct AllocBufferReply {
  ReplyStatus status;
  uint64_t pool_offset;
  uint64_t size;
  uint32_t first_slab;
  uint32_t slab_count;
};
static_assert(sizeof(AllocBufferReply) == 192);

struct FreeBufferRequest {
  uint64_t pool_offset;
};
static_assert(sizeof(FreeBufferRequest) == 8);

enum class DeviceHandleKind : uint32_t {
  kCudaIpc = 1,      // cudaIpcMemHandle_t of the allocation's base
  kHostMemfd = 2,    // host backend: a sealed memfd (one SCM_RIGHTS fd) simulating device memory
};
struct RegisterDeviceRequest {
  uint32_t kind;  // DeviceHandleKind
  int32_t device_ordinal;
  uint64_t size;  // bytes of the allocation, from its base
  uint8_t handle[kCudaIpcHandleBytes];
};
static_assert(sizeof(RegisterDeviceRequest) == 80);
struct RegisterDeviceReply {
  ReplyStatus status;
  uint32_t region_id;
  uint32_t reserved;
};
static_assert(sizeof(RegisterDeviceReply) == 176);
struct UnregisterDeviceRequest {
  uint32_t region_id;
  uint32_t reserved;
};
static_assert(sizeof(UnregisterDeviceRequest) == 8);

enum class EventHandleKind : uint32_t { kCudaIpc = 1, kHost = 2 };
// RegisterEventRequest::flags: copies will be ordered after this event, so give it a flag (an
// event only signalled by ferryd's copies needs none, and the flags are few).
inline constexpr uint32_t kEventWantsFlag = 1;
// With kEventWantsFlag: the client can map event flags ferryd keeps in device memory
// (RegisterEventReply::flag_place). Without it the session's flags stay in the ring segment, or,
// where ferryd put them on the device already, this event gets none.
inline constexpr uint32_t kEventTakesDeviceFlag = 2;
struct RegisterEventRequest {
  uint32_t kind;  // EventHandleKind
  uint32_t flags;  // kEventWantsFlag; other bits 0
  uint8_t handle[kCudaIpcHandleBytes];
};
static_assert(sizeof(RegisterEventRequest) == 72);
// flag_index: the event's word in the ring segment's flag area (EventFlags), or kNoFlag. The
// client's stream writes its n-th record's number there (n, mod 2^32) when it records the event;
// a copy ordered after the event names the number it waits for (SubmissionEntry::wait_value).
// flag_place says where that word is: kFlagInRing, the ring segment's flag area; or
// kFlagOnDevice, word flag_index of device memory ferryd allocated for the session's flags, on
// its GPU (a wait on a device word costs the engines less than one on a host word). The reply
// that first names kFlagOnDevice carries that memory as one fd (a CUDA shareable handle of
// flag_memory_bytes, zeroed), which the client maps and writes its flags into from then on.
inline constexpr uint32_t kNoFlag = 0xffffffffu;
inline constexpr uint32_t kFlagInRing = 0;
inline constexpr uint32_t kFlagOnDevice = 1;
struct RegisterEventReply {
  ReplyStatus status;
  uint32_t event_id;
  uint32_t flag_index;
  uint32_t flag_place;         // kFlagInRing or kFlagOnDevice
  uint32_t reserved;           // 0
  uint64_t flag_memory_bytes;  // with the fd: the size of the device memory it shares; else 0
};
static_assert(sizeof(RegisterEventReply) == 192);

struct SimpleReply {
  ReplyStatus status;
};
static_assert(sizeof(SimpleReply) == 168);

struct StatsRequest {
  uint32_t reserved;
};
static_assert(sizeof(StatsRequest) == 4);
struct StatsReply {
  ReplyStatus status;
  uint64_t sessions;
  uint64_t copies_completed;
  uint64_t bytes_h2d;
  uint64_t bytes_d2h;
  uint64_t pool_bytes;
  uint64_t pool_free_bytes;
  uint64_t evictions;
  uint64_t rejected;
  uint32_t backend;
  uint32_t reserved;
};
static_assert(sizeof(StatsReply) == 240);  // reserved: the GPUs ferryd serves (kGpuStats)

struct GpuStatsRequest {
  uint32_t gpu;  // 0 .. the count StatsReply::reserved gives
  uint32_t reserved;
};
static_assert(sizeof(GpuStatsRequest) == 8);
struct GpuStatsReply {
  ReplyStatus status;
  int32_t ordinal;    // ferryd's CUDA ordinal (host backend: the simulated GPU)
  int32_t numa_node;  // -1: not known
  char uuid[kGpuTextBytes];
  char name[kGpuTextBytes];
  uint64_t sessions;  // sessions copying to it
  uint64_t copies_completed;
  uint64_t bytes_h2d;
  uint64_t bytes_d2h;
  uint64_t pool_bytes;       // of the pool on its NUMA node (shared with the node's other GPUs)
  uint64_t pool_free_bytes;
};
static_assert(sizeof(GpuStatsReply) == 320);

struct ApplyPolicyRequest {
  char source[96];   // the file's name, for error messages and the daemon's log
  uint32_t dry_run;  // 1: validate only
  uint32_t reserved;
};
static_assert(sizeof(ApplyPolicyRequest) == 104);
inline constexpr uint32_t kPolicyFormatCanonical = 0;  // "key: value" lines, what the hash covers
inline constexpr uint32_t kPolicyFormatYaml = 1;       // a policy file that parses back to the same policy
struct GetPolicyRequest {
  uint32_t format;  // kPolicyFormat*
};
static_assert(sizeof(GetPolicyRequest) == 4);
struct PolicyReply {
  ReplyStatus status;
  char name[64];
  char hash[32];           // of the policy now running (after an apply: the new one)
  char previous_hash[32];  // after an apply: the one it replaced
};
static_assert(sizeof(PolicyReply) == 296);

// Which payload struct belongs to a type, so both sides check length the same way.
template <MsgType T>
struct PayloadOf;
template <> struct PayloadOf<MsgType::kHello> { using type = HelloRequest; };
template <> struct PayloadOf<MsgType::kHelloReply> { using type = HelloReply; };
template <> struct PayloadOf<MsgType::kAllocBuffer> { using type = AllocBufferRequest; };
template <> struct PayloadOf<MsgType::kAllocBufferReply> { using type = AllocBufferReply; };
template <> struct PayloadOf<MsgType::kFreeBuffer> { using type = FreeBufferRequest; };
template <> struct PayloadOf<MsgType::kRegisterDevice> { using type = RegisterDeviceRequest; };
template <> struct PayloadOf<MsgType::kRegisterDeviceReply> { using type = RegisterDeviceReply; };
template <> struct PayloadOf<MsgType::kUnregisterDevice> { using type = UnregisterDeviceRequest; };
template <> struct PayloadOf<MsgType::kRegisterEvent> { using type = RegisterEventRequest; };
template <> struct PayloadOf<MsgType::kRegisterEventReply> { using type = RegisterEventReply; };
template <> struct PayloadOf<MsgType::kSimpleReply> { using type = SimpleReply; };
template <> struct PayloadOf<MsgType::kStats> { using type = StatsRequest; };
template <> struct PayloadOf<MsgType::kStatsReply> { using type = StatsReply; };
template <> struct PayloadOf<MsgType::kApplyPolicy> { using type = ApplyPolicyRequest; };
template <> struct PayloadOf<MsgType::kGetPolicy> { using type = GetPolicyRequest; };
template <> struct PayloadOf<MsgType::kPolicyReply> { using type = PolicyReply; };
template <> struct PayloadOf<MsgType::kUseGpu> { using type = UseGpuRequest; };
template <> struct PayloadOf<MsgType::kUseGpuReply> { using type = UseGpuReply; };
template <> struct PayloadOf<MsgType::kGpuStats> { using type = GpuStatsRequest; };
template <> struct PayloadOf<MsgType::kGpuStatsReply> { using type = GpuStatsReply; };

// Expected payload length for a type; 0 for an unknown type.
size_t PayloadLength(MsgType type);

// ---------------------------------------------------------------------------------------------
// Data plane: the session ring segment.

enum class Opcode : uint16_t {
  kNop = 0,
  kHostToDevice = 1,
  kDeviceToHost = 2,
  // The client was blocked `length` ns waiting for its copy `user_tag` (a copy of this session,
  // submitted recently): exposed copy time, for metrics. Once per copy; a wait longer than the
  // copy can have existed, or for a tag ferryd does not know, is refused and counted. Every
  // other field is 0 (ferryd knows the copy's direction itself). No completion is sent for it.
  kReportWait = 3,
  // A block list: this entry names the copy's two regions and its ordering; the next slot holds
  // a BlockListEntry, and (flags & kBlockListInline) the slots after that hold the list itself.
  // The host region is [pool_offset, pool_offset + length) in a buffer of the session, the device
  // region [device_offset, device_offset + BlockListEntry::device_bytes) of region_id. Block k of
  // a region lies at k * block_bytes from its start. One completion for the list; its bytes are
  // the sum of the blocks' lengths.
  kBlocksHostToDevice = 4,
  kBlocksDeviceToHost = 5,
};
// SubmissionEntry::flags of a block list.
inline constexpr uint32_t kBlockListInline = 1;  // the list follows in the ring (inline_slots)
enum class Priority : uint16_t { kBulk = 0, kLatency = 1 };

inline constexpr uint32_t kNoEvent = 0;

struct SubmissionEntry {
  uint64_t user_tag;         // echoed in the completion
  uint16_t opcode;           // Opcode
  uint16_t priority;         // Priority
  uint32_t flags;            // reserved, must be 0
  uint64_t pool_offset;      // host side: offset in the daemon's pool
  uint64_t length;           // bytes
  uint64_t device_offset;    // device side: offset from the region's base
  uint32_t region_id;        // from RegisterDeviceReply
  uint32_t wait_event_id;    // kNoEvent or a registered event: start after its last record
  uint32_t signal_event_id;  // kNoEvent or a registered event: recorded when the copy is done
  uint32_t wait_value;       // with wait_event_id: the record it waits for (see RegisterEventReply)
};
static_assert(sizeof(SubmissionEntry) == 56);

// The slot after a block list's SubmissionEntry. The list is block_count source indices, then
// block_count destination indices, then (list_flags & kBlockListLengths) block_count lengths, all
// uint32_t: block i copies lengths[i] (else block_bytes) bytes from source block src[i] to
// destination block dst[i]. The source is the host region for kBlocksHostToDevice, the device
// region for kBlocksDeviceToHost. The list lies in inline_slots ring slots after this one
// (kBlockListInline), or at list_pool_offset in a buffer of the session, which the client leaves
// untouched until the copy completes (ferryd reads it once, when it reads the entry).
inline constexpr uint32_t kBlockListLengths = 1;
inline constexpr uint32_t kMaxBlocksPerList = 262144;
inline constexpr uint32_t kMaxInlineListSlots = 16;
struct BlockListEntry {
  uint64_t device_bytes;      // the device region's length
  uint64_t block_bytes;       // the blocks' stride in both regions, and their length unless lengths
  uint64_t list_pool_offset;  // 0 when inline
  uint64_t list_bytes;        // BlockListBytes(block_count, list_flags)
  uint32_t block_count;       // 1 .. kMaxBlocksPerList
  uint32_t list_flags;        // kBlockListLengths
  uint32_t inline_slots;      // with kBlockListInline: InlineListSlots(list_bytes); else 0
  uint32_t reserved[3];
};
static_assert(sizeof(BlockListEntry) == 56);
constexpr uint64_t BlockListBytes(uint32_t block_count, uint32_t list_flags) {
  return uint64_t{block_count} * sizeof(uint32_t) * ((list_flags & kBlockListLengths) ? 3 : 2);
}
constexpr uint32_t InlineListSlots(uint64_t list_bytes) {
  return static_cast<uint32_t>((list_bytes + sizeof(SubmissionEntry) - 1) / sizeof(SubmissionEntry));
}

enum class CompletionKind : uint16_t {
  kEnqueued = 1,   // on the copy engines; signal event recorded (only sent when one was asked)
  kCompleted = 2,  // done (or failed: see status)
};
struct CompletionEntry {
  uint64_t user_tag;
  int32_t status;    // ferry::Code
  uint16_t kind;     // CompletionKind
  uint16_t reserved;
  uint64_t bytes;
  uint64_t duration_ns;  // daemon-side, from dequeue to completion seen
};
static_assert(sizeof(CompletionEntry) == 32);

// One index of a ring, alone on its cache line so producer and consumer do not false-share.
struct alignas(64) RingIndex {
  std::atomic<uint32_t> value;
};
static_assert(std::atomic<uint32_t>::is_always_lock_free);

// How the client stages pageable memory (Client::CopyStaged), as the running policy says.
// ferryd writes it before the hello reply and again on every policy switch; it never reads it
// back. A seqlock: `generation` is odd while ferryd writes, so a reader retries until it reads
// the same even generation before and after the fields.
struct alignas(64) StagingSettings {
  std::atomic<uint32_t> generation;
  std::atomic<uint32_t> threads;
  std::atomic<uint32_t> buffers;
  std::atomic<uint32_t> reserved;
  std::atomic<uint64_t> chunk_bytes;
};
static_assert(std::atomic<uint64_t>::is_always_lock_free);

inline constexpr uint32_t kRingMagic = 0x474e4952;  // "RING"
inline constexpr uint32_t kDaemonSleeping = 1;       // daemon_state bit: ring the submit doorbell
inline constexpr uint32_t kClientWaiting = 1;        // client_state bit: ring the completion doorbell
inline constexpr uint32_t kClientWaitingForRoom = 2;  // client_state bit: ... also when reading submissions

// A submitter's look at `daemon_state`, after publishing its tail and a full fence: true when
// ferryd said it sleeps and this caller is the one to ring. It takes the bit, so the
// submissions that follow before ferryd is up and reading (it sets the bit again before it next
// sleeps) make no system call each; the doorbell is an eventfd, so one write wakes ferryd. The
// bit is the client's own ring's: taking it can only cost that client a ring it would have rung.
inline bool TakeDaemonSleeping(std::atomic<uint32_t>& daemon_state) {
  if ((daemon_state.load(std::memory_order_relaxed) & kDaemonSleeping) == 0) return false;
  return (daemon_state.fetch_and(~kDaemonSleeping, std::memory_order_relaxed) & kDaemonSleeping) != 0;
}

// ferryd's look at `client_state`, after publishing what the client waits for (cq_tail for
// kClientWaiting, sq_head for kClientWaitingForRoom) and a full fence: true when one of `wanted`
// is set and ferryd is the one to ring. It takes both bits, since one write wakes every thread
// of the client that sleeps (one sleeps on the eventfd and wakes the others), and each sets its
// bits again before it next sleeps: a client asleep through many of ferryd's turns that post
// completions costs ferryd one system call, not one a turn. Whatever waiting bit the and clears
// is rung for, wanted or not: a room waiter that left between the look and the and leaves the
// completion waiters' bit, and clearing it silently would strand them. The word is the client's:
// a client that sets or clears it at will only gets a wake-up too many or too late.
inline bool TakeClientWaiting(std::atomic<uint32_t>& client_state, uint32_t wanted) {
  constexpr uint32_t kBoth = kClientWaiting | kClientWaitingForRoom;
  if ((client_state.load(std::memory_order_relaxed) & wanted) == 0) return false;
  return (client_state.fetch_and(~kBoth, std::memory_order_relaxed) & kBoth) != 0;
}

// Layout of the ring segment: RingHeader, then sq_entries SubmissionEntry, then cq_entries
// CompletionEntry, then (from the next 4 KiB boundary) the flag area, on pages of its own so
// that each side can register just them with the GPU: the event flags, kEventFlags words of 32
// bits, one per registered event that has one (RegisterEventReply::flag_index), then the done
// words. The daemon writes the geometry
// once and keeps its own copy; it never reads the geometry back from shared memory.
struct RingHeader {
  uint32_t magic;
  uint32_t version;
  uint32_t sq_entries;  // power of two
  uint32_t cq_entries;  // power of two
  RingIndex sq_head;    // written by the daemon
  RingIndex sq_tail;    // written by the client
  RingIndex cq_head;    // written by the client
  RingIndex cq_tail;    // written by the daemon
  RingIndex daemon_state;
  RingIndex client_state;
  StagingSettings staging;
};
static_assert(std::is_standard_layout_v<RingHeader>);
static_assert(sizeof(RingHeader) == 512);

inline constexpr size_t kEventFlags = 1024;
inline constexpr size_t kEventFlagsBytes = kEventFlags * sizeof(uint32_t);
// After the event flags, the done words: once a latency-class copy without an "after" event is
// done, ferryd's copy stream writes its user_tag's low 32 bits into word user_tag % kDoneWords
// (after the copy, fenced behind its data). A client that reads its copy's tag there may take the
// copy as done before its completion arrives; a word another copy overwrote only means waiting
// for the completion. ferryd may write no word at all (the completion always comes).
inline constexpr size_t kDoneWords = 1024;
inline constexpr size_t kFlagAreaBytes = kEventFlagsBytes + kDoneWords * sizeof(uint32_t);
constexpr size_t EventFlagsOffset(uint32_t sq_entries, uint32_t cq_entries) {
  const size_t rings = sizeof(RingHeader) + sq_entries * sizeof(SubmissionEntry) + cq_entries * sizeof(CompletionEntry);
  return (rings + 4095) / 4096 * 4096;
}
constexpr size_t RingSegmentBytes(uint32_t sq_entries, uint32_t cq_entries) {
  return EventFlagsOffset(sq_entries, cq_entries) + kFlagAreaBytes;
}
inline SubmissionEntry* SubmissionEntries(void* seg) {
  return reinterpret_cast<SubmissionEntry*>(static_cast<std::byte*>(seg) + sizeof(RingHeader));
}
inline CompletionEntry* CompletionEntries(void* seg, uint32_t sq_entries) {
  return reinterpret_cast<CompletionEntry*>(static_cast<std::byte*>(seg) + sizeof(RingHeader) +
                                            sq_entries * sizeof(SubmissionEntry));
}
inline uint32_t* EventFlags(void* seg, uint32_t sq_entries, uint32_t cq_entries) {
  return reinterpret_cast<uint32_t*>(static_cast<std::byte*>(seg) + EventFlagsOffset(sq_entries, cq_entries));
}
inline uint32_t* DoneWords(void* seg, uint32_t sq_entries, uint32_t cq_entries) {
  return EventFlags(seg, sq_entries, cq_entries) + kEventFlags;
}

// Ring arithmetic, the same on both sides. Indices run freely (mod 2^32); a ring of a power of
// two entries holds tail - head of them, and index i lives in slot i & (entries - 1).
constexpr uint32_t RingCount(uint32_t head, uint32_t tail) { return tail - head; }
constexpr bool RingFull(uint32_t head, uint32_t tail, uint32_t entries) { return tail - head >= entries; }
constexpr uint32_t RingSlot(uint32_t index, uint32_t entries) { return index & (entries - 1); }
// An index the other side wrote is believable only if it is at most `entries` ahead of ours.
constexpr bool RingIndexPlausible(uint32_t ours, uint32_t theirs, uint32_t entries) { return theirs - ours <= entries; }

}  // namespace ferry::wire
