// `ferry-bench overlap` and `ferry-bench transfer` (also `ferryctl bench overlap|transfer`).
#include "bench/bench_commands.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>

#include "common/backend_name.hpp"
#include "common/cli.hpp"
#include "common/fd.hpp"
#include "common/process.hpp"
#include "common/signed_records.hpp"
#include "common/signing.hpp"
#include "common/status_macros.hpp"
#include "ferry/client.hpp"
#include "bench/overlap.hpp"

namespace ferry::bench {
namespace {

constexpr const char* kOverlapUsage = R"(usage: ferry-bench overlap [options]
       ferryctl [--socket PATH] bench overlap [options]

The seed workload: an N x N float32 matmul per step (cuBLAS on the GPU; on a host-backend
ferryd, the CPU) whose output (64 MiB at N = 4096) is copied device to host. Runs, in one go,
the math alone, the copy alone, the in-process baselines (serial, a side stream, in-step
blocks) and the same steps through ferryd under each policy given (pipelined: the copy under
the next step's math; in-step: each block's copy under the next block's math), with nine
correctness checks on fresh random inputs each round. Prints per mode the step time, the
exposed copy time (step - compute) and the overlap. ferryd's policy is switched for the run
and the one that was running is put back at the end. Exit 1 if a check fails.

options:
  --socket PATH      ferryd's control socket (default: $FERRY_SOCKET or /run/ferry/ferryd.sock)
  --policies P,...   policy files or directories of them (default: $FERRY_POLICY_DIR, else
                     /etc/ferry/policies, else the installed ones, else ./policies)
  --n N              matrix size (default 4096 on the GPU, 256 on the host)
  --steps N          timed steps per mode and round (default 30)
  --warmup N         untimed steps first (default 5)
  --rounds N         rounds, each with fresh random inputs (default 3)
  --blocks N         in-step: the math cut into N column blocks (default 6) ...
  --ratio R          ... each R of the one before (default 0.5)
  --cut W,W,...      or these column widths, in order (they must add up to N)
  --compute-streams L  in-step: the blocks take turns on L compute streams (default 2), so a
                     narrow block fills the multiprocessors the one before leaves idle
  --report FILE      write the run report (JSON) to FILE
  --sign-key KEY     sign the report (needs --report): FILE.minisig, minisign format
  --svg FILE         plot of the step per mode, compute and exposed copy to scale
  --json             print the report (JSON) instead of the table
  --quick            --steps 10 --warmup 3 --rounds 2
  --engine E         auto | cuda | host (default auto: what ferryd runs)
  --metrics ADDR     ferryd's metrics address (IPV4:PORT): per ferryd mode, print the bench's
                     own exposed copy time per step (GPU events around its stream waits; the
                     host clock on the host engine) beside what ferryd's ferry_exposed_seconds
                     recorded for the same steps, and whether they agree (within 10%, or
                     0.05 ms). Use a ferryd no other client is using meanwhile.
  --timeline FILE    (GPU) write each timed step's GPU times (its start, the end of its math,
                     its end) as CSV in microseconds on CLOCK_MONOTONIC, the clock of
                     ferryd --trace-engine's log, to set each copy's time on the engines
                     beside the step it served (bench/gpu/instep_trace.py)
  -h, --help         this help
)";

constexpr const char* kTransferUsage = R"(usage: ferry-bench transfer [options]
       ferryctl [--socket PATH] bench transfer [options]

What is the fastest way to move a tensor to the GPU, and why are timings odd? Runs the
transfer sweep (built with the CUDA toolkit; needs a GPU): pageable vs pinned vs the
ferry pool vs ferry staged from pageable memory over a size sweep, warm-up, device events,
medians with min/max, outliers counted, the copy engine's own time from device events beside
the host clock. See `ferry-bench transfer --help` for its options; and:
  --plot FILE.svg   also plot bandwidth against size for every path (python3; the samples go to
                    --csv, or FILE.svg.csv)
)";

bool IsDir(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::vector<std::string> PolicyFilesIn(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      std::string n = e->d_name;
      if (n.size() > 5 && n.substr(n.size() - 5) == ".yaml") out.push_back(dir + "/" + n);
    }
    ::closedir(d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::string> SplitComma(const std::string& s) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at <= s.size()) {
    size_t c = s.find(',', at);
    if (c == std::string::npos) c = s.size();
    if (c > at) out.push_back(s.substr(at, c - at));
    at = c + 1;
  }
  return out;
}

