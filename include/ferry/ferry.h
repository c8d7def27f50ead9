/* libferry's C API, for FFI (Python ctypes/cffi, Rust, Go). A thin layer over the C++ API.
 *
 * Conventions: every function returns a ferry_status (FERRY_OK == 0); on error,
 * ferry_last_error() returns a message for the calling thread, valid until its next ferry call.
 * Option structs are versioned by their first field, struct_size: set it to sizeof the struct
 * you compiled against. Every later libferry accepts a struct_size from the struct's first
 * published size up: fields that an older caller's struct lacks take their defaults (the values a
 * zeroed field means); a larger struct from a newer ferry.h is accepted when the bytes this library
 * does not know are zero, and refused with FERRY_NOT_SUPPORTED when they set an option it does not
 * have. A struct_size below the first published size (or above 4096) is FERRY_INVALID_ARGUMENT.
 * New fields are only ever appended past the struct's last sizeof, never into its padding. */
#ifndef FERRY_FERRY_H_
#define FERRY_FERRY_H_

#include <stddef.h>
#include <stdint.h>

#include "ferry/export.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ferry_status {
  FERRY_OK = 0,
  FERRY_INVALID_ARGUMENT = 1,
  FERRY_NOT_FOUND = 2,
  FERRY_PERMISSION_DENIED = 3,
  FERRY_RESOURCE_EXHAUSTED = 4,
  FERRY_UNAVAILABLE = 5,
  FERRY_TIMEOUT = 6,
  FERRY_PROTOCOL = 7,
  FERRY_DEVICE = 8,
  FERRY_NOT_SUPPORTED = 9,
  FERRY_INTERNAL = 10,
  FERRY_ABORTED = 11
} ferry_status;

typedef enum ferry_direction { FERRY_HOST_TO_DEVICE = 0, FERRY_DEVICE_TO_HOST = 1 } ferry_direction;
typedef enum ferry_priority { FERRY_PRIORITY_BULK = 0, FERRY_PRIORITY_LATENCY = 1 } ferry_priority;

typedef struct ferry_client ferry_client;
typedef struct ferry_host_buffer ferry_host_buffer;
typedef struct ferry_device_region ferry_device_region;
typedef struct ferry_transfer ferry_transfer;

typedef struct ferry_connect_options {
  uint32_t struct_size;     /* sizeof(ferry_connect_options) */
  const char* socket_path;  /* NULL: $FERRY_SOCKET or /run/ferry/ferryd.sock */
  const char* name;         /* NULL: the program's name */
  uint32_t timeout_ms;      /* 0: 5000 */
  /* The GPU this client copies to (ferry 0.3): with use_device non-zero, the CUDA ordinal
     `device` of this process; else this thread's current device. One ferryd serves every GPU of
     a node; a client copies to one, and connects once per GPU it uses. */
  uint32_t use_device;
  int32_t device;
} ferry_connect_options;

typedef struct ferry_copy_options {
  uint32_t struct_size;  /* sizeof(ferry_copy_options) */
  ferry_priority priority;
  uint32_t stream_waitable; /* non-zero: ferry_transfer_stream_wait() allowed */
} ferry_copy_options;

typedef struct ferry_staged_copy_options {
  uint32_t struct_size;  /* sizeof(ferry_staged_copy_options) */
  uint64_t chunk_bytes;  /* 0: what the running policy says */
  uint32_t threads;      /* 0: what the running policy says */
  ferry_priority priority;
} ferry_staged_copy_options;

/* For ferry_copy_blocks: block i copies lengths[i] (NULL lengths: block_bytes) bytes from block
 * src[i] of the source to block dst[i] of the destination; block k of a region lies k * block_bytes
 * from its start. The source is the host side of FERRY_HOST_TO_DEVICE, the device side of
 * FERRY_DEVICE_TO_HOST. 1 to 262144 blocks; no two may share a destination block. */
typedef struct ferry_block_list {
  uint32_t struct_size; /* sizeof(ferry_block_list) */
  uint64_t block_bytes;
  size_t count;
  const uint32_t* src;
  const uint32_t* dst;
  const uint32_t* lengths; /* NULL: every block is block_bytes long */
} ferry_block_list;

