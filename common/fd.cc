#include "common/fd.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>

#include "common/status_macros.hpp"

namespace ferry {

void UniqueFd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

void Mapping::reset() {
  if (addr_ != nullptr) ::munmap(addr_, len_);
  addr_ = nullptr;
  len_ = 0;
}

Result<UniqueFd> CreateSealedMemfd(const std::string& name, size_t size, unsigned int flags) {
  UniqueFd fd(::memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING | flags));
  if (!fd.valid()) return ErrnoStatus("memfd_create(" + name + ")", errno);
  // memfds are created 0777 & ~umask; make the mode explicit anyway (it matters for
  // /proc/<pid>/fd re-opens, which also need ptrace rights over us).
  if (::fchmod(fd.get(), 0600) != 0) return ErrnoStatus("fchmod(memfd)", errno);
  if (::ftruncate(fd.get(), static_cast<off_t>(size)) != 0) return ErrnoStatus("ftruncate(memfd)", errno);
  if (::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return ErrnoStatus("fcntl(F_ADD_SEALS)", errno);
  }
  return fd;
}

Status CheckSealedMemfd(int fd, size_t min_size) {
  int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0) return InvalidArgument("fd is not a sealable memfd");
  if ((seals & F_SEAL_SHRINK) == 0) return InvalidArgument("memfd is not sealed against shrinking");
  struct stat st {};
  if (::fstat(fd, &st) != 0) return ErrnoStatus("fstat", errno);
  if (st.st_size < 0 || static_cast<size_t>(st.st_size) < min_size) {
    return InvalidArgument("memfd holds " + std::to_string(st.st_size) + " bytes, " + std::to_string(min_size) +
                           " claimed");
  }
  return Status::Ok();
}

namespace {

// ENOMEM from mmap is usually the map count, not memory: says how close this process is.
std::string MapCountNote() {
  size_t maps = 0;
  if (FILE* f = std::fopen("/proc/self/maps", "re")) {
    for (int c; (c = std::fgetc(f)) != EOF;) maps += c == '\n';
    std::fclose(f);
  }
  std::string max = "?";
  if (FILE* f = std::fopen("/proc/sys/vm/max_map_count", "re")) {
    char buf[32] = {};
    if (std::fgets(buf, sizeof buf, f) != nullptr) max = std::string(buf, strcspn(buf, "\n"));
    std::fclose(f);
  }
  return "this process has " + std::to_string(maps) + " memory mappings and may be at vm.max_map_count (" + max + ")";
}

}  // namespace

Result<Mapping> MapShared(int fd, size_t size, size_t offset) {
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, static_cast<off_t>(offset));
  if (p == MAP_FAILED) {
    const int err = errno;
    if (err == ENOMEM) return ResourceExhausted(ErrnoStatus("mmap", err).message() + " (" + MapCountNote() + ")");
    return ErrnoStatus("mmap", err);
  }
  return Mapping(p, size);
}

Result<Mapping> MapSideBySide(const int* fds, size_t count, size_t each) {
  const size_t total = count * each;
  // Start on a 2 MiB boundary, so that the kernel can back the range with huge pages.
  constexpr size_t kAlign = 2u << 20;
  void* raw = ::mmap(nullptr, total + kAlign, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) return ErrnoStatus("mmap(reserve)", errno);
  const uintptr_t start = reinterpret_cast<uintptr_t>(raw), aligned = (start + kAlign - 1) / kAlign * kAlign;
  if (aligned > start) ::munmap(raw, aligned - start);
  if (aligned + total < start + total + kAlign)
    ::munmap(reinterpret_cast<void*>(aligned + total), start + kAlign - aligned);
  void* base = reinterpret_cast<void*>(aligned);
  Mapping reserved(base, total);
  for (size_t i = 0; i < count; ++i) {
    void* want = static_cast<std::byte*>(base) + i * each;
    void* p = ::mmap(want, each, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fds[i], 0);
    if (p == MAP_FAILED) return ErrnoStatus("mmap(slab)", errno);
  }
  return reserved;
}

Result<UniqueFd> CreateEventFd() {
  UniqueFd fd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!fd.valid()) return ErrnoStatus("eventfd", errno);
  return fd;
}

