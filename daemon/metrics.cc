#include "daemon/metrics.hpp"

#include <elf.h>
#include <link.h>
#include <prometheus/collectable.h>
#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <pthread.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>

#include "common/environment.hpp"
#include "common/fd.hpp"

namespace ferry::daemon {
namespace {

std::string CudaLabel(int version) { return version > 0 ? environment::CudaVersionText(version) : "none"; }

// Debian's libcivetweb1 1.15 is built with CIVETWEB_THREAD_STACK_SIZE=102400: every civetweb
// thread gets a 100 KiB stack, and glibc must fit the process's whole static thread-local
// storage (the executable's and every library loaded at start) into it. When it does not,
// pthread_create fails with EINVAL before any system call, mg_start returns NULL and
// prometheus-cpp throws "null context when constructing CivetServer" (docs/design.md, "Known hazards").
// cuBLAS 13 alone brings 92 KiB of it (libcublasLt.so.13), which is why ferryd loads cuBLAS
// with dlopen and never links it.
constexpr size_t kCivetwebThreadStackBytes = 102400;
constexpr int kExporterThreads = 8;
constexpr int kExporterRequestTimeoutMs = 5000;

struct TlsUser {
  std::string object;
  size_t bytes;
};

// The static TLS blocks of the objects loaded now (at start-up: all of them are static TLS).
std::vector<TlsUser> TlsUsers() {
  std::vector<TlsUser> users;
  ::dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* out) {
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          if (info->dlpi_phdr[i].p_type != PT_TLS || info->dlpi_phdr[i].p_memsz == 0) continue;
          std::string name =
              info->dlpi_name != nullptr && info->dlpi_name[0] != '\0' ? info->dlpi_name : "the executable";
          static_cast<std::vector<TlsUser>*>(out)->push_back(
              {name.substr(name.rfind('/') + 1), info->dlpi_phdr[i].p_memsz});
        }
        return 0;
      },
      &users);
  std::sort(users.begin(), users.end(), [](const TlsUser& a, const TlsUser& b) { return a.bytes > b.bytes; });
  return users;
}

// Starts and joins a thread with civetweb's stack size, as civetweb will.
Status CivetwebThreadsCanStart() {
  pthread_attr_t attr;
  ::pthread_attr_init(&attr);
  int e = ::pthread_attr_setstacksize(&attr, kCivetwebThreadStackBytes);
  pthread_t t;
  if (e == 0)
    e = ::pthread_create(
        &t, &attr, [](void*) -> void* { return nullptr; }, nullptr);
  ::pthread_attr_destroy(&attr);
  if (e == 0) {
    ::pthread_join(t, nullptr);
    return Status::Ok();
  }
  std::string why = "civetweb cannot start its threads: pthread_create with its fixed " +
                    std::to_string(kCivetwebThreadStackBytes / 1024) + " KiB stack fails (" + std::strerror(e) + ")";
  if (e != EINVAL) return Unavailable(why);
  size_t total = 0;
  std::string list;
  for (const TlsUser& u : TlsUsers()) {
    total += u.bytes;
    if (u.bytes >= 1024) list += (list.empty() ? "" : ", ") + u.object + " " + std::to_string(u.bytes / 1024) + " KiB";
  }
  return Unavailable(why + ": this process's static thread-local storage, " + std::to_string(total / 1024) +
                     " KiB, does not fit in it (" + list +
                     "). Serve metrics from a process that does not link such libraries (load them with dlopen)");
}

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

// Copy sizes span 4 KiB to GiBs at 50 GB/s: 1 us to 100 ms and more.
prometheus::Histogram::BucketBoundaries DurationBuckets() {
  return {2e-6, 5e-6, 1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 2e-2, 5e-2, 0.1, 0.2, 0.5, 1, 2, 5};
}

MetricFamily GaugeFamily(std::string name, std::string help, std::vector<std::pair<ClientMetric::Label, double>> values) {
  MetricFamily f;
  f.name = std::move(name);
  f.help = std::move(help);
  f.type = MetricType::Gauge;
  for (auto& [label, v] : values) {
    ClientMetric m;
    if (!label.name.empty()) m.label.push_back(label);
    m.gauge.value = v;
    f.metric.push_back(std::move(m));
  }
  return f;
}

