// Bulk host copies for the staged path: memcpy with non-temporal (streaming) stores.
//
// A staged byte crosses host memory several times: the client reads it, writes it into a pool
// buffer, and the copy engine reads it again (the other way round for device to host). A plain
// memcpy below glibc's non-temporal threshold (several MiB, from the cache size) also reads
// every destination line before writing it; streaming stores skip that and the cache. Which
// wins depends on the host (see StagedCopyMode). Thread-safe; no state.
#pragma once

#include <cstddef>

namespace ferry::detail {

// Copies n bytes; the ranges must not overlap. Falls back to memcpy where the CPU has no
// streaming stores (not x86-64) and for small copies.
void StreamingCopy(void* dst, const void* src, size_t n);

// How the staged path copies, by direction, from FERRY_STAGED_COPY: "streaming" both ways (unset
// or unknown: the default), "memcpy" both ways, or "streaming-out": streaming stores only when
// copying out of a pool buffer into the caller's memory (device to host). On the H200's host,
// end to end (runs 17 and 18 of docs/measurements/h200-poll-2026-12-03.txt), streaming stores beat memcpy by 10 to 20
// GB/s device to host at 256 MiB and 1 GiB (the caller's pages are not read for ownership) and by
// 3 to 6 GB/s host to device at 64 MiB, although the copy alone was no faster there.
struct StagedCopyMode {
  bool streaming_in = false;   // into a pool buffer (host to device)
  bool streaming_out = false;  // out of a pool buffer (device to host)
};
StagedCopyMode StagedCopyModeFrom(const char* value);

// The staged path's copies, into a pool buffer and out of one, as FERRY_STAGED_COPY says (read
// once per process).
void StagedCopyIn(void* pool_dst, const void* src, size_t n);
void StagedCopyOut(void* dst, const void* pool_src, size_t n);

}  // namespace ferry::detail
