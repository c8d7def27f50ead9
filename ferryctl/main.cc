// ferryctl: the operator's tool for a running ferryd: status, policies (apply, show, diff), keys and
// the verification of signed records; `bench` and `tune` run ferry-bench.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/backend_name.hpp"
#include "common/channel.hpp"
#include "common/cli.hpp"
#include "common/fd.hpp"
#include "common/json.hpp"
#include "common/signing.hpp"
#include "common/status_macros.hpp"
#include "common/yaml_util.hpp"
#include "policy/policy.hpp"
#include "ferry/version.hpp"
#include "client/operator_control.hpp"
#include "ferryctl/run_bench.hpp"
#include "ferryctl/report_html.hpp"
#include "ferryctl/verify.hpp"

namespace {

using namespace ferry;

constexpr const char* kUsage = R"(usage: ferryctl [--socket PATH] COMMAND ...

commands:
  status [--json]                 what the running ferryd is doing, per GPU too (exit 3: still
                                  starting, with how far it got)
  policy apply FILE [--dry-run]   validate FILE and make it the running policy (new copies use
                                  it; copies in flight finish under theirs). A bad file changes
                                  nothing and its error names file:line:col.
  policy show [FILE]              every setting of FILE, or of the running policy, and its hash
  policy diff A B                 the settings that differ; A or B may be "running"
  keygen [--dir DIR] [--name N]   a new Ed25519 key pair for signed snapshots: DIR/N.key (0600)
                                  and DIR/N.pub (default: ., ferry)
  verify --pub KEY [--json] [--from-seq N | --allow-missing-head] [--expect-latest SEQ[:ID]]
         FILE|DIR...
                                  check signed snapshots: each signature (minisign format), its
                                  record id and sequence, the key, and the hash chain between
                                  them, in sequence order; and signed reports (bench overlap,
                                  tune): signature and record id. Exit 1 with the reason on the
                                  first failure. The first record must be its chain's head
                                  (seq 1, or a new chain's first record naming why the one
                                  before broke) unless --from-seq N (the records start at N on
                                  purpose) or --allow-missing-head. --expect-latest: fail unless
                                  record SEQ (with record id ID) is there: take it from ferryd's
                                  ferry_snapshot_latest_sequence / _info metrics, so a deleted
                                  newest record is noticed.
  report html FILE.json | --chain DIR [--pub KEY.pub] [-o OUT.html]
                                  one self-contained HTML page that checks a signed record (or
                                  a snapshot chain) in the reader's browser (--help for more)
  bench overlap [...]             (runs ferry-bench overlap) the seed workload (matmul + its output's copy) in-process and
                                  through ferryd under each policy: exposed copy time, nine
                                  correctness checks, a signed report, a plot (--help for more)
  bench transfer [...]            pageable vs pinned vs ferry pool vs ferry staged copies over a
                                  size sweep (runs ferry-bench transfer; --help for more)
  tune [...]                      (runs ferry-bench tune) re-tune the policy on this GPU: sweep settings over the overlap
                                  workload and a transfer sweep, write the best policy, say what
                                  changed since the last tune (--help for more)
  version                         ferryctl's version

options:
  --socket PATH   ferryd's control socket (default: $FERRY_SOCKET or /run/ferry/ferryd.sock)
  -h, --help      this help
)";

int Fail(const std::string& what) { return cli::Fail("ferryctl", what); }

using ctl::Control;

Result<std::string> RunningPolicyText(Control& c) { return c.RunningPolicyText(); }

int PolicyShow(const std::vector<std::string>& args, const std::string& socket) {
  if (args.empty()) {
    Control c;
    if (Status s = c.Open(socket); !s.ok()) return Fail(s.ToString());
    auto text = RunningPolicyText(c);
    if (!text.ok()) return Fail(text.status().ToString());
    std::fputs(text->c_str(), stdout);
    return 0;
  }
  auto p = policy::LoadPolicyFile(args[0]);
  if (!p.ok()) return Fail(p.status().message());
  std::printf("# %s: %s\n# hash %s\n%s", args[0].c_str(), (*p)->description.c_str(), (*p)->Hash().c_str(),
              (*p)->Canonical().c_str());
  return 0;
}

Result<std::string> CanonicalOf(const std::string& what, const std::string& socket) {
  if (what == "running") {
    Control c;
    FERRY_RETURN_IF_ERROR(c.Open(socket));
    return RunningPolicyText(c);
  }
  FERRY_ASSIGN_OR_RETURN(auto p, policy::LoadPolicyFile(what));
  return p->Canonical();
}

int PolicyDiff(const std::vector<std::string>& args, const std::string& socket) {
  if (args.size() != 2) return Fail("policy diff takes two policies (files or \"running\")");
  auto a = CanonicalOf(args[0], socket);
  if (!a.ok()) return Fail(a.status().message());
  auto b = CanonicalOf(args[1], socket);
  if (!b.ok()) return Fail(b.status().message());
  const auto changed = policy::DiffCanonical(*a, *b);
  for (const std::string& line : changed) std::printf("%s\n", line.c_str());
  if (changed.empty()) std::printf("no differences\n");
  return 0;
}

int PolicyApply(const std::vector<std::string>& args, const std::string& socket) {
  bool dry = false;
  std::string file;
  for (const auto& a : args) {
    if (a == "--dry-run") dry = true;
    else file = a;
  }
  if (file.empty()) return Fail("policy apply takes a FILE");
  // Validate here first: the same parser as ferryd, so the error shows without a round trip.
  auto local = policy::LoadPolicyFile(file);
  if (!local.ok()) return Fail(local.status().message() + " (the running policy is unchanged)");
  UniqueFd fd(::open(file.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return Fail("cannot open " + file + ": " + std::strerror(errno));
  Control c;
  if (Status s = c.Open(socket); !s.ok()) return Fail(s.ToString());
  auto r = c.ApplyPolicyFd(fd.get(), file, dry);
  if (!r.ok()) return Fail(r.status().message() + " (the running policy is unchanged)");
  if (dry) {
    std::printf("%s is valid: policy %s, hash %s (not applied)\n", file.c_str(), r->name.c_str(), r->hash.c_str());
  } else {
    std::printf("applied %s: policy %s, hash %s -> %s\n", file.c_str(), r->name.c_str(), r->previous_hash.c_str(),
                r->hash.c_str());
  }
  return 0;
}

int Status_(const std::vector<std::string>& args, const std::string& socket) {
  const bool json = !args.empty() && args[0] == "--json";
  Control c;
  // A ferryd still starting says how far it got, at once.
  if (Status open = c.Open(socket, std::chrono::milliseconds(0)); !open.ok()) {
    if (open.code() == Code::kUnavailable && open.message().rfind("ferryd is starting", 0) == 0) {
      if (json) std::printf("{\"starting\":true,\"status\":%s}\n", json::String(open.message()).c_str());
      else std::printf("%s\n", open.message().c_str());
      return 3;
    }
    return Fail(open.ToString());
  }
  auto st = c.Stats();
  if (!st.ok()) return Fail(st.status().ToString());
  std::string policy_line;
  if (auto r = c.RunningPolicy(); r.ok()) policy_line = r->name + " (" + r->hash + ")";
  const std::string backend(BackendName(c.backend()));
  std::vector<wire::GpuStatsReply> gpus;
  for (uint32_t g = 0; g < st->reserved; ++g) {
    auto r = c.GpuStats(g);
    if (!r.ok()) return Fail(r.status().ToString());
    gpus.push_back(*r);
  }
  auto u = [](uint64_t v) { return static_cast<unsigned long long>(v); };
  if (json) {
    std::printf("{\"backend\":\"%s\",\"sessions\":%llu,\"copies_completed\":%llu,\"bytes_h2d\":%llu,\"bytes_d2h\":%llu,"
                "\"pool_bytes\":%llu,\"pool_free_bytes\":%llu,\"evictions\":%llu,\"rejected\":%llu,\"policy\":%s,"
                "\"gpus\":[",
                backend.c_str(), u(st->sessions), u(st->copies_completed), u(st->bytes_h2d), u(st->bytes_d2h),
                u(st->pool_bytes), u(st->pool_free_bytes), u(st->evictions), u(st->rejected),
                json::String(policy_line).c_str());
    for (size_t i = 0; i < gpus.size(); ++i) {
      const auto& g = gpus[i];
      std::printf("%s{\"index\":%zu,\"uuid\":%s,\"name\":%s,\"ordinal\":%d,\"numa_node\":%d,\"clients\":%llu,"
                  "\"copies_completed\":%llu,\"bytes_h2d\":%llu,\"bytes_d2h\":%llu,\"pool_bytes\":%llu,"
                  "\"pool_free_bytes\":%llu}",
                  i ? "," : "", i, json::String(ReadCString(g.uuid)).c_str(), json::String(ReadCString(g.name)).c_str(),
                  g.ordinal, g.numa_node, u(g.sessions), u(g.copies_completed), u(g.bytes_h2d), u(g.bytes_d2h),
                  u(g.pool_bytes), u(g.pool_free_bytes));
    }
    std::printf("]}\n");
    return 0;
  }
  std::printf("backend          %s\nclients          %llu (this one included)\ncopies done      %llu\n"
              "bytes h2d / d2h  %llu / %llu\npool             %llu MiB free of %llu MiB\nevictions        %llu\n"
              "rejected         %llu\npolicy           %s\n",
              backend.c_str(), u(st->sessions), u(st->copies_completed), u(st->bytes_h2d), u(st->bytes_d2h),
              u(st->pool_free_bytes >> 20), u(st->pool_bytes >> 20), u(st->evictions), u(st->rejected),
              policy_line.c_str());
  std::printf("gpus             %zu\n", gpus.size());
  for (size_t i = 0; i < gpus.size(); ++i) {
    const auto& g = gpus[i];
    std::printf("  [%zu] %s  %s  ordinal %d  NUMA node %d: %llu clients, %llu copies, h2d / d2h %llu / %llu bytes; "
                "pool %llu MiB free of %llu MiB\n",
                i, ReadCString(g.uuid).c_str(), ReadCString(g.name).c_str(), g.ordinal, g.numa_node, u(g.sessions),
                u(g.copies_completed), u(g.bytes_h2d), u(g.bytes_d2h), u(g.pool_free_bytes >> 20), u(g.pool_bytes >> 20));
  }
  return 0;
}

int Keygen(const std::vector<std::string>& args) {
  std::string dir = ".", name = "ferry";
  cli::Args a(args);
  while (a.Next()) {
    if (a.Is("--dir") && a.HasValue()) dir = a.Value();
    else if (a.Is("--name") && a.HasValue()) name = a.Value();
    else return Fail("keygen: unknown argument " + a.current());
  }
  auto id = signing::GenerateKeyFiles(dir, name);
  if (!id.ok()) return Fail(id.status().ToString());
  std::printf("key id %s\nsecret key %s/%s.key (mode 0600: keep it on the node, put its path in snapshots.key)\n"
              "public key %s/%s.pub (give it to whoever checks the records)\n",
              signing::KeyIdHex(*id).c_str(), dir.c_str(), name.c_str(), dir.c_str(), name.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string socket;
  std::vector<std::string> args;
  cli::Args a(argc, argv);
  while (a.Next()) {
    if (args.empty() && a.IsHelp()) return cli::Help(kUsage);  // after a command: that command's help
    if (a.Is("--socket") && a.HasValue()) {
      socket = a.Value();
      continue;
    }
    args.push_back(a.current());
  }
  if (args.empty()) {
    std::fputs(kUsage, stderr);
    return 64;
  }
  const std::string cmd = args[0];
  std::vector<std::string> rest(args.begin() + 1, args.end());
  if (cmd == "version") {
    std::printf("ferryctl %s\n", ferry::kVersionString);
    return 0;
  }
  if (cmd == "status") return Status_(rest, socket);
  if (cmd == "bench" && !rest.empty() && (rest[0] == "overlap" || rest[0] == "transfer")) {
    return ctl::RunBench(rest[0], std::vector<std::string>(rest.begin() + 1, rest.end()), socket);
  }
  if (cmd == "tune") return ctl::RunBench("tune", rest, socket);
  if (cmd == "keygen") return Keygen(rest);
  if (cmd == "verify") return ctl::Verify(rest);
  if (cmd == "report") {
    if (!rest.empty() && rest[0] == "html") return ctl::ReportHtml(std::vector<std::string>(rest.begin() + 1, rest.end()));
    std::fprintf(stderr, "ferryctl: report takes html (try ferryctl report html --help)\n");
    return 64;
  }
  if (cmd == "policy" && !rest.empty()) {
    const std::string sub = rest[0];
    std::vector<std::string> pargs(rest.begin() + 1, rest.end());
    if (sub == "apply") return PolicyApply(pargs, socket);
    if (sub == "show") return PolicyShow(pargs, socket);
    if (sub == "diff") return PolicyDiff(pargs, socket);
  }
  std::fprintf(stderr, "ferryctl: unknown command '%s' (try --help)\n", cmd.c_str());
  return 64;
}