MetricFamily CounterFamily(std::string name, std::string help, double value) {
  MetricFamily f;
  f.name = std::move(name);
  f.help = std::move(help);
  f.type = MetricType::Counter;
  ClientMetric m;
  m.counter.value = value;
  f.metric.push_back(std::move(m));
  return f;
}

// One sample per GPU and label set: value(gpu index) for each.
template <typename Value>
MetricFamily PerGpuFamily(std::string name, std::string help, MetricType type, const std::vector<DeviceInfo>& gpus,
                          const std::vector<ClientMetric::Label>& extra, Value value) {
  MetricFamily f;
  f.name = std::move(name);
  f.help = std::move(help);
  f.type = type;
  for (size_t i = 0; i < gpus.size(); ++i) {
    for (size_t k = 0; k < std::max<size_t>(extra.size(), 1); ++k) {
      ClientMetric m;
      m.label.push_back({"gpu_uuid", gpus[i].uuid});
      if (!extra.empty()) m.label.push_back(extra[k]);
      const double v = value(static_cast<uint32_t>(i), k);
      (type == MetricType::Counter ? m.counter.value : m.gauge.value) = v;
      f.metric.push_back(std::move(m));
    }
  }
  return f;
}

// Reads the server's live counters at scrape time, so gauges are never stale.
class LiveGauges : public prometheus::Collectable {
 public:
  void SetGpus(std::vector<DeviceInfo> gpus) {
    std::lock_guard<std::mutex> l(mu_);
    gpus_ = std::move(gpus);
  }
  void Attach(const Server* s) {
    std::lock_guard<std::mutex> l(mu_);
    server_ = s;
  }
  void SetBandwidth(double h2d, double d2h) {
    bw_h2d_ = h2d;
    bw_d2h_ = d2h;
  }
  std::vector<MetricFamily> Collect() const override {
    std::lock_guard<std::mutex> l(mu_);
    std::vector<MetricFamily> out;
    if (server_ == nullptr) return out;
    const ServerCounters& c = server_->counters();
    const double pool = static_cast<double>(server_->pool_bytes());
    const double free_bytes = static_cast<double>(c.pool_free_bytes.load());
    ClientMetric::Label none{};
    out.push_back(GaugeFamily("ferry_clients", "Clients connected now.", {{none, double(c.sessions.load())}}));
    const double quarantined = static_cast<double>(c.pool_quarantined_bytes.load());
    const double zeroing = static_cast<double>(c.pool_zeroing_bytes.load());
    const double broken = static_cast<double>(c.pool_broken_bytes.load());
    // quarantined: slabs of ended sessions that a process outside ferryd still maps or holds open
    // (counted against its uid); zeroing: let go of, getting fresh pages before the next session
    // gets them; broken: the backend could not pin their fresh pages, out of use.
    out.push_back(GaugeFamily("ferry_pool_bytes", "Pinned pool bytes, by state.",
                              {{{"state", "used"}, pool - free_bytes - quarantined - zeroing - broken},
                               {{"state", "free"}, free_bytes},
                               {{"state", "quarantined"}, quarantined},
                               {{"state", "zeroing"}, zeroing},
                               {{"state", "broken"}, broken}}));
    out.push_back(GaugeFamily("ferry_pool_size_bytes", "Pinned pool size.", {{none, pool}}));
    out.push_back(GaugeFamily("ferry_in_flight_bytes", "Bytes on the copy engines now.",
                              {{none, double(c.in_flight_bytes.load())}}));
    out.push_back(GaugeFamily("ferry_queued_bytes", "Bytes accepted and waiting for the copy engines.",
                              {{none, double(c.queued_bytes.load())}}));
    out.push_back(GaugeFamily("ferry_copies_in_flight", "Copies accepted and not finished (queue depth).",
                              {{none, double(c.in_flight.load())}}));
    out.push_back(GaugeFamily("ferry_achieved_bandwidth_bytes_per_second",
                              "Bytes copied per second over the last second, by direction.",
                              {{{"direction", "h2d"}, bw_h2d_.load()}, {{"direction", "d2h"}, bw_d2h_.load()}}));
    out.push_back(GaugeFamily("ferry_poll_window_seconds",
                              "How long ferryd polls after its last activity before it sleeps (adapts to the "
                              "gaps between requests, spin_us to spin_max_us).",
                              {{none, double(c.poll_window_ns.load()) * 1e-9}}));
    out.push_back(CounterFamily("ferry_evictions_total", "Clients evicted for breaking the protocol or not keeping up.",
                                double(c.evictions.load())));
    out.push_back(CounterFamily("ferry_buffers_allocated_total",
                                "Pool buffers granted to clients; each asked for on the client's socket, so a "
                                "steady rise under a steady load means a client that does not keep its buffers.",
                                double(c.buffers_allocated.load())));
    out.push_back(CounterFamily("ferry_sleeps_total",
                                "Times ferryd's event loop went to sleep; the request that wakes it waits for the "
                                "wake-up.",
                                double(c.sleeps.load())));
    out.push_back(GaugeFamily("ferry_start_seconds",
                              "How long ferryd's start took, by phase: the pool built (pages faulted in), its "
                              "registration with the GPUs, and from the start to ready in all.",
                              {{{"phase", "pool"}, double(c.start_pool_ns.load()) * 1e-9},
                               {{"phase", "registration"}, double(c.start_register_ns.load()) * 1e-9},
                               {{"phase", "total"}, double(c.start_total_ns.load()) * 1e-9}}));
    out.push_back(GaugeFamily("ferry_pool_build_bytes_per_second",
                              "The rate the pool was built at, at the start (bytes faulted in per second).",
                              {{none, c.start_pool_ns.load() ? pool / (double(c.start_pool_ns.load()) * 1e-9) : 0}}));
    out.push_back(GaugeFamily("ferry_pool_huge_page_bytes",
                              "Pool bytes on huge pages at the start (transparent huge pages for shared memory).",
                              {{none, double(c.pool_huge_page_bytes.load())}}));
    {
      MetricFamily f;
      f.name = "ferry_pool_part_bytes";
      f.help = "The pool's parts, one per NUMA node of the GPUs: size, free, and on its node (placed there "
               "at the start; numa_node -1: no node known).";
      f.type = MetricType::Gauge;
      for (uint32_t i = 0; i < c.pool_parts.load() && i < c.pool_part.size(); ++i) {
        const auto& p = c.pool_part[i];
        const std::string node = std::to_string(p.numa_node.load());
        for (auto [state, v] : {std::pair{"size", p.bytes.load()}, std::pair{"free", p.free_bytes.load()},
                                std::pair{"on_node", p.bytes_on_node.load()}}) {
          ClientMetric m;
          m.label = {{"part", std::to_string(i)}, {"numa_node", node}, {"state", state}};
          m.gauge.value = static_cast<double>(v);
          f.metric.push_back(std::move(m));
        }
      }
      out.push_back(std::move(f));
    }
    const size_t n = std::min<size_t>(gpus_.size(), kMaxGpus);
    const std::vector<DeviceInfo> gpus(gpus_.begin(), gpus_.begin() + static_cast<std::ptrdiff_t>(n));
    out.push_back(PerGpuFamily("ferry_gpu_clients", "Clients copying to each GPU now.", MetricType::Gauge, gpus, {},
                               [&](uint32_t g, size_t) { return double(c.gpu[g].sessions.load()); }));
    out.push_back(PerGpuFamily("ferry_gpu_copies_total", "Copies finished on each GPU.", MetricType::Counter, gpus, {},
                               [&](uint32_t g, size_t) { return double(c.gpu[g].copies_completed.load()); }));
    out.push_back(PerGpuFamily("ferry_gpu_copied_bytes_total", "Bytes copied, by GPU and direction.",
                               MetricType::Counter, gpus, {{"direction", "h2d"}, {"direction", "d2h"}},
                               [&](uint32_t g, size_t k) {
                                 return double(k == 0 ? c.gpu[g].bytes_h2d.load() : c.gpu[g].bytes_d2h.load());
                               }));
    return out;
  }

