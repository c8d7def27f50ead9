/* The versioned option structs of ferry.h as first published (ferry 0.1.0), frozen. A program built
 * against these layouts must keep working with every later libferry (tests/c_api_v1_test.c).
 * Never edit this file: when ferry.h's structs grow, these stay as they were. */
#ifndef FERRY_TESTS_C_ABI_V1_H_
#define FERRY_TESTS_C_ABI_V1_H_

#include <stdint.h>

#include "ferry/ferry.h"

typedef struct ferry_v1_connect_options {
  uint32_t struct_size;
  const char* socket_path;
  const char* name;
  uint32_t timeout_ms;
} ferry_v1_connect_options;

typedef struct ferry_v1_copy_options {
  uint32_t struct_size;
  ferry_priority priority;
  uint32_t stream_waitable;
} ferry_v1_copy_options;

typedef struct ferry_v1_staged_copy_options {
  uint32_t struct_size;
  uint64_t chunk_bytes;
  uint32_t threads;
  ferry_priority priority;
} ferry_v1_staged_copy_options;

#endif /* FERRY_TESTS_C_ABI_V1_H_ */
