// UniqueFd and the small OS primitives ferry's two sides share: memfd segments, mappings,
// eventfd doorbells. Everything that touches a file descriptor goes through here.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "ferry/status.hpp"

namespace ferry {

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { reset(); }
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.release()) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) reset(o.release());
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() { return std::exchange(fd_, -1); }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

// A shared mapping; unmapped on destruction.
class Mapping {
 public:
  Mapping() = default;
  Mapping(void* addr, size_t len) : addr_(addr), len_(len) {}
  ~Mapping() { reset(); }
  Mapping(Mapping&& o) noexcept : addr_(std::exchange(o.addr_, nullptr)), len_(std::exchange(o.len_, 0)) {}
  Mapping& operator=(Mapping&& o) noexcept {
    if (this != &o) {
      reset();
      addr_ = std::exchange(o.addr_, nullptr);
      len_ = std::exchange(o.len_, 0);
    }
    return *this;
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;

  std::byte* data() const { return static_cast<std::byte*>(addr_); }
  size_t size() const { return len_; }
  void reset();

 private:
  void* addr_ = nullptr;
  size_t len_ = 0;
};

// An anonymous shared-memory segment (memfd). It has no name, so nothing is left in /dev/shm
// whatever happens to the process, and it is reachable only by whoever is handed the fd.
// Sealed against shrinking and growing, so a peer holding the fd cannot truncate it under us
// (which would turn our next access into SIGBUS).
Result<UniqueFd> CreateSealedMemfd(const std::string& name, size_t size, unsigned int flags = 0);  // flags: MFD_HUGETLB
// Checks that a peer's fd is a memfd sealed against shrinking and at least min_size long.
Status CheckSealedMemfd(int fd, size_t min_size);
Result<Mapping> MapShared(int fd, size_t size, size_t offset = 0);
// Maps `count` segments of `each` bytes side by side in one fresh address range.
Result<Mapping> MapSideBySide(const int* fds, size_t count, size_t each);

// eventfd doorbells (non-blocking, close-on-exec).
Result<UniqueFd> CreateEventFd();
void RingDoorbell(int efd);
// Reads the doorbell's count back to 0 and returns it: how many rings since the last drain.
uint64_t DrainDoorbell(int efd);
// Waits up to timeout_ms (-1: forever) for fd to become readable. true if readable.
Result<bool> WaitReadable(int fd, int timeout_ms);

// Reads a whole file from its start; kInvalidArgument if it is longer than max_bytes.
Result<std::string> ReadWholeFd(int fd, size_t max_bytes);
// OK when `fd` is a regular file; else an error saying what `name` is instead ("NAME is a FIFO,
// not a regular file").
Status CheckRegularFile(int fd, const std::string& name);
// Reads the regular file at `path` (anything else refused without blocking on it, a FIFO
// included; a symlink refused unless follow_links); errors name the path.
Result<std::string> ReadWholeFile(const std::string& path, size_t max_bytes, bool follow_links = true);
// Writes `data` to a new temporary file beside `path` (created exclusively, so nothing planted
// there is written through), syncs it, renames it over `path` and syncs the directory: a reader
// sees the old file or the whole new one, and after a crash one of them is there. On failure
// the temporary file is removed. For the files ferry keeps (snapshots, report pages).
Status WriteFileAtomically(const std::string& path, std::string_view data, mode_t mode = 0644);
// Writes `data` to `path` in place (through a symlink, an existing file keeping its mode): for
// outputs a user names, which may be a link or /dev/stdout.
Status WriteWholeFile(const std::string& path, std::string_view data);

uint64_t MonotonicNanos();

}  // namespace ferry