 private:
  mutable std::mutex mu_;
  std::vector<DeviceInfo> gpus_;  // guarded by mu_
  const Server* server_ = nullptr;  // guarded by mu_
  std::atomic<double> bw_h2d_{0}, bw_d2h_{0};
};

}  // namespace

// What the event loop hands the exporter: fixed size, no strings. The loop thread produces,
// the sampler thread consumes (single producer, single consumer), so recording a copy costs the
// loop a few stores and never a prometheus-cpp lock or label lookup.
struct Event {
  enum Kind : uint8_t { kCopy, kExposed } kind;
  uint8_t direction;
  bool ok;
  uint16_t label;  // interned (class, policy)
  uint32_t blocks;  // kCopy of a block list: its blocks; else 0
  uint64_t bytes;
  double seconds, queued_seconds;
};

class EventRing {
 public:
  static constexpr uint32_t kSize = 1 << 16;
  bool Push(const Event& e) {
    const uint32_t t = tail_.load(std::memory_order_relaxed);
    if (t - head_.load(std::memory_order_acquire) >= kSize) return false;
    slots_[t & (kSize - 1)] = e;
    tail_.store(t + 1, std::memory_order_release);
    return true;
  }
  template <typename F>
  void Drain(F f) {
    const uint32_t t = tail_.load(std::memory_order_acquire);
    uint32_t h = head_.load(std::memory_order_relaxed);
    for (; h != t; ++h) f(slots_[h & (kSize - 1)]);
    head_.store(h, std::memory_order_release);
  }