FERRY_EXPORT const char* ferry_last_error(void);
FERRY_EXPORT const char* ferry_version(void);

FERRY_EXPORT ferry_status ferry_connect(const ferry_connect_options* options, ferry_client** out);
FERRY_EXPORT void ferry_disconnect(ferry_client* client);
/* 0: host backend (no GPU), 1: cuda */
FERRY_EXPORT int ferry_backend(const ferry_client* client);

FERRY_EXPORT ferry_status ferry_host_alloc(ferry_client* client, size_t bytes, ferry_host_buffer** out);
FERRY_EXPORT void* ferry_host_data(const ferry_host_buffer* buffer);
FERRY_EXPORT size_t ferry_host_size(const ferry_host_buffer* buffer);
FERRY_EXPORT void ferry_host_free(ferry_host_buffer* buffer);

/* device_ptr: a CUDA device pointer (cuda backend) or one from ferry_device_alloc (host backend). */
FERRY_EXPORT ferry_status ferry_device_register(ferry_client* client, void* device_ptr, size_t bytes,
                                                ferry_device_region** out);
/* The region of the whole allocation holding [device_ptr, device_ptr + bytes), registered on first
 * use and cached per allocation (a framework's caching-allocator segment costs one round trip);
 * *offset is where device_ptr lies in it. Free the handle with ferry_device_unregister (the
 * allocation stays registered while the client's cache holds it). */
FERRY_EXPORT ferry_status ferry_device_register_allocation(ferry_client* client, const void* device_ptr, size_t bytes,
                                                           ferry_device_region** out, size_t* offset);
/* Allocates device memory for the daemon's backend and registers it; ferry_device_data() gives its pointer. */
FERRY_EXPORT ferry_status ferry_device_alloc(ferry_client* client, size_t bytes, ferry_device_region** out);
FERRY_EXPORT void* ferry_device_data(const ferry_device_region* region);
FERRY_EXPORT void ferry_device_unregister(ferry_device_region* region);

FERRY_EXPORT ferry_status ferry_copy(ferry_client* client, ferry_direction direction, ferry_host_buffer* host,
                                     size_t host_offset, ferry_device_region* device, size_t device_offset, size_t bytes,
                                     const ferry_copy_options* options /* may be NULL */, ferry_transfer** out);
/* Copies a list of blocks as one copy, one completion: the host region is host from host_offset to
 * its end, the device region device from device_offset to its end; ferryd checks every index
 * against both before any byte moves. The list is copied before this returns. */
FERRY_EXPORT ferry_status ferry_copy_blocks(ferry_client* client, ferry_direction direction, ferry_host_buffer* host,
                                            size_t host_offset, ferry_device_region* device, size_t device_offset,
                                            const ferry_block_list* blocks,
                                            const ferry_copy_options* options /* may be NULL */, ferry_transfer** out);
/* Copies between any host memory (pageable) and device memory through pool buffers, with
 * client threads staging chunks while ferryd moves them; blocks until done. */
FERRY_EXPORT ferry_status ferry_copy_staged(ferry_client* client, ferry_direction direction, void* host,
                                            ferry_device_region* device, size_t device_offset, size_t bytes,
                                            const ferry_staged_copy_options* options /* may be NULL */);
/* *done = 1 once complete; returns the copy's error if it failed. */
FERRY_EXPORT ferry_status ferry_transfer_poll(ferry_transfer* transfer, int* done);
FERRY_EXPORT ferry_status ferry_transfer_wait(ferry_transfer* transfer, uint64_t timeout_us);
FERRY_EXPORT ferry_status ferry_transfer_stream_wait(ferry_transfer* transfer, void* cuda_stream);
/* Makes cuda_stream wait for every one of count transfers (all of this client): one pair of
 * timing events for the batch instead of one pair each, and one exposed-time report. */
FERRY_EXPORT ferry_status ferry_stream_wait_all(ferry_client* client, ferry_transfer* const* transfers,
                                                size_t count, void* cuda_stream);
FERRY_EXPORT void ferry_transfer_free(ferry_transfer* transfer);

#ifdef __cplusplus
}
#endif

#endif /* FERRY_FERRY_H_ */
