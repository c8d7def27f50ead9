// The machine's NUMA layout as the kernel reports it, and placing ferryd's pool pages on a node.
//
// A GPU node has its GPUs on two (or more) NUMA nodes; a copy between a GPU and host memory of
// the other node crosses the socket link. So each GPU's pool pages belong on the GPU's node: the
// node comes from sysfs (the numa_node of the GPU's PCI device), the pages are bound to it with
// mbind before they are faulted in, and /proc/self/numa_maps says where they ended up.
//
// No libnuma (not a dependency of ferry): the mbind system call directly. Every function that
// reads sysfs or /proc takes that root as a parameter, defaulting to the real one, so that tests
// can hand it a fake tree. None of them keeps state; all are safe to call from any thread.
#pragma once

#include <sched.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/status.hpp"

namespace ferry::daemon {

// A PCI bus id as CUDA gives it ("00000000:19:00.0": 8-digit domain; nvidia-smi and sysfs use 4
// digits; either case) in sysfs' spelling: "0000:19:00.0" (lower case, the domain at least 4
// digits, more where the domain needs them, as on VMD domains "10000:..."). "" when it is not a
// bus id (domain:bus:device.function, with bus and device two hex digits and function 0-7).
std::string SysfsPciBusId(std::string_view pci_bus_id);

// The NUMA node of a PCI device: <sysfs>/bus/pci/devices/<id>/numa_node. -1 when the id is not
// a bus id, the file is missing or unreadable, or it says -1 (one-node machines and many VMs:
// the firmware gave the device no node).
int NumaNodeOfPciDevice(std::string_view pci_bus_id, const std::string& sysfs = "/sys");

// A kernel list ("0-1,3", "0-23,48-71\n"): the numbers, ascending, no repeats. Empty for an empty
// list and for anything that is not one (a token that is not a number or a rising range).
std::vector<int> ParseCpuList(std::string_view text);

// The nodes this kernel has online (<sysfs>/devices/system/node/online). Empty when the file is
// missing: a kernel without NUMA support.
std::vector<int> OnlineNumaNodes(const std::string& sysfs = "/sys");
// The CPUs of a node (<sysfs>/devices/system/node/node<N>/cpulist); empty when the node has none
// (a memory-only node) or is unknown. Intersect it with AffinityCpus() before pinning to it.
std::vector<int> CpusOfNumaNode(int node, const std::string& sysfs = "/sys");
// The memory of a node (<sysfs>/devices/system/node/node<N>/meminfo, "Node 0 MemTotal: 24683756
// kB"); 0 when it is not known.
uint64_t NumaNodeMemTotal(int node, const std::string& sysfs = "/sys");
// The CPUs this process may run on (its affinity mask), ascending.
std::vector<int> AffinityCpus();
// Those of `cpus` also in `allowed`; both ascending.
std::vector<int> IntersectCpus(const std::vector<int>& cpus, const std::vector<int>& allowed);
// `cpus` as a set for sched_setaffinity; numbers outside 0..CPU_SETSIZE-1 are left out.
cpu_set_t CpuSetOf(const std::vector<int>& cpus);

// Binds [p, p + n) (page-aligned, not yet faulted in) to `node` (mbind, MPOL_BIND): its pages
// are allocated on that node whichever CPU faults them. On a shared-memory mapping (ferryd's
// memfd slabs) the kernel keeps the policy on the file, so pages the file gets later (a hole
// punched and faulted in again) go to the node too. The node must be able to hold the range:
// the kernel does not fall back to another node. Errors say what the kernel's answer means:
// the node is not online or not in this process's cpuset (a container's), NUMA is not in this
// kernel, or a seccomp filter refuses mbind (Docker's default profile, unless CAP_SYS_NICE).
Status BindToNumaNode(std::byte* p, uint64_t n, int node);

// Bytes per node of the mappings that start inside [lo, hi), from the text of a numa_maps file:
// each line is "<start address hex> <policy> ... N<node>=<pages> ... kernelpagesize_kB=<kB>", a
// node's bytes its pages times kernelpagesize_kB (4 for base and transparent huge pages, whose
// count is in base pages; 2048 or 1048576 on hugetlbfs). numa_maps gives no end address, so a
// mapping that starts inside the range counts whole: ask with a range that mappings do not
// straddle (each pool slab is a mapping of its own). Lines that are not such a line, and lines
// whose sizes do not fit 64 bits, are skipped; sums stop at UINT64_MAX.
std::map<int, uint64_t> ParseNumaMaps(std::string_view numa_maps_text, uintptr_t lo, uintptr_t hi);

// ParseNumaMaps of [base, base + size) in this process's numa_maps (the pages mapped now).
std::map<int, uint64_t> BytesOnNumaNodes(const std::byte* base, uint64_t size,
                                         const std::string& numa_maps = "/proc/self/numa_maps");

// A whole small text file (sysfs and /proc files); "" when it cannot be read.
std::string ReadTextFile(const std::string& path);

}  // namespace ferry::daemon