int Fail(const std::string& what) { return cli::Fail("ferry-bench", what); }

}  // namespace

std::string DefaultPolicyDir() {
  if (const char* e = std::getenv("FERRY_POLICY_DIR"); e && *e) return e;
  for (const std::string& d :
       {std::string("/etc/ferry/policies"), std::string(FERRY_INSTALL_DATADIR) + "/ferry/policies",
        ExecutableDir() + "/../policies", std::string("policies")}) {
    if (IsDir(d) && !PolicyFilesIn(d).empty()) return d;
  }
  return "policies";
}

Result<std::vector<std::string>> ExpandPolicies(const std::string& spec) {
  std::vector<std::string> files;
  for (const std::string& p : SplitComma(spec.empty() ? DefaultPolicyDir() : spec)) {
    if (IsDir(p)) {
      auto in = PolicyFilesIn(p);
      files.insert(files.end(), in.begin(), in.end());
    } else if (::access(p.c_str(), R_OK) == 0) {
      files.push_back(p);
    } else {
      return NotFound("policy " + p + ": " + std::strerror(errno));
    }
  }
  if (files.empty()) return NotFound("no policy files in " + spec);
  return files;
}

Result<std::unique_ptr<overlap::StepEngine>> MakeEngine(const std::string& which, const std::string& socket, int n) {
  ConnectOptions co;
  co.socket_path = socket;
  co.name = "ferryctl";
  FERRY_ASSIGN_OR_RETURN(auto c, Client::Connect(co));
  std::optional<wire::BackendKind> kind = ParseBackendName(which);
  if (which == "auto" || which.empty()) kind = ParseBackendName(BackendName(c->backend()));
  if (kind == wire::BackendKind::kCuda) return overlap::MakeCudaStepEngine(c->device_ordinal(), n > 0 ? n : 4096);
  if (kind == wire::BackendKind::kHost) {
    std::fprintf(stderr, "ferry-bench: the math runs on this CPU at n = %d (host engine: no GPU numbers)\n",
                 n > 0 ? n : 256);
    return overlap::MakeHostStepEngine(n > 0 ? n : 256);
  }
  return InvalidArgument("--engine is auto, cuda or host, not " + which);
}

Status SignFile(const std::string& path, const std::string& data, const std::string& key_path,
                const std::string& kind) {
  signing::SecretKey sk;
  FERRY_RETURN_IF_ERROR(signing::LoadSecretKey(key_path, sk));
  const std::string id = signing::RecordId(data);
  FERRY_ASSIGN_OR_RETURN(std::string sig, signing::Sign(sk, data, signing::ReportTrustedComment(kind, id),
                                                        "signature from ferry secret key " + signing::KeyIdHex(sk.id)));
  return WriteWholeFile(path + ".minisig", sig);
}

