#include "daemon/numa.hpp"

#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>

namespace ferry::daemon {

namespace {

// linux/mempolicy.h's, defined here: ferry does not depend on libnuma's headers.
constexpr int kMpolBind = 2;
// The kernel's nodes go up to MAX_NUMNODES (1024 on x86-64 distribution kernels; 4096 at most).
constexpr int kMaxNode = 4095;
// A CPU or node number above this is not one (NR_CPUS is 8192 at most on x86-64).
constexpr long kMaxListNumber = 65535;

std::string_view Trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

template <typename T>
bool ParseWhole(std::string_view s, T* out, int base = 10) {
  if (s.empty()) return false;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *out, base);
  return ec == std::errc() && end == s.data() + s.size();
}

bool IsHex(std::string_view s, size_t min_digits, size_t max_digits) {
  if (s.size() < min_digits || s.size() > max_digits) return false;
  return std::all_of(s.begin(), s.end(), [](char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; });
}

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string NodeDir(const std::string& sysfs) { return sysfs + "/devices/system/node"; }

}  // namespace

std::string ReadTextFile(const std::string& path) {
  std::ifstream f(path);
  if (!f) return "";
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

std::string SysfsPciBusId(std::string_view id) {
  id = Trim(id);
  // domain:bus:device.function
  const size_t c1 = id.find(':');
  if (c1 == std::string_view::npos) return "";
  const size_t c2 = id.find(':', c1 + 1);
  const size_t dot = id.find('.', c2 == std::string_view::npos ? c1 : c2);
  if (c2 == std::string_view::npos || dot == std::string_view::npos) return "";
  const std::string_view domain = id.substr(0, c1), bus = id.substr(c1 + 1, c2 - c1 - 1),
                         device = id.substr(c2 + 1, dot - c2 - 1), function = id.substr(dot + 1);
  uint32_t d = 0;
  if (!IsHex(domain, 1, 8) || !ParseWhole(domain, &d, 16)) return "";
  if (!IsHex(bus, 2, 2) || !IsHex(device, 2, 2)) return "";
  if (function.size() != 1 || function[0] < '0' || function[0] > '7') return "";
  char dom[16];
  std::snprintf(dom, sizeof dom, "%04x", d);
  return std::string(dom) + ":" + Lower(bus) + ":" + Lower(device) + "." + std::string(function);
}

int NumaNodeOfPciDevice(std::string_view pci_bus_id, const std::string& sysfs) {
  const std::string id = SysfsPciBusId(pci_bus_id);
  if (id.empty()) return -1;
  const std::string text = ReadTextFile(sysfs + "/bus/pci/devices/" + id + "/numa_node");
  int node = -1;
  if (!ParseWhole(Trim(text), &node) || node < 0 || node > kMaxNode) return -1;
  return node;
}

std::vector<int> ParseCpuList(std::string_view text) {
  text = Trim(text);
  std::vector<int> out;
  while (!text.empty()) {
    const size_t comma = text.find(',');
    const std::string_view token = text.substr(0, comma);
    text = comma == std::string_view::npos ? std::string_view() : text.substr(comma + 1);
    const size_t dash = token.find('-');
    long a = 0, b = 0;
    if (!ParseWhole(token.substr(0, dash), &a)) return {};
    b = a;
    if (dash != std::string_view::npos && !ParseWhole(token.substr(dash + 1), &b)) return {};
    if (a < 0 || b < a || b > kMaxListNumber) return {};
    for (long v = a; v <= b; ++v) out.push_back(static_cast<int>(v));
    if (comma != std::string_view::npos && text.empty()) return {};  // a trailing comma
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::vector<int> OnlineNumaNodes(const std::string& sysfs) {
  return ParseCpuList(ReadTextFile(NodeDir(sysfs) + "/online"));
}

std::vector<int> CpusOfNumaNode(int node, const std::string& sysfs) {
  if (node < 0) return {};
  return ParseCpuList(ReadTextFile(NodeDir(sysfs) + "/node" + std::to_string(node) + "/cpulist"));
}

uint64_t NumaNodeMemTotal(int node, const std::string& sysfs) {
  if (node < 0) return 0;
  const std::string text = ReadTextFile(NodeDir(sysfs) + "/node" + std::to_string(node) + "/meminfo");
  const std::string key = "Node " + std::to_string(node) + " MemTotal:";
  const size_t at = text.find(key);
  if (at == std::string::npos) return 0;
  std::string_view rest = std::string_view(text).substr(at + key.size());
  rest = rest.substr(0, rest.find('\n'));
  rest = Trim(rest);
  if (rest.size() < 3 || rest.substr(rest.size() - 3) != " kB") return 0;
  uint64_t kib = 0;
  if (!ParseWhole(Trim(rest.substr(0, rest.size() - 3)), &kib) || kib > (UINT64_MAX >> 10)) return 0;
  return kib << 10;
}

std::vector<int> AffinityCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> out;
  if (::sched_getaffinity(0, sizeof set, &set) != 0) return out;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) out.push_back(c);
  }
  return out;
}

