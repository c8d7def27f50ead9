// Bulk host copies for the staged path: memcpy with non-temporal (streaming) stores.
//
// A staged byte crosses host memory several times: the client reads it, writes it into a pool
// buffer, and the copy engine reads it again (the other way round for device to host). A plain
// memcpy below glibc's non-temporal threshold (several MiB, from the cache size) also reads
// every destination line before writing it and fills the cache with data nobody reads back;
// streaming stores skip both. Thread-safe; no state.
#pragma once

#include <cstddef>

namespace ferry::detail {

// Copies n bytes; the ranges must not overlap. Falls back to memcpy where the CPU has no
// streaming stores (not x86-64) and for small copies.
void StreamingCopy(void* dst, const void* src, size_t n);

// Which copy the staged path uses: streaming, unless FERRY_STAGED_MEMCPY=1 is set (for A/B runs).
void StagedCopy(void* dst, const void* src, size_t n);

}  // namespace ferry::detail
