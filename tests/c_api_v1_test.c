/* ferry.h's promise on versioned structs, from a C program built against the first published
 * layouts (c_abi_v1.h) and run against the current libferry: they are accepted and work; a larger
 * struct from a newer header is accepted when its unknown bytes are zero and refused when not; a
 * struct_size below the first published size is refused with a message that says so.
 * usage: c_api_v1_test SOCKET; exit 0 when every check passed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "c_abi_v1.h"

static const char kProgram[] = "c_api_v1_test";
#include "c_check.h"

/* A copy options struct as a newer ferry.h might have it: the v1 fields, then one this library
 * does not know. */
typedef struct newer_copy_options {
  ferry_v1_copy_options v1;
  uint64_t unknown_option;
} newer_copy_options;

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s SOCKET\n", argv[0]);
    return 64;
  }
  ferry_client* c = NULL;
  ferry_v1_connect_options too_small = {offsetof(ferry_v1_connect_options, timeout_ms), argv[1], "c-api-v1-test", 0};
  CHECK(ferry_connect((const ferry_connect_options*)&too_small, &c) == FERRY_INVALID_ARGUMENT,
        "a struct_size below the first published size must be refused");
  CHECK(strstr(ferry_last_error(), "first published size") != NULL, "the message says why");
  CHECK(c == NULL, "no client on error");

  ferry_v1_connect_options o = {sizeof o, argv[1], "c-api-v1-test", 10000};
  ferry_status st = ferry_connect((const ferry_connect_options*)&o, &c);
  CHECK(st == FERRY_OK, "connect with the v1 struct");
  if (st != FERRY_OK) return 1;

  const size_t n = (1u << 20) + 5;
  ferry_host_buffer* h = NULL;
  ferry_device_region* d = NULL;
  CHECK(ferry_host_alloc(c, n, &h) == FERRY_OK, "host alloc");
  CHECK(ferry_device_alloc(c, n, &d) == FERRY_OK, "device alloc");
  if (!h || !d) return 1;
  unsigned char* hp = ferry_host_data(h);
  for (size_t i = 0; i < n; ++i) hp[i] = (unsigned char)(i * 7 + 1);

  ferry_v1_copy_options co = {sizeof co, FERRY_PRIORITY_LATENCY, 1};
  ferry_transfer* t = NULL;
  CHECK(ferry_copy(c, FERRY_HOST_TO_DEVICE, h, 0, d, 0, n, (const ferry_copy_options*)&co, &t) == FERRY_OK,
        "h2d with the v1 struct");
  CHECK(ferry_transfer_stream_wait(t, NULL) == FERRY_OK, "v1 stream_waitable reached the copy");
  CHECK(ferry_transfer_wait(t, 10000000) == FERRY_OK, "h2d wait");
  ferry_transfer_free(t);

  newer_copy_options newer;
  memset(&newer, 0, sizeof newer);
  newer.v1.struct_size = sizeof newer;
  newer.v1.priority = FERRY_PRIORITY_BULK;
  t = NULL;
  CHECK(ferry_copy(c, FERRY_DEVICE_TO_HOST, h, 0, d, 0, n, (const ferry_copy_options*)&newer, &t) == FERRY_OK,
        "a newer, larger struct whose unknown bytes are zero is accepted");
  CHECK(t != NULL && ferry_transfer_wait(t, 10000000) == FERRY_OK, "its copy completes");
  ferry_transfer_free(t);
  newer.unknown_option = 1;
  t = NULL;
  CHECK(
      ferry_copy(c, FERRY_DEVICE_TO_HOST, h, 0, d, 0, n, (const ferry_copy_options*)&newer, &t) == FERRY_NOT_SUPPORTED,
      "a newer struct that sets an option this library does not have is refused");
  CHECK(strstr(ferry_last_error(), "newer ferry.h") != NULL, "the message says why");
  CHECK(t == NULL, "no transfer on error");
  ferry_v1_copy_options truncated = {sizeof(uint32_t), FERRY_PRIORITY_BULK, 0};
  CHECK(ferry_copy(c, FERRY_DEVICE_TO_HOST, h, 0, d, 0, n, (const ferry_copy_options*)&truncated, &t) ==
            FERRY_INVALID_ARGUMENT,
        "a copy options struct below its first published size is refused");
  CHECK(strstr(ferry_last_error(), "ferry_copy_options.struct_size is 4") != NULL, "the message names the field");
  ferry_v1_copy_options garbage = {1u << 30, FERRY_PRIORITY_BULK, 0};
  CHECK(ferry_copy(c, FERRY_DEVICE_TO_HOST, h, 0, d, 0, n, (const ferry_copy_options*)&garbage, &t) ==
            FERRY_INVALID_ARGUMENT,
        "an implausible struct_size is refused before anything past the struct is read");

  unsigned char* pageable = malloc(n);
  unsigned char* back = malloc(n);
  for (size_t i = 0; i < n; ++i) pageable[i] = (unsigned char)(i * 13 + 3);
  memset(back, 0xA5, n);
  ferry_v1_staged_copy_options so = {sizeof so, 256u << 10, 2, FERRY_PRIORITY_BULK};
  CHECK(
      ferry_copy_staged(c, FERRY_HOST_TO_DEVICE, pageable, d, 0, n, (const ferry_staged_copy_options*)&so) == FERRY_OK,
      "staged h2d with the v1 struct");
  CHECK(ferry_copy_staged(c, FERRY_DEVICE_TO_HOST, back, d, 0, n, (const ferry_staged_copy_options*)&so) == FERRY_OK,
        "staged d2h with the v1 struct");
  CHECK(memcmp(back, pageable, n) == 0, "staged bytes came back different");

  ferry_device_unregister(d);
  ferry_host_free(h);
  ferry_disconnect(c);
  free(pageable);
  free(back);
  if (failures == 0) printf("c_api_v1_test: all checks passed\n");
  return failures == 0 ? 0 : 1;
}