std::vector<int> IntersectCpus(const std::vector<int>& cpus, const std::vector<int>& allowed) {
  std::vector<int> out;
  std::set_intersection(cpus.begin(), cpus.end(), allowed.begin(), allowed.end(), std::back_inserter(out));
  return out;
}

cpu_set_t CpuSetOf(const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) {
    if (c >= 0 && c < CPU_SETSIZE) CPU_SET(c, &set);
  }
  return set;
}

Status BindToNumaNode(std::byte* p, uint64_t n, int node) {
  const std::string what = "mbind to node " + std::to_string(node);
  if (node < 0 || node > kMaxNode) return InvalidArgument(what + ": not a node number");
  const long page = ::sysconf(_SC_PAGESIZE);
  if (n == 0 || reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(page) != 0) {
    return InvalidArgument(what + ": the range must be page-aligned and not empty");
  }
  constexpr unsigned kBits = std::numeric_limits<unsigned long>::digits;
  std::vector<unsigned long> mask(static_cast<size_t>(node) / kBits + 1, 0);
  mask[static_cast<size_t>(node) / kBits] = 1ul << (static_cast<unsigned>(node) % kBits);
  // maxnode: the mask's bits plus one (the kernel has always read one bit fewer than it is told).
  const unsigned long maxnode = mask.size() * kBits + 1;
  if (::syscall(SYS_mbind, p, n, kMpolBind, mask.data(), maxnode, 0u) == 0) return Status::Ok();
  const int err = errno;
  const std::string why = std::string(" (") + std::strerror(err) + ")";
  switch (err) {
    case EINVAL:
      return InvalidArgument(what + ": the node is not online on this machine or not in this process's cpuset "
                                    "(Mems_allowed_list in /proc/self/status)" + why);
    case EPERM:
      return PermissionDenied(what + ": refused by a seccomp filter (Docker's default profile allows mbind only "
                                     "with CAP_SYS_NICE; a systemd SystemCallFilter without @resources)" + why);
    case ENOSYS:
      return NotSupported(what + ": this kernel has no NUMA support" + why);
    case EFAULT:
      return InvalidArgument(what + ": part of the range is not mapped" + why);
    default:
      return ErrnoStatus(what, err);
  }
}

std::map<int, uint64_t> ParseNumaMaps(std::string_view text, uintptr_t lo, uintptr_t hi) {
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  std::map<int, uint64_t> bytes;
  std::vector<std::pair<int, uint64_t>> line_pages;
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    const size_t sp = line.find(' ');
    uintptr_t start = 0;
    if (sp == std::string_view::npos || !ParseWhole(line.substr(0, sp), &start, 16)) continue;
    if (start < lo || start >= hi) continue;
    line_pages.clear();
    uint64_t page_kib = 0;
    bool bad = false;
    for (std::string_view rest = line.substr(sp + 1); !rest.empty() && !bad;) {
      const size_t next = rest.find(' ');
      const std::string_view token = rest.substr(0, next);
      rest = next == std::string_view::npos ? std::string_view() : rest.substr(next + 1);
      const size_t eq = token.find('=');
      if (eq == std::string_view::npos) continue;
      const std::string_view key = token.substr(0, eq), value = token.substr(eq + 1);
      if (key == "kernelpagesize_kB") {
        bad = !ParseWhole(value, &page_kib);
      } else if (key.size() >= 2 && key[0] == 'N' && std::isdigit(static_cast<unsigned char>(key[1]))) {
        int node = 0;
        uint64_t pages = 0;
        bad = !ParseWhole(key.substr(1), &node) || !ParseWhole(value, &pages);
        if (!bad) line_pages.emplace_back(node, pages);
      }
    }
    if (bad || page_kib == 0) continue;
    std::vector<std::pair<int, uint64_t>> line_bytes;
    for (auto [node, pages] : line_pages) {
      uint64_t b = 0;
      if (__builtin_mul_overflow(pages, page_kib, &b) || __builtin_mul_overflow(b, uint64_t{1024}, &b)) {
        bad = true;
        break;
      }
      line_bytes.emplace_back(node, b);
    }
    if (bad) continue;
    for (auto [node, b] : line_bytes) {
      uint64_t& sum = bytes[node];
      sum = b > kMax - sum ? kMax : sum + b;
    }
  }
  return bytes;
}

std::map<int, uint64_t> BytesOnNumaNodes(const std::byte* base, uint64_t size, const std::string& numa_maps) {
  const auto lo = reinterpret_cast<uintptr_t>(base);
  return ParseNumaMaps(ReadTextFile(numa_maps), lo, lo + size);
}

}  // namespace ferry::daemon