 private:
  std::vector<Event> slots_ = std::vector<Event>(kSize);
  alignas(64) std::atomic<uint32_t> head_{0};
  alignas(64) std::atomic<uint32_t> tail_{0};
};

class MetricsExporter::Impl {
 public:
  Impl() : registry(std::make_shared<prometheus::Registry>()), live(std::make_shared<LiveGauges>()) {}

  // ferry_build_info (with the first GPU's backend and CUDA versions), ferry_gpu_info and the
  // per-GPU counters: once, when the GPUs are known.
  void SetGpus(const std::vector<DeviceInfo>& gpus, const DeviceInfo& first) {
    prometheus::BuildGauge()
        .Name("ferry_build_info")
        .Help("ferry's version and what it was built with; always 1.")
        .Register(*registry)
        .Add({{"version", version}, {"backend", first.backend}, {"cuda_driver", CudaLabel(first.cuda_driver)},
              {"cuda_runtime", CudaLabel(first.cuda_runtime)}})
        .Set(1);
    auto& gpu_info = prometheus::BuildGauge()
                         .Name("ferry_gpu_info")
                         .Help("The GPUs this ferryd drives (on the host backend, simulated ones); always 1.")
                         .Register(*registry);
    for (const DeviceInfo& g : gpus) {
      gpu_info
          .Add({{"gpu_uuid", g.uuid},
                {"name", g.name},
                {"ordinal", std::to_string(g.ordinal)},
                {"numa_node", std::to_string(g.numa_node)},
                {"pci_bus_id", g.pci_bus_id}})
          .Set(1);
    }
    live->SetGpus(gpus);
  }

  std::string version;
  EventRing events;
  std::atomic<uint64_t> dropped{0};
  prometheus::Counter* dropped_counter = nullptr;
  // Interning, on the loop thread: the last (class, policy) pair seen, and all of them.
  std::string last_class, last_policy;
  uint16_t last_label = 0;
  std::map<std::pair<std::string, std::string>, uint16_t> labels;  // loop thread
  std::mutex label_mu;                                               // guards label_names
  std::vector<std::pair<std::string, std::string>> label_names;      // id -> (class, policy)

  uint16_t Intern(std::string_view klass, std::string_view policy) {
    if (!label_names.empty() && klass == last_class && policy == last_policy) return last_label;
    auto key = std::make_pair(std::string(klass), std::string(policy));
    auto it = labels.find(key);
    if (it == labels.end()) {
      std::lock_guard<std::mutex> l(label_mu);
      it = labels.emplace(key, static_cast<uint16_t>(label_names.size())).first;
      label_names.push_back(key);
    }
    last_class = key.first;
    last_policy = key.second;
    last_label = it->second;
    return last_label;
  }

