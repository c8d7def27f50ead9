// ferryd: the node's GPU transfer daemon. Thin: parse flags, load config, pick a backend, serve.
#include <signal.h>
#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

#include "common/byte_size.hpp"
#include "common/cli.hpp"
#include "common/log.hpp"
#include "common/yaml_util.hpp"
#include "daemon/backend.hpp"
#include "daemon/config.hpp"
#include "daemon/metrics.hpp"
#include "daemon/preflight.hpp"
#include "daemon/server.hpp"
#include "daemon/signal_watcher.hpp"
#include "daemon/snapshots.hpp"
#include "ferry/version.hpp"

namespace {

constexpr const char* kUsage = R"(usage: ferryd [options]

ferryd owns this node's pinned host memory pool and CUDA copy streams and runs host<->device
copies for client processes (libferry) under their compute. Runs in the foreground; stops
cleanly on SIGTERM or SIGINT; SIGHUP re-reads the policy file.

options:
  --config PATH        YAML config (default: /etc/ferry/ferryd.yaml if it exists, else built-in defaults)
  --runtime-dir DIR    override runtime_dir (where the control socket lives)
  --backend NAME       override backend: auto | cuda | host
  --devices LIST       override devices: the GPUs to serve, "all" or CUDA ordinals and UUIDs
                       separated by commas (e.g. 0,1 or GPU-5f3e...)
  --pool-size SIZE     override pool.size, e.g. 256MiB
  --slab-size SIZE     override pool.slab, e.g. 8MiB
  --pool-register MODE override pool.register: auto, whole or per_slab (how the GPU pins the pool)
  --pool-huge-pages K  override pool.huge_pages: transparent or hugetlb (the kernel's reserved pages)
  --policy FILE        override policy: the scheduling policy (policies/*.yaml)
  --metrics-address A  override metrics.address: host:port for /metrics (port 0: any free
                       port, logged); "" turns the exporter off
  --log-level LEVEL    debug | info | warning | error (default info)
  --handoff WHERE      override handoff: gpu (default: a copy after a client's event waits on the
                       GPU) or host (ferryd polls the event, then issues the copy)
  --issue-threads N    override issue_threads: threads (1 to 16, the event loop's among them) that
                       issue a list of small host-to-device copies in parts at once (cuda backend)
  --trace-engine       log when each copy was read off the ring, issued, run on the copy engine
                       and seen done (cuda backend; a diagnostic for where a copy's time goes)
  --check-config [FILE]
                       check the config (FILE: as --config FILE) and everything ferryd needs
                       that is not the GPU (the group, runtime directory, policy, snapshot key
                       and directory, metrics address), print what it sets, and exit: 0 if
                       ferryd would start
  --version            print the version and exit
  -h, --help           this help
)";

}  // namespace

int main(int argc, char** argv) {
  using namespace ferry;
  std::string config_path;
  std::string runtime_dir, backend, pool_size, slab_size, policy, pool_register, pool_pages, handoff, issue_threads;
  std::optional<std::string> devices;
  std::optional<std::string> metrics_address;
  bool check_only = false, trace_engine = false;
  // A bad command line exits 2, like a bad configuration.
  auto usage_error = [](const std::string& what) {
    cli::Fail("ferryd", what);
    return 2;
  };
  for (cli::Args a(argc, argv); a.Next();) {
    // Every option but the flags takes a value.
    auto value = [&](std::string& out) {
      if (!a.HasValue()) return false;
      out = a.Value();
      return true;
    };
    std::string level, address;
    bool ok = true;
    if (a.IsHelp()) return cli::Help(kUsage);
    else if (a.Is("--version")) {
      std::printf("ferryd %s\n", kVersionString);
      return 0;
    } else if (a.Is("--config")) ok = value(config_path);
    else if (a.Is("--runtime-dir")) ok = value(runtime_dir);
    else if (a.Is("--backend")) ok = value(backend);
    else if (a.Is("--devices")) {
      std::string list;
      ok = value(list);
      devices = list;
    }
    else if (a.Is("--pool-size")) ok = value(pool_size);
    else if (a.Is("--slab-size")) ok = value(slab_size);
    else if (a.Is("--pool-register")) ok = value(pool_register);
    else if (a.Is("--pool-huge-pages")) ok = value(pool_pages);
    else if (a.Is("--handoff")) ok = value(handoff);
    else if (a.Is("--issue-threads"))
      ok = value(issue_threads);
    else if (a.Is("--metrics-address")) {
      ok = value(address);
      metrics_address = address;
    } else if (a.Is("--policy")) ok = value(policy);
    else if (a.Is("--check-config")) {
      check_only = true;
      if (a.HasOperand()) {  // --check-config FILE: the same as --config FILE --check-config
        const std::string file = a.Value();
        if (!config_path.empty() && config_path != file) {
          return usage_error("--check-config " + file + " and --config " + config_path + " name two files");
        }
        config_path = file;
      }
    }
    else if (a.Is("--trace-engine")) trace_engine = true;
    else if (a.Is("--log-level")) {
      ok = value(level);
      if (level == "debug") SetLogLevel(LogLevel::kDebug);
      else if (level == "info") SetLogLevel(LogLevel::kInfo);
      else if (level == "warning") SetLogLevel(LogLevel::kWarning);
      else if (level == "error") SetLogLevel(LogLevel::kError);
      else if (ok) return usage_error("unknown log level '" + level + "' (debug, info, warning, error)");
    } else {
      return usage_error("unknown option '" + a.current() + "' (try --help)");
    }
    if (!ok) return usage_error(a.current() + " needs a value");
  }
  if (config_path.empty() && ::access("/etc/ferry/ferryd.yaml", R_OK) == 0) config_path = "/etc/ferry/ferryd.yaml";
  daemon::DaemonConfig config;
  if (!config_path.empty()) {
    auto c = daemon::LoadConfig(config_path);
    if (!c.ok()) {
      std::fprintf(stderr, "ferryd: %s\n", c.status().message().c_str());
      return 2;
    }
    config = *c;
  }
  if (!runtime_dir.empty()) config.runtime_dir = runtime_dir;
  config.trace_engine = config.trace_engine || trace_engine;
  if (!policy.empty()) config.policy_path = policy;
  if (metrics_address) config.metrics_address = *metrics_address;
  if (devices) {
    auto list = daemon::ParseDeviceList(*devices);
    if (!list.ok()) return usage_error("--devices: " + list.status().message());
    config.devices = *list;
  }
  if (!backend.empty()) {
    auto choice = daemon::ParseBackendChoice(backend);
    if (!choice.ok()) return usage_error("--backend: " + choice.status().message());
    config.backend = *choice;
  }
  if (!handoff.empty()) {
    if (handoff != "gpu" && handoff != "host") return usage_error("--handoff takes gpu or host (not '" + handoff + "')");
    config.handoff_on_gpu = handoff == "gpu";
  }
  if (!issue_threads.empty()) {
    char* end = nullptr;
    const unsigned long n = std::strtoul(issue_threads.c_str(), &end, 10);
    if (!std::isdigit(static_cast<unsigned char>(issue_threads[0])) || *end != 0 || n < 1 ||
        n > daemon::kMaxIssueThreads) {
      return usage_error("--issue-threads takes 1 to " + std::to_string(daemon::kMaxIssueThreads) + " (not '" +
                         issue_threads + "')");
    }
    config.issue_threads = static_cast<uint32_t>(n);
  }
  if (!pool_pages.empty()) {
    auto pages = daemon::ParsePoolPages(pool_pages);
    if (!pages.ok()) return usage_error("--pool-huge-pages: " + pages.status().message());
    config.pool_pages = *pages;
  }
  if (!pool_register.empty()) {
    auto mode = daemon::ParsePoolRegistration(pool_register);
    if (!mode.ok()) return usage_error("--pool-register: " + mode.status().message());
    config.pool_registration = *mode;
  }
  for (auto [text, field] : {std::pair{&pool_size, &config.pool_bytes}, std::pair{&slab_size, &config.slab_bytes}}) {
    if (text->empty()) continue;
    auto v = ParseByteSize(*text);
    if (!v.ok()) {
      std::fprintf(stderr, "ferryd: %s: %s\n", text->c_str(), v.status().message().c_str());
      return 2;
    }
    *field = *v;
  }
  // The same checks for --check-config and for a start: what passes here fails later only for
  // what needs the GPU (or changed in between). The server is built from what they passed.
  auto checked = daemon::Preflight(config);
  if (!checked.ok()) {
    std::fprintf(stderr, "ferryd: %s%s\n", check_only ? "" : "cannot start: ", checked.status().message().c_str());
    return 2;
  }
  if (check_only) {
    std::printf("socket %s\nbackend %s\ndevices %s\npool %llu bytes in slabs of %llu (huge pages: %s)\nring_entries %u\npolicy %s (%s)\n",
                config.SocketPath().c_str(), std::string(daemon::BackendChoiceName(config.backend)).c_str(),
                daemon::DeviceListText(config.devices).c_str(), static_cast<unsigned long long>(config.pool_bytes), static_cast<unsigned long long>(config.slab_bytes),
                std::string(daemon::PoolPagesName(config.pool_pages)).c_str(), config.ring_entries, config.policy_path.empty() ? "built-in default" : config.policy_path.c_str(),
                checked->policy->Hash().c_str());
    if (config.spin_max_us == 0) {
      std::printf("polls %u us after its last activity, then sleeps\n", config.spin_us);
    } else {
      std::printf("polls %u to %u us after its last activity (twice the recent gaps between requests), then sleeps\n",
                  config.spin_us, config.spin_max_us);
    }
    return 0;
  }

  // Signals first, before any thread: a SIGHUP or SIGTERM during start-up must not kill ferryd
  // uncleanly, and every thread started later leaves them to the watcher.
  auto signals = daemon::SignalWatcher::Start();
  if (!signals.ok()) {
    std::fprintf(stderr, "ferryd: %s\n", signals.status().ToString().c_str());
    return 1;
  }
  signal(SIGPIPE, SIG_IGN);

  // The GPUs are located first (no CUDA context): their NUMA nodes place the pool's parts. Their
  // backends are made by the server while it builds the pool (a CUDA context takes a few hundred
  // milliseconds), and say what they are as soon as they are made.
  wire::BackendKind kind = wire::BackendKind::kHost;
  std::string why;
  auto located = daemon::LocateGpus(config, &kind, &why);
  if (!located.ok()) {
    std::fprintf(stderr, "ferryd: %s\n", located.status().ToString().c_str());
    return 1;
  }
  FERRY_LOG(kInfo) << "ferryd " << kVersionString << ": " << why << "; devices: " << daemon::DeviceListText(config.devices)
                   << " (" << located->size() << (located->size() == 1 ? " GPU)" : " GPUs)");
  daemon::GpuSource gpu_source;
  for (const auto& g : *located) gpu_source.numa_nodes.push_back(g.numa_node);
  gpu_source.pins_pool = kind == wire::BackendKind::kCuda;
  gpu_source.make = [&config, kind, gpus = *located]() -> Result<daemon::GpuBackends> {
    auto be = daemon::CreateBackends(config, kind, gpus);
    if (!be.ok()) return be.status();
    bool waits_on_flags = true;
    for (const auto& b : *be) {
      FERRY_LOG(kInfo) << b->Describe();
      waits_on_flags = waits_on_flags && b->waits_on_flags();
    }
    FERRY_LOG(kInfo) << "copies ordered after a client's event: "
                     << (waits_on_flags && config.handoff_on_gpu
                             ? "handed off on the GPU (a lane per client waits on the event's flag)"
                             : std::string("handed off on the host (ferryd polls the event") +
                                   (config.handoff_on_gpu ? ")" : ", as handoff: host asks)"));
    return be;
  };
  std::unique_ptr<daemon::MetricsExporter> metrics;
  if (!config.metrics_address.empty()) {
    auto m = daemon::MetricsExporter::Create(config.metrics_address, {kVersionString, {}, {}});
    if (!m.ok()) {
      std::fprintf(stderr, "ferryd: %s\n", m.status().ToString().c_str());
      return 1;
    }
    metrics = std::move(*m);
    FERRY_LOG(kInfo) << "metrics on http://" << config.metrics_address.substr(0, config.metrics_address.rfind(':'))
                     << ":" << metrics->port() << "/metrics";
  }
  std::unique_ptr<daemon::SnapshotWriter> snapshots;
  if (!config.snapshot_dir.empty()) {
    daemon::SnapshotOptions so;
    so.dir = config.snapshot_dir;
    so.key_path = config.snapshot_key;
    so.interval = std::chrono::milliseconds(config.snapshot_interval_ms);
    so.version = kVersionString;
    if (kind == wire::BackendKind::kCuda) so.cublas_version = daemon::CublasVersion;
    so.host_id = config.snapshot_host_id;
    if (daemon::MetricsExporter* m = metrics.get()) {
      so.on_written = [m](uint64_t seq, const std::string& id, const std::string& chain) { m->OnSnapshotWritten(seq, id, chain); };
      so.on_failure = [m](std::string_view reason) { m->OnSnapshotFailed(reason); };
    }
    auto w = daemon::SnapshotWriter::Create(so);
    if (!w.ok()) {
      std::fprintf(stderr, "ferryd: %s\n", w.status().ToString().c_str());
      return 1;
    }
    snapshots = std::move(*w);
    FERRY_LOG(kInfo) << "signed snapshots every " << config.snapshot_interval_ms << " ms into " << config.snapshot_dir;
  }
  daemon::ObserverTee observers;
  observers.Add(metrics.get());
  observers.Add(snapshots.get());
  daemon::ServerOptions options;
  options.observer = observers.empty() ? nullptr : &observers;
  // A SIGTERM during the start stops the pool's build at once (systemd's stop waits for no pool).
  options.stop_requested = [watcher = signals->get()] { return watcher->stop_requested(); };
  if ((*signals)->stop_requested()) {
    FERRY_LOG(kInfo) << "stopped during the start: ferryd was stopped before it built its pool";
    return 0;
  }
  auto server = daemon::Server::Create(std::move(*checked), std::move(gpu_source), std::move(options));
  if (!server.ok() && server.status().code() == Code::kAborted && (*signals)->stop_requested()) {
    FERRY_LOG(kInfo) << "stopped during the start: " << server.status().message();
    return 0;
  }
  if (server.ok() && (*signals)->stop_requested()) {  // after the build's last look: Run ends at once
    FERRY_LOG(kInfo) << "stopped during the start: ferryd was stopped as its start ended";
  }
  if (!server.ok()) {
    std::fprintf(stderr, "ferryd: %s\n", server.status().ToString().c_str());
    return 1;
  }
  const std::vector<daemon::DeviceInfo> gpus = (*server)->gpus();
  if (metrics) metrics->SetGpus(gpus);
  if (snapshots) snapshots->SetDevice(gpus.front());
  // A stop or reload that came during the start goes to the server now.
  (*signals)->Attach(
      {.stop = [s = server->get()] { s->Stop(); }, .reload = [s = server->get()] { s->RequestReload(); }});
  if (metrics) metrics->Attach(server->get());
  if (snapshots) snapshots->Start();
  FERRY_LOG(kInfo) << "ready";
  Status st = (*server)->Run();
  (*signals)->Detach();
  if (metrics) metrics->Attach(nullptr);
  server->reset();
  snapshots.reset();  // writes the last window
  if (!st.ok()) {
    std::fprintf(stderr, "ferryd: %s\n", st.ToString().c_str());
    return 1;
  }
  FERRY_LOG(kInfo) << "stopped cleanly";
  return 0;
}
