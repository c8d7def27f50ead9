/* The C API from C: connect, buffers, copies and block lists both ways with random data into
 * poisoned destinations (every byte checked), the staged path, and errors with their messages.
 * usage: c_api_test SOCKET; exit 0 when every check passed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry/ferry.h"

static const char kProgram[] = "c_api_test";
#include "c_check.h"

static void fill(unsigned char* p, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; ++i) {
    seed = seed * 1103515245u + 12345u;
    p[i] = (unsigned char)(seed >> 16);
  }
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s SOCKET\n", argv[0]);
    return 64;
  }
  ferry_connect_options bad = {0};
  ferry_client* c = NULL;
  CHECK(ferry_connect(&bad, &c) == FERRY_INVALID_ARGUMENT, "unset struct_size must be refused");
  CHECK(strstr(ferry_last_error(), "struct_size") != NULL, "the message names the field");

  ferry_connect_options o = {sizeof o, argv[1], "c-api-test", 0};
  ferry_status st = ferry_connect(&o, &c);
  CHECK(st == FERRY_OK, "connect");
  if (st != FERRY_OK) return 1;
  /* The GPU to copy to (ferry 0.3's fields): a negative ordinal is refused before connecting; on
     the host backend (one simulated GPU here) a GPU ferryd does not serve is refused by name. */
  ferry_connect_options neg = {sizeof neg, argv[1], "c-api-test", 0, 1, -1};
  ferry_client* c2 = NULL;
  CHECK(ferry_connect(&neg, &c2) == FERRY_INVALID_ARGUMENT, "a negative device is refused");
  if (ferry_backend(c) == 0) {
    ferry_connect_options far = {sizeof far, argv[1], "c-api-test", 0, 1, 9};
    CHECK(ferry_connect(&far, &c2) == FERRY_NOT_FOUND, "a GPU ferryd does not serve is refused");
    CHECK(strstr(ferry_last_error(), "host-gpu-9") != NULL, "the refusal names the GPU");
    ferry_connect_options gpu0 = {sizeof gpu0, argv[1], "c-api-test", 0, 1, 0};
    CHECK(ferry_connect(&gpu0, &c2) == FERRY_OK, "GPU 0 named");
    ferry_disconnect(c2);
  }
  const size_t n = (3u << 20) + 11;
  ferry_host_buffer* h = NULL;
  ferry_device_region* d = NULL;
  CHECK(ferry_host_alloc(c, n, &h) == FERRY_OK, "host alloc");
  CHECK(ferry_device_alloc(c, n, &d) == FERRY_OK, "device alloc");
  if (!h || !d) return 1;
  unsigned char* hp = ferry_host_data(h);
  unsigned char* want = malloc(n);
  fill(want, n, 42);
  memcpy(hp, want, n);
  if (ferry_backend(c) == 0) memset(ferry_device_data(d), 0xA5, n);  /* host backend: device memory is visible */

  ferry_copy_options co = {sizeof co, FERRY_PRIORITY_BULK, 0};
  ferry_transfer* t = NULL;
  CHECK(ferry_copy(c, FERRY_HOST_TO_DEVICE, h, 0, d, 0, n, &co, &t) == FERRY_OK, "h2d");
  CHECK(ferry_transfer_wait(t, 10000000) == FERRY_OK, "h2d wait");
  ferry_transfer_free(t);
  memset(hp, 0x5A, n);
  CHECK(ferry_copy(c, FERRY_DEVICE_TO_HOST, h, 0, d, 0, n, NULL, &t) == FERRY_OK, "d2h");
  int done = 0;
  while (ferry_transfer_poll(t, &done) == FERRY_OK && !done) {
  }
  CHECK(done == 1, "poll reports done");
  ferry_transfer_free(t);
  CHECK(memcmp(hp, want, n) == 0, "bytes came back different");

  /* Two halves back, waited on together (on the host backend a stream wait waits on the host). */
  memset(hp, 0x5A, n);
  ferry_copy_options waitable = {sizeof waitable, FERRY_PRIORITY_BULK, 1};
  ferry_transfer* halves[2] = {NULL, NULL};
  CHECK(ferry_copy(c, FERRY_DEVICE_TO_HOST, h, 0, d, 0, n / 2, &waitable, &halves[0]) == FERRY_OK, "d2h first half");
  CHECK(ferry_copy(c, FERRY_DEVICE_TO_HOST, h, n / 2, d, n / 2, n - n / 2, &waitable, &halves[1]) == FERRY_OK,
        "d2h second half");
  CHECK(ferry_stream_wait_all(c, halves, 2, NULL) == FERRY_OK, "stream wait on both halves");
  if (ferry_backend(c) == 0) CHECK(memcmp(hp, want, n) == 0, "a batch's stream wait returned before its bytes arrived");
  ferry_transfer_free(halves[0]);
  ferry_transfer_free(halves[1]);

  /* Pageable memory through the staged path. */
  unsigned char* pageable = malloc(n);
  unsigned char* back = malloc(n);
  fill(pageable, n, 7);
  memset(back, 0xA5, n);
  ferry_staged_copy_options so = {sizeof so, 1u << 20, 3, FERRY_PRIORITY_BULK};
  CHECK(ferry_copy_staged(c, FERRY_HOST_TO_DEVICE, pageable, d, 0, n, &so) == FERRY_OK, "staged h2d");
  CHECK(ferry_copy_staged(c, FERRY_DEVICE_TO_HOST, back, d, 0, n, NULL) == FERRY_OK, "staged d2h, policy settings");
  CHECK(memcmp(back, pageable, n) == 0, "staged bytes came back different");
  ferry_staged_copy_options latency = {sizeof latency, 0, 0, FERRY_PRIORITY_LATENCY};
  memset(back, 0xA5, n);
  CHECK(ferry_copy_staged(c, FERRY_DEVICE_TO_HOST, back, d, 0, n, &latency) == FERRY_OK,
        "staged d2h, latency priority, policy settings");
  CHECK(memcmp(back, pageable, n) == 0, "staged bytes at latency priority came back different");

  /* A block list: 200 blocks of 4097 bytes (a list in a pool buffer), shuffled destinations, then
   * back with per-block lengths (odd blocks copy 100 bytes). Every byte of the destination checked. */
  {
    enum { kBlocks = 200, kBlockBytes = 4097 };
    uint32_t src[kBlocks], dst[kBlocks], lengths[kBlocks];
    for (uint32_t i = 0; i < kBlocks; ++i) {
      src[i] = i;
      dst[i] = (i * 7u + 3u) % kBlocks; /* 7 and 200 are coprime: a permutation */
      lengths[i] = (i % 2) ? 100u : kBlockBytes;
    }
    const size_t region = (size_t)kBlocks * kBlockBytes;
    fill(hp, region, 99);
    memcpy(want, hp, region);
    ferry_block_list bl = {sizeof bl, kBlockBytes, kBlocks, src, dst, NULL};
    if (ferry_backend(c) == 0) {
      unsigned char* dp = ferry_device_data(d);
      memset(dp, 0xA5, n);
      CHECK(ferry_copy_blocks(c, FERRY_HOST_TO_DEVICE, h, 0, d, 0, &bl, &waitable, &t) == FERRY_OK, "blocks h2d");
      CHECK(ferry_transfer_stream_wait(t, NULL) == FERRY_OK, "blocks h2d stream wait");
      ferry_transfer_free(t);
      int ok = 1;
      for (uint32_t i = 0; i < kBlocks; ++i) {
        ok &= memcmp(dp + (size_t)dst[i] * kBlockBytes, want + (size_t)src[i] * kBlockBytes, kBlockBytes) == 0;
      }
      for (size_t i = region; i < n; ++i) ok &= dp[i] == 0xA5;
      CHECK(ok, "block list h2d: blocks differ, or bytes past the blocks lost their poison");

      /* Back: device block dst[i] to host block src[i], lengths[i] bytes. */
      memset(hp, 0x5A, n);
      ferry_block_list back = {sizeof back, kBlockBytes, kBlocks, dst, src, lengths};
      CHECK(ferry_copy_blocks(c, FERRY_DEVICE_TO_HOST, h, 0, d, 0, &back, NULL, &t) == FERRY_OK, "blocks d2h");
      CHECK(ferry_transfer_wait(t, 10000000) == FERRY_OK, "blocks d2h wait");
      ferry_transfer_free(t);
      ok = 1;
      for (uint32_t i = 0; i < kBlocks; ++i) {
        const unsigned char* got = hp + (size_t)src[i] * kBlockBytes;
        ok &= memcmp(got, want + (size_t)src[i] * kBlockBytes, lengths[i]) == 0;
        for (size_t k = lengths[i]; k < kBlockBytes; ++k) ok &= got[k] == 0x5A;
      }
      for (size_t i = region; i < n; ++i) ok &= hp[i] == 0x5A;
      CHECK(ok, "block list d2h with lengths: blocks differ, or bytes past their lengths lost their poison");
    }
    /* Refused with the block named, nothing submitted. */
    dst[5] = dst[2];
    t = NULL;
    CHECK(ferry_copy_blocks(c, FERRY_HOST_TO_DEVICE, h, 0, d, 0, &bl, NULL, &t) == FERRY_INVALID_ARGUMENT,
          "a repeated destination block");
    CHECK(t == NULL, "no transfer on error");
    CHECK(strstr(ferry_last_error(), "block 5: destination block") != NULL, "the message names the block");
    ferry_block_list unsized = bl;
    unsized.struct_size = 8;
    CHECK(ferry_copy_blocks(c, FERRY_HOST_TO_DEVICE, h, 0, d, 0, &unsized, NULL, &t) == FERRY_INVALID_ARGUMENT,
          "a block list's struct_size below its first size");
    CHECK(strstr(ferry_last_error(), "ferry_block_list.struct_size") != NULL, "the message names the struct");
    ferry_block_list no_src = bl;
    no_src.src = NULL;
    CHECK(ferry_copy_blocks(c, FERRY_HOST_TO_DEVICE, h, 0, d, 0, &no_src, NULL, &t) == FERRY_INVALID_ARGUMENT,
          "a NULL source list");
    CHECK(strstr(ferry_last_error(), "blocks->src") != NULL, "the message names the list");
  }

  /* Errors: a clear status and message, nothing copied. */
  t = NULL;
  {
    /* A pointer inside a device allocation: its whole allocation, at the pointer's offset. */
    unsigned char* base = (unsigned char*)ferry_device_data(d);
    ferry_device_region* inner = NULL;
    size_t offset = 0;
    CHECK(ferry_device_register_allocation(c, base + 100, n - 100, &inner, &offset) == FERRY_OK, "register allocation");
    CHECK(offset == 100 && ferry_device_data(inner) == base, "the allocation's region, at the pointer's offset");
    unsigned char* hp2 = (unsigned char*)ferry_host_data(h);
    fill(hp2, n - 100, 99);
    if (ferry_backend(c) == 0) memset(base, 0xA5, n);
    CHECK(ferry_copy(c, FERRY_HOST_TO_DEVICE, h, 0, inner, offset, n - 100, NULL, &t) == FERRY_OK, "h2d at the offset");
    CHECK(ferry_transfer_wait(t, 10000000) == FERRY_OK, "h2d at the offset: wait");
    ferry_transfer_free(t);
    t = NULL;
    if (ferry_backend(c) == 0) {
      CHECK(memcmp(base + 100, hp2, n - 100) == 0, "bytes at the offset differ");
      for (size_t i = 0; i < 100; ++i) CHECK(base[i] == 0xA5, "wrote before the pointer");
    }
    if (ferry_backend(c) == 0) { /* a CUDA allocation may be rounded up past n */
      ferry_device_region* past = NULL;
      CHECK(ferry_device_register_allocation(c, base + 100, n, &past, &offset) == FERRY_INVALID_ARGUMENT,
            "a range past the allocation is refused");
      CHECK(past == NULL && strstr(ferry_last_error(), "past the end of its allocation") != NULL,
            "no region on error, and the message says why");
    }
    ferry_device_unregister(inner);
  }
  CHECK(ferry_copy(c, FERRY_HOST_TO_DEVICE, h, 1, d, 0, n, NULL, &t) == FERRY_INVALID_ARGUMENT, "range past the buffer");
  CHECK(t == NULL, "no transfer on error");
  CHECK(strstr(ferry_last_error(), "host range") != NULL, "the message says which range");
  CHECK(ferry_copy(NULL, FERRY_HOST_TO_DEVICE, h, 0, d, 0, 1, NULL, &t) == FERRY_INVALID_ARGUMENT, "null client");
  CHECK(ferry_version() != NULL && strlen(ferry_version()) > 0, "version");

  ferry_device_unregister(d);
  ferry_host_free(h);
  ferry_disconnect(c);
  free(want);
  free(pageable);
  free(back);
  if (failures == 0) printf("c_api_test: all checks passed\n");
  return failures == 0 ? 0 : 1;
}