  // Sampler thread: applies queued events to the prometheus metrics.
  void Apply(const Event& e) {
    std::pair<std::string, std::string> names;
    {
      std::lock_guard<std::mutex> l(label_mu);
      names = label_names[e.label];
    }
    const char* dir = e.direction == 0 ? "h2d" : "d2h";
    if (e.kind == Event::kExposed) {  // queued_seconds: ferryd's own time of the reported copy
      exposed->Add({{"direction", dir}, {"class", names.first}, {"policy", names.second}}, DurationBuckets())
          .Observe(e.seconds);
      exposed_copy->Add({{"direction", dir}, {"class", names.first}, {"policy", names.second}}, DurationBuckets())
          .Observe(e.queued_seconds);
      return;
    }
    copies->Add({{"direction", dir}, {"class", names.first}, {"policy", names.second}, {"result", e.ok ? "ok" : "failed"}})
        .Increment();
    if (e.ok) bytes->Add({{"direction", dir}}).Increment(static_cast<double>(e.bytes));
    if (e.blocks != 0) {
      block_lists->Add({{"direction", dir}, {"result", e.ok ? "ok" : "failed"}}).Increment();
      if (e.ok) blocks->Add({{"direction", dir}}).Increment(static_cast<double>(e.blocks));
    }
    duration->Add({{"direction", dir}, {"class", names.first}}, DurationBuckets()).Observe(e.seconds);
    queue_wait->Add({{"direction", dir}, {"class", names.first}}, DurationBuckets()).Observe(e.queued_seconds);
  }

  std::unique_ptr<prometheus::Exposer> exposer;
  std::shared_ptr<prometheus::Registry> registry;
  std::shared_ptr<LiveGauges> live;

  prometheus::Family<prometheus::Counter>* copies = nullptr;
  prometheus::Family<prometheus::Counter>* bytes = nullptr;
  prometheus::Family<prometheus::Counter>* block_lists = nullptr;
  prometheus::Family<prometheus::Counter>* blocks = nullptr;
  prometheus::Family<prometheus::Histogram>* duration = nullptr;
  prometheus::Family<prometheus::Histogram>* queue_wait = nullptr;
  prometheus::Family<prometheus::Histogram>* exposed = nullptr;
  prometheus::Family<prometheus::Histogram>* exposed_copy = nullptr;
  prometheus::Family<prometheus::Counter>* snapshot_failures = nullptr;
  prometheus::Gauge* snapshot_sequence = nullptr;
  prometheus::Family<prometheus::Gauge>* snapshot_info = nullptr;
  prometheus::Gauge* snapshot_current = nullptr;  // guarded by policy_mu
  prometheus::Family<prometheus::Counter>* rejected = nullptr;
  prometheus::Family<prometheus::Counter>* reloads = nullptr;
  prometheus::Family<prometheus::Gauge>* policy_info = nullptr;
  prometheus::Gauge* current_policy = nullptr;
  std::mutex policy_mu;

  // Sampler thread: drains events every 50 ms; bandwidth from the counters once a second.
  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
  const Server* server = nullptr;
  std::thread sampler;