void RingDoorbell(int efd) {
  uint64_t one = 1;
  // EAGAIN means the counter is saturated: the reader will wake anyway.
  [[maybe_unused]] ssize_t n = ::write(efd, &one, sizeof one);
}

uint64_t DrainDoorbell(int efd) {
  uint64_t v = 0;
  return ::read(efd, &v, sizeof v) == sizeof v ? v : 0;
}

Result<bool> WaitReadable(int fd, int timeout_ms) {
  pollfd p{fd, POLLIN, 0};
  for (;;) {
    int n = ::poll(&p, 1, timeout_ms);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus("poll", errno);
    return n > 0;
  }
}

uint64_t MonotonicNanos() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

}  // namespace ferry

namespace ferry {
Result<std::string> ReadWholeFd(int fd, size_t max_bytes) {
  std::string out;
  char buf[65536];
  for (off_t off = 0;;) {
    ssize_t n = ::pread(fd, buf, sizeof buf, off);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus("read", errno);
    if (n == 0) return out;
    out.append(buf, static_cast<size_t>(n));
    off += n;
    if (out.size() > max_bytes) return InvalidArgument("file is larger than " + std::to_string(max_bytes) + " bytes");
  }
}

Status CheckRegularFile(int fd, const std::string& name) {
  struct stat st{};
  if (::fstat(fd, &st) != 0) return ErrnoStatus("stat " + name, errno);
  if (S_ISREG(st.st_mode)) return Status::Ok();
  const char* kind = S_ISDIR(st.st_mode)    ? "a directory, "
                     : S_ISFIFO(st.st_mode) ? "a FIFO, "
                     : S_ISCHR(st.st_mode)  ? "a character device, "
                     : S_ISBLK(st.st_mode)  ? "a block device, "
                     : S_ISSOCK(st.st_mode) ? "a socket, "
                                            : "";
  return InvalidArgument(name + " is " + kind + "not a regular file");
}

Result<std::string> ReadWholeFile(const std::string& path, size_t max_bytes, bool follow_links) {
  // O_NONBLOCK: opening a FIFO planted where a file should be must not wait for a writer.
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | (follow_links ? 0 : O_NOFOLLOW)));
  if (!fd.valid() && errno == ELOOP && !follow_links) return InvalidArgument(path + " is a symbolic link (not followed here)");
  if (!fd.valid()) return ErrnoStatus("open " + path, errno);
  FERRY_RETURN_IF_ERROR(CheckRegularFile(fd.get(), path));
  auto data = ReadWholeFd(fd.get(), max_bytes);
  if (!data.ok()) return data.status().WithContext(path);
  return data;
}

namespace {
Status WriteAll(int fd, std::string_view data, const std::string& what) {
  for (size_t done = 0; done < data.size();) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return ErrnoStatus("write " + what, n < 0 ? errno : EIO);
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}
}  // namespace

Status WriteFileAtomically(const std::string& path, std::string_view data, mode_t mode) {
  std::string tmp = path + ".tmp.XXXXXX";
  UniqueFd fd(::mkostemp(tmp.data(), O_CLOEXEC));
  if (!fd.valid()) return ErrnoStatus("create a temporary file beside " + path, errno);
  auto fail = [&](Status st) {
    ::unlink(tmp.c_str());
    return st;
  };
  if (::fchmod(fd.get(), mode) != 0) return fail(ErrnoStatus("chmod " + tmp, errno));
  if (Status st = WriteAll(fd.get(), data, tmp); !st.ok()) return fail(st);
  if (::fsync(fd.get()) != 0) return fail(ErrnoStatus("fsync " + tmp, errno));
  if (::rename(tmp.c_str(), path.c_str()) != 0) return fail(ErrnoStatus("rename " + tmp + " to " + path, errno));
  const size_t slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  UniqueFd d(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!d.valid() || ::fsync(d.get()) != 0) return ErrnoStatus("fsync the directory " + dir, errno);
  return Status::Ok();
}

Status WriteWholeFile(const std::string& path, std::string_view data) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd.valid()) return ErrnoStatus("open " + path + " for writing", errno);
  return WriteAll(fd.get(), data, path);
}

}  // namespace ferry