int BenchOverlap(const std::vector<std::string>& args) {
  overlap::Options o;
  std::string policies, report_path, key, svg, engine = "auto";
  bool json = false;
  int n = 0;
  cli::Args a(args);
  while (a.Next()) {
    if (a.IsHelp()) {
      return cli::Help(kOverlapUsage);
    } else if (a.Is("--socket")) {
      o.socket = a.Value();
    } else if (a.Is("--policies")) {
      policies = a.Value();
    } else if (a.Is("--n")) {
      if (!a.IntValue(64, 16384, n)) return Fail("--n takes 64..16384");
    } else if (a.Is("--steps")) {
      if (!a.IntValue(2, 2000, o.steps)) return Fail("--steps takes 2..2000");
    } else if (a.Is("--warmup")) {
      if (!a.IntValue(0, 100, o.warmup)) return Fail("--warmup takes 0..100");
    } else if (a.Is("--rounds")) {
      if (!a.IntValue(1, 100, o.rounds)) return Fail("--rounds takes 1..100");
    } else if (a.Is("--blocks")) {
      if (!a.IntValue(1, 32, o.pieces)) return Fail("--blocks takes 1..32");
    } else if (a.Is("--ratio")) {
      o.ratio = std::atof(a.Value().c_str());
      if (!(o.ratio >= 0.05 && o.ratio <= 1.0)) return Fail("--ratio takes 0.05..1");
    } else if (a.Is("--compute-streams")) {
      if (!a.IntValue(1, 8, o.lanes)) return Fail("--compute-streams takes 1..8");
    } else if (a.Is("--cut")) {
      for (const std::string& w : SplitComma(a.Value())) o.cut.push_back(std::atoi(w.c_str()));
      if (o.cut.empty()) return Fail("--cut takes column widths, e.g. 2048,1024,512,256,128,128");
    } else if (a.Is("--report")) {
      report_path = a.Value();
    } else if (a.Is("--sign-key")) {
      key = a.Value();
    } else if (a.Is("--svg")) {
      svg = a.Value();
    } else if (a.Is("--json")) {
      json = true;
    } else if (a.Is("--quick")) {
      o.steps = 10;
      o.warmup = 3;
      o.rounds = 2;
    } else if (a.Is("--engine")) {
      engine = a.Value();
    } else if (a.Is("--metrics")) {
      o.metrics = a.Value();
      if (o.metrics.empty()) return Fail("--metrics takes ferryd's metrics address, IPV4:PORT");
    } else if (a.Is("--timeline")) {
      o.timeline = a.Value();
      if (o.timeline.empty()) return Fail("--timeline takes a file name");
    } else {
      return Fail("bench overlap: unknown option '" + a.current() + "' (try --help)");
    }
  }
  if (!key.empty() && report_path.empty()) return Fail("--sign-key needs --report FILE");
  auto files = ExpandPolicies(policies);
  if (!files.ok()) return Fail(files.status().message());
  for (const std::string& f : *files) {
    auto in = overlap::ReadPolicyFile(f);
    if (!in.ok()) return Fail(in.status().message());
    o.policies.push_back(std::move(*in));
  }
  auto e = MakeEngine(engine, o.socket, n);
  if (!e.ok()) return Fail(e.status().ToString());
  o.quiet = json && ::isatty(2) == 0;
  auto r = overlap::Run(**e, o);
  if (!r.ok()) return Fail("bench overlap: " + r.status().ToString());
  const std::string j = overlap::ToJson(*r);
  if (!report_path.empty()) {
    if (Status s = WriteWholeFile(report_path, j); !s.ok()) return Fail(s.message());
    if (!key.empty()) {
      if (Status s = SignFile(report_path, j, key, "overlap"); !s.ok())
        return Fail("signing the report: " + s.ToString());
    }
  }
  if (!svg.empty()) {
    if (Status s = WriteWholeFile(svg, overlap::ToSvg(*r)); !s.ok()) return Fail(s.message());
  }
  std::fputs(json ? j.c_str() : overlap::ToText(*r).c_str(), stdout);
  if (!r->checks_passed()) {
    return Fail("bench overlap: a correctness check failed (see the checks above)");
  }
  return 0;
}

int BenchTransfer(const std::vector<std::string>& args) {
  std::vector<std::string> pass;
  std::string plot, csv;
  cli::Args a(args);
  while (a.Next()) {
    if (a.IsHelp()) std::fputs(kTransferUsage, stdout);
    if (a.Is("--plot") && a.HasValue()) {
      plot = a.Value();
      continue;
    }
    pass.push_back(a.current());
    if (a.Is("--csv") && a.HasValue()) {
      csv = a.Value();
      pass.push_back(csv);
    }
  }
  std::string script;
  if (!plot.empty()) {
    for (const std::string& p :
         {ExecutableDir() + "/../share/ferry/plot_transfer.py", std::string(FERRY_INSTALL_DATADIR) + "/ferry/plot_transfer.py",
          ExecutableDir() + "/../bench/plot_transfer.py"}) {
      if (::access(p.c_str(), R_OK) == 0) {
        script = p;
        break;
      }
    }
    if (script.empty()) return Fail("--plot: plot_transfer.py is not installed beside ferry-bench");
    if (csv.empty()) {
      csv = plot + ".csv";
      pass.insert(pass.end(), {"--csv", csv});
    }
  }
  const int rc = RunTransferSweep(pass);
  if (rc != 0 || plot.empty()) return rc;
  if (RunProgram({"python3", script, csv, plot}, "ferry-bench") != 0) {
    return Fail("plotting " + csv + " failed (python3 " + script + ")");
  }
  std::fprintf(stderr, "ferry-bench: wrote %s (samples in %s)\n", plot.c_str(), csv.c_str());
  return 0;
}

}  // namespace ferry::bench