  void Sample() {
    uint64_t last_h = 0, last_d = 0, last_t = MonotonicNanos();
    std::unique_lock<std::mutex> l(mu);
    while (!stop) {
      cv.wait_for(l, std::chrono::milliseconds(50));
      events.Drain([this](const Event& e) { Apply(e); });
      if (const uint64_t d = dropped.exchange(0)) dropped_counter->Increment(static_cast<double>(d));
      if (stop) break;
      const uint64_t t = MonotonicNanos();
      if (t - last_t < 1'000'000'000) continue;
      if (server != nullptr) {
        const uint64_t h = server->counters().bytes_h2d.load(), d = server->counters().bytes_d2h.load();
        const double dt = static_cast<double>(t - last_t) * 1e-9;
        if (last_h != 0 || last_d != 0 || h != 0 || d != 0) {
          live->SetBandwidth(static_cast<double>(h - last_h) / dt, static_cast<double>(d - last_d) / dt);
        }
        last_h = h;
        last_d = d;
      }
      last_t = t;
    }
  }
};

MetricsExporter::MetricsExporter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

MetricsExporter::~MetricsExporter() {
  {
    std::lock_guard<std::mutex> l(impl_->mu);
    impl_->stop = true;
  }
  impl_->cv.notify_all();
  if (impl_->sampler.joinable()) impl_->sampler.join();
}

Result<std::unique_ptr<MetricsExporter>> MetricsExporter::Create(const std::string& address, const MetricsInfo& info) {
  auto impl = std::make_unique<Impl>();
  // civetweb reports a thread it could not start only as a null context (the first worker) or
  // not at all (the others, the listener): find out first, and say why.
  if (Status threads = CivetwebThreadsCanStart(); !threads.ok()) {
    return Unavailable("cannot serve metrics on " + address + ": " + threads.message());
  }
  try {
    // Any local user can connect, so no one client may hold the exporter: several workers (each
    // a 100 KiB civetweb thread, see above), and a request that has not arrived whole within
    // request_timeout_ms is dropped. No keep-alive: a scrape is one request.
    impl->exposer = std::make_unique<prometheus::Exposer>(std::vector<std::string>{
        "listening_ports", address,
        "num_threads", std::to_string(kExporterThreads),
        "request_timeout_ms", std::to_string(kExporterRequestTimeoutMs),
        "enable_keep_alive", "no"});
  } catch (const std::exception& e) {
    return Unavailable("cannot serve metrics on " + address + ": " + e.what() +
                       " (is the address in use or not local? set metrics.address, or empty to disable)");
  }
  auto& r = *impl->registry;
  impl->version = info.version;
  if (!info.device.backend.empty()) impl->SetGpus(info.gpus.empty() ? std::vector<DeviceInfo>{} : info.gpus, info.device);
  impl->copies = &prometheus::BuildCounter()
                      .Name("ferry_copies_total")
                      .Help("Copies finished, by direction, client class, policy and result.")
                      .Register(r);
  impl->bytes = &prometheus::BuildCounter().Name("ferry_copied_bytes_total").Help("Bytes copied, by direction.").Register(r);
  impl->block_lists = &prometheus::BuildCounter()
                           .Name("ferry_block_lists_total")
                           .Help("Block-list copies finished, by direction and result (each is also one of "
                                 "ferry_copies_total).")
                           .Register(r);
  impl->blocks = &prometheus::BuildCounter()
                      .Name("ferry_blocks_total")
                      .Help("Blocks copied by block-list copies that succeeded, by direction.")
                      .Register(r);
  impl->duration = &prometheus::BuildHistogram()
                        .Name("ferry_copy_duration_seconds")
                        .Help("Accepted to done, per copy, by direction and client class.")
                        .Register(r);
  impl->queue_wait = &prometheus::BuildHistogram()
                          .Name("ferry_copy_queue_seconds")
                          .Help("Accepted to first piece on the copy engines (time spent queued in ferryd).")
                          .Register(r);
  impl->exposed = &prometheus::BuildHistogram()
                       .Name("ferry_exposed_seconds")
                       .Help("Exposed copy time: how long clients were blocked waiting for copies. Reported by "
                             "clients, bounded by ferryd's own copy times: one report per real copy of the "
                             "session, no longer than the copy existed; refused reports are in "
                             "ferry_rejected_total{reason=\"wait_report\"}.")
                       .Register(r);
  impl->exposed_copy = &prometheus::BuildHistogram()
                            .Name("ferry_exposed_copy_duration_seconds")
                            .Help("Measured by ferryd: accepted to done of each copy behind an accepted "
                                  "ferry_exposed_seconds report, to compare the clients' figures with.")
                            .Register(r);
  impl->snapshot_failures = &prometheus::BuildCounter()
                                 .Name("ferry_snapshot_failures_total")
                                 .Help("Signed snapshots not written, by reason (key_permissions: the secret key "
                                       "is readable by others or not a regular file; write: signing or disk).")
                                 .Register(r);
  impl->snapshot_sequence = &prometheus::BuildGauge()
                                 .Name("ferry_snapshot_latest_sequence")
                                 .Help("Sequence number of the newest signed snapshot ferryd wrote (0: none yet); "
                                       "give it to ferryctl verify --expect-latest.")
                                 .Register(r)
                                 .Add({});
  impl->snapshot_info = &prometheus::BuildGauge()
                             .Name("ferry_snapshot_latest_info")
                             .Help("The newest signed snapshot's record id and chain id; always 1.")
                             .Register(r);
  for (const char* reason : {"key_permissions", "write"}) impl->snapshot_failures->Add({{"reason", reason}});
  impl->rejected = &prometheus::BuildCounter().Name("ferry_rejected_total").Help("Requests refused, by reason.").Register(r);
  impl->reloads = &prometheus::BuildCounter()
                       .Name("ferry_policy_reloads_total")
                       .Help("Policy switches and refused policy files.")
                       .Register(r);
  impl->policy_info = &prometheus::BuildGauge()
                           .Name("ferry_policy_info")
                           .Help("The running policy (name and hash); always 1.")
                           .Register(r);
  for (const char* d : {"h2d", "d2h"}) impl->bytes->Add({{"direction", d}});
  // Known label values start at 0, so "none yet" reads as 0 rather than as no data.
  for (RejectReason reason : kAllRejectReasons) impl->rejected->Add({{"reason", std::string(RejectReasonName(reason))}});
  impl->reloads->Add({{"result", "ok"}});
  impl->reloads->Add({{"result", "failed"}});
  impl->dropped_counter = &prometheus::BuildCounter()
                               .Name("ferry_metrics_dropped_total")
                               .Help("Copy records the exporter could not keep up with (not in the other metrics).")
                               .Register(r)
                               .Add({});
  impl->exposer->RegisterCollectable(impl->registry);
  impl->exposer->RegisterCollectable(impl->live);
  Impl* raw = impl.get();
  impl->sampler = std::thread([raw] { raw->Sample(); });
  return std::unique_ptr<MetricsExporter>(new MetricsExporter(std::move(impl)));
}

void MetricsExporter::Attach(const Server* server) {
  impl_->live->Attach(server);
  std::lock_guard<std::mutex> l(impl_->mu);
  impl_->server = server;
}

int MetricsExporter::port() const {
  auto ports = impl_->exposer->GetListeningPorts();
  return ports.empty() ? -1 : ports.front();
}

void MetricsExporter::SetGpus(const std::vector<DeviceInfo>& gpus) {
  if (!gpus.empty()) impl_->SetGpus(gpus, gpus.front());
}

void MetricsExporter::OnCopyDone(const CopyRecord& r) {
  Event e{Event::kCopy, static_cast<uint8_t>(r.direction == Direction::kHostToDevice ? 0 : 1), r.ok,
          impl_->Intern(r.client_class, r.policy), r.blocks, r.bytes, r.seconds, r.queued_seconds};
  if (!impl_->events.Push(e)) impl_->dropped++;
}

void MetricsExporter::OnExposed(const ExposedRecord& r) {
  Event e{Event::kExposed, static_cast<uint8_t>(r.direction == Direction::kHostToDevice ? 0 : 1), true,
          impl_->Intern(r.client_class, r.policy), 0, 0, r.seconds, r.copy_seconds};
  if (!impl_->events.Push(e)) impl_->dropped++;
}

void MetricsExporter::OnPolicy(const Policy& now) {
  std::lock_guard<std::mutex> l(impl_->policy_mu);
  if (impl_->current_policy != nullptr) {
    impl_->policy_info->Remove(impl_->current_policy);
    impl_->reloads->Add({{"result", "ok"}}).Increment();
  }
  impl_->current_policy = &impl_->policy_info->Add({{"policy", now.name}, {"hash", now.Hash()}});
  impl_->current_policy->Set(1);
}

void MetricsExporter::OnPolicyRefused() { impl_->reloads->Add({{"result", "failed"}}).Increment(); }

void MetricsExporter::OnRejected(std::string_view reason) {
  impl_->rejected->Add({{"reason", std::string(reason)}}).Increment();
}

void MetricsExporter::OnSnapshotWritten(uint64_t sequence, const std::string& record_id, const std::string& chain) {
  std::lock_guard<std::mutex> l(impl_->policy_mu);
  impl_->snapshot_sequence->Set(static_cast<double>(sequence));
  if (impl_->snapshot_current != nullptr) impl_->snapshot_info->Remove(impl_->snapshot_current);
  impl_->snapshot_current = &impl_->snapshot_info->Add({{"record_id", record_id}, {"chain", chain}});
  impl_->snapshot_current->Set(1);
}

void MetricsExporter::OnSnapshotFailed(std::string_view reason) {
  impl_->snapshot_failures->Add({{"reason", std::string(reason)}}).Increment();
}

}  // namespace ferry::daemon
