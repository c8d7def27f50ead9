#include "client/streaming_copy.hpp"

#include <cstdint>
#include <cstdlib>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace ferry::detail {
namespace {

constexpr size_t kMinStreamingBytes = 64 << 10;  // below this the destination may as well stay cached

#if defined(__x86_64__)
// 128 bytes a turn: four 32-byte loads in flight, four 32-byte streaming stores.
__attribute__((target("avx2"))) void StreamAvx2(std::byte* d, const std::byte* s, size_t n) {
  for (; n >= 128; n -= 128, d += 128, s += 128) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 32));
    const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 64));
    const __m256i e = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 96));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d), a);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + 32), b);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + 64), c);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + 96), e);
  }
  if (n > 0) std::memcpy(d, s, n);
}

void StreamSse2(std::byte* d, const std::byte* s, size_t n) {
  for (; n >= 64; n -= 64, d += 64, s += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 32));
    const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 48), e);
  }
  if (n > 0) std::memcpy(d, s, n);
}
#endif

}  // namespace

void StreamingCopy(void* dst, const void* src, size_t n) {
#if defined(__x86_64__)
  if (n >= kMinStreamingBytes) {
    auto* d = static_cast<std::byte*>(dst);
    const auto* s = static_cast<const std::byte*>(src);
    // Streaming stores want an aligned destination: copy the head plainly.
    const size_t head = (64 - reinterpret_cast<uintptr_t>(d) % 64) % 64;
    std::memcpy(d, s, head);
    static const bool avx2 = __builtin_cpu_supports("avx2");
    if (avx2) {
      StreamAvx2(d + head, s + head, n - head);
    } else {
      StreamSse2(d + head, s + head, n - head);
    }
    _mm_sfence();  // the stores are weakly ordered: make them visible before the copy is submitted
    return;
  }
#endif
  std::memcpy(dst, src, n);
}

StagedCopyMode StagedCopyModeFrom(const char* value) {
  constexpr StagedCopyMode kStreaming{.streaming_in = true, .streaming_out = true};
  if (value == nullptr) return kStreaming;
  if (std::strcmp(value, "memcpy") == 0) return {.streaming_in = false, .streaming_out = false};
  if (std::strcmp(value, "streaming-out") == 0) return {.streaming_in = false, .streaming_out = true};
  return kStreaming;
}

namespace {
const StagedCopyMode& ModeFromEnvironment() {
  static const StagedCopyMode mode = StagedCopyModeFrom(std::getenv("FERRY_STAGED_COPY"));
  return mode;
}

void CopyWith(bool streaming, void* dst, const void* src, size_t n) {
  if (streaming) {
    StreamingCopy(dst, src, n);
  } else {
    std::memcpy(dst, src, n);
  }
}
}  // namespace

void StagedCopyIn(void* pool_dst, const void* src, size_t n) {
  CopyWith(ModeFromEnvironment().streaming_in, pool_dst, src, n);
}

void StagedCopyOut(void* dst, const void* pool_src, size_t n) {
  CopyWith(ModeFromEnvironment().streaming_out, dst, pool_src, n);
}

}  // namespace ferry::detail
