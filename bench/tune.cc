// ferry-bench tune (also `ferryctl tune`): re-tunes the policy on the live GPU. Coordinate
// descent over the settings that matter (chunk schedule, streams per direction, batching
// threshold, stream priority); each candidate is measured against the best so far in
// interleaved pairs of overlap runs through ferryd (correctness checks must pass) and kept only
// on the A/B rule's verdict (bench/ab_verdict), with a transfer sweep guarding bandwidth; writes
// the best as a policy file and a signed report that the next run compares against
// (environment and settings).
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>

#include "common/cli.hpp"
#include "common/fd.hpp"
#include "common/status_macros.hpp"
#include "common/yaml_util.hpp"
#include "policy/policy.hpp"
#include "ferry/client.hpp"
#include "ferry/version.hpp"
#include "bench/ab_verdict.hpp"
#include "bench/bench_commands.hpp"
#include "bench/bench_util.hpp"
#include "bench/transfer_sweep.hpp"
#include "bench/tune_comparison.hpp"
#include "common/byte_size.hpp"
#include "common/json.hpp"
#include "common/time_format.hpp"
#include "client/operator_control.hpp"

namespace ferry::bench {
namespace {

constexpr const char* kUsage = R"(usage: ferry-bench tune [options]
       ferryctl [--socket PATH] tune [options]

Re-tunes ferryd's policy on this GPU (after a driver, CUDA or cuBLAS upgrade, say). Starting
from the last tune's policy (or the running one), it tries each setting that matters in turn:
  schedule    chunked 8/16/32/64 MiB, geometric (halving to 1 MiB), side-stream
  streams     1, 2 or 4 bulk streams per direction
  batching    threshold 256 KiB, 1 MiB, 4 MiB
  priority    bulk streams at the least or the greatest priority
A score is the overlap workload's exposed copy time through ferryd (the math on the client's
stream, its output's copy pipelined and in-step; score = the two exposed times added; all nine
correctness checks must pass).

How a verdict is made: each candidate (B) is measured against the best so far (A) in pairs, one
overlap run holding both, A first then B, then B first, and so on. The difference is the mean of
B - A over the pairs (20% trimmed from each end: Yuen's paired t, so one run a busy machine
stalled does not decide), as a percentage of A's score, with a Student's t interval on it. Pairs
are judged at 4, then each doubling, and at --max-pairs; the interval's confidence is 99% over
all those looks together (each look a Bonferroni share), so stopping early costs no confidence. A
candidate is kept only when its interval lies below zero and its gain is at least --min-effect;
a real gain below that is "not worth changing", an interval holding zero "unchanged", one above
zero "worse". A comparison stops at the first look with a clear verdict (an obvious gain or
loss, or an interval within +-min-effect of zero), else at --max-pairs. A candidate the rule
would keep also has its largest copy (--max-size) timed against A's in four pairs: slower by
over 3% with the interval above zero rejects it.
First the start is measured against itself the same way (4 or 8 pairs): that difference is the
run's own noise floor, printed with the results.

Writes the best policy and a signed JSON report beside it with every comparison (difference,
interval, pairs, the verdict and its reason), and says what changed since the last tune: in the
environment (GPU, driver, CUDA runtime, cuBLAS, ferry) and in the settings, each changed
setting with the gain and interval that kept it, or that the last tune's settings still hold.
ferryd's running policy is left as it was (apply the result with `ferryctl policy apply`).

options:
  --socket PATH       ferryd's control socket (default: $FERRY_SOCKET or /run/ferry/ferryd.sock)
  --out FILE          the tuned policy (default ./ferry-tuned.yaml); its report is FILE.tune.json,
                      which the next run with the same --out compares against
  --start FILE        start from this policy instead of the last tune's or the running one
  --sign-key KEY      sign the report (FILE.tune.json.minisig, minisign format)
  --apply             apply the tuned policy to ferryd when done
  --quick             a small grid and short runs (what CI runs on the host backend)
  --only DIMS         tune only these settings: schedule,streams,batching,priority
  --min-effect PCT    the smallest gain worth a change, in percent of the score (default 5)
  --max-pairs N       the most pairs per comparison (default 16, at least 4)
  --n N               matrix size of the overlap workload (default: 4096 on the GPU, 256 on the host)
  --max-size BYTES    largest copy of the transfer sweep (default 64 MiB; --quick 4 MiB)
  --json              print the report instead of the tables
  -h, --help          this help
)";

int Fail(const std::string& what) { return cli::Fail("ferry-bench: tune", what); }


std::string ShortLabel(const policy::Policy& p, int dim) {
  char b[96];
  switch (dim) {
    case 0:
      if (p.schedule == policy::Schedule::kChunked) return "chunked " + FormatByteSize(p.chunk_bytes);
      if (p.schedule == policy::Schedule::kGeometric) {
        std::snprintf(b, sizeof b, "geometric ratio %g down to %s", p.ratio,
                      FormatByteSize(p.min_chunk_bytes).c_str());
        return b;
      }
      return std::string(policy::ScheduleName(p.schedule));
    case 1:
      return std::to_string(p.bulk_streams) + " bulk streams per direction";
    case 2:
      return "batch pieces up to " + FormatByteSize(p.batch_threshold_bytes);
    default:
      return p.bulk_priority == policy::StreamPriority::kGreatest ? "bulk at the greatest priority"
                                                                  : "bulk at the least priority";
  }
}

struct TuneSettings {
  std::string socket, out = "ferry-tuned.yaml", start, key;
  bool apply = false, quick = false, json = false;
  int n = 0;
  size_t max_size = 0;
  bool dims[4] = {true, true, true, true};  // --only
  AbRule rule;
};

const char* const kDimNames[] = {"schedule", "streams", "batching", "priority"};

// Both sides' exposed times from one overlap run holding A and B.
struct PairRun {
  double a_pipelined = 0, a_in_step = 0, b_pipelined = 0, b_in_step = 0;
  bool checks_passed = true;
  std::string failure;
};

class Tuner {
 public:
  explicit Tuner(TuneSettings s) : s_(std::move(s)) {}
  int Run();

 private:
  Result<PairRun> RunPair(const policy::Policy& a, const policy::Policy& b, bool b_first);
  Result<Comparison> Compare(const std::string& label, const std::string& change,
                             const std::shared_ptr<const policy::Policy>& a,
                             const std::shared_ptr<const policy::Policy>& b, const AbRule& rule);
  Status Sweep(Comparison& c);
  Status GuardBandwidth(Comparison& c, const policy::Policy& a);
  Result<double> LargestCopySecondsPerGb(const policy::Policy& p);
  std::vector<std::shared_ptr<policy::Policy>> Alternatives(const policy::Policy& at, int dim);
  std::string ReportJson() const;
  void PrintText(const std::string& start_label) const;
  // The tune started from the last tune's policy (not the running one or --start).
  bool StartedFromLastTune() const { return previous_ && previous_->Hash() == noise_->policy->Hash(); }

  TuneSettings s_;
  std::unique_ptr<overlap::StepEngine> engine_;
  ctl::Control control_;
  std::string original_yaml_;
  std::vector<std::pair<std::string, std::string>> env_;
  std::optional<Comparison> noise_;  // the start against itself
  std::vector<Comparison> comparisons_;
  std::shared_ptr<const policy::Policy> previous_, tuned_;
  std::string previous_canonical_, previous_issued_;
  std::vector<std::string> env_changes_, setting_changes_;
  bool had_previous_ = false;
  std::string issued_at_, engine_kind_;
  std::unique_ptr<Progress> progress_;
  int pairs_run_ = 0;
  double seconds_ = 0;
};

// One pair: an overlap run holding both policies (renamed tune-a and tune-b, so their modes stay
// apart), A's modes first or B's. Both share the run's inputs and its compute-alone reference,
// which a pair's difference then cancels.
Result<PairRun> Tuner::RunPair(const policy::Policy& a, const policy::Policy& b, bool b_first) {
  auto named = [](const policy::Policy& p, const char* name) {
    policy::Policy copy = p;
    copy.name = name;
    return overlap::PolicyInput{name, copy.ToYaml()};
  };
  overlap::Options o;
  o.socket = s_.socket;
  o.policies = {named(a, "tune-a"), named(b, "tune-b")};
  if (b_first) std::swap(o.policies[0], o.policies[1]);
  o.in_process = false;
  o.copy_alone = false;
  o.quiet = true;
  o.steps = s_.quick ? 6 : 12;
  o.warmup = s_.quick ? 2 : 3;
  o.rounds = 1;
  FERRY_ASSIGN_OR_RETURN(overlap::Report r, overlap::Run(*engine_, o));
  if (env_.empty()) {
    env_ = r.environment;
    env_.push_back({"ferry", r.ferry_version});
    env_.push_back({"daemon_backend", r.daemon_backend});
    engine_kind_ = r.engine;
  }
  PairRun out;
  out.checks_passed = r.checks_passed();
  for (const overlap::Check& c : r.checks) {
    if (!c.pass && out.failure.empty()) out.failure = c.name + ": " + c.detail;
  }
  double* slots[] = {&out.a_pipelined, &out.a_in_step, &out.b_pipelined, &out.b_in_step};
  int i = 0;
  for (const char* name : {"tune-a", "tune-b"}) {
    for (const char* strategy : {"pipelined", "in-step"}) {
      const overlap::ModeResult* m = r.Find("ferryd", strategy, name);
      if (m == nullptr) return Internal(std::string("the overlap run has no ") + strategy + " result for " + name);
      *slots[i++] = m->exposed;
    }
  }
  ++pairs_run_;
  return out;
}

Result<Comparison> Tuner::Compare(const std::string& label, const std::string& change,
                                  const std::shared_ptr<const policy::Policy>& a,
                                  const std::shared_ptr<const policy::Policy>& b, const AbRule& rule) {
  Comparison c;
  c.label = label;
  c.change = change;
  c.policy = b;
  c.a_hash = a->Hash();
  std::vector<PairRun> runs;
  auto measure = [&](int i) -> Result<AbPair> {
    FERRY_ASSIGN_OR_RETURN(PairRun p, RunPair(*a, *b, i % 2 == 1));
    if (!s_.json || ::isatty(2)) progress_->Step(label + ", pair " + std::to_string(i + 1));
    if (!p.checks_passed) {
      c.checks_passed = false;
      c.check_failure = p.failure;
      return Aborted("a correctness check failed");
    }
    runs.push_back(p);
    return AbPair{p.a_pipelined + p.a_in_step, p.b_pipelined + p.b_in_step};
  };
  auto r = CompareAb(measure, rule, &c.pairs);
  if (!r.ok() && c.checks_passed) return r.status().WithContext(label);
  if (r.ok()) c.ab = *r;
  for (const PairRun& p : runs) {
    const double w = 1.0 / static_cast<double>(runs.size());
    c.a_pipelined += w * p.a_pipelined, c.a_in_step += w * p.a_in_step;
    c.b_pipelined += w * p.b_pipelined, c.b_in_step += w * p.b_in_step;
  }
  c.verdict = c.checks_passed ? std::string(AbVerdictName(c.ab.verdict))
                              : "rejected: a correctness check failed (" + c.check_failure + ")";
  return c;
}

// The transfer sweep under c's policy, then back to what was running.
Status Tuner::Sweep(Comparison& c) {
  FERRY_RETURN_IF_ERROR(control_.ApplyPolicyText(c.policy->ToYaml(), c.label).status());
  auto sweep = TransferSweep(s_.socket, s_.max_size, s_.quick ? 3 : 5);
  FERRY_RETURN_IF_ERROR(control_.ApplyPolicyText(original_yaml_, "policy running before the tune").status());
  FERRY_RETURN_IF_ERROR(sweep.status());
  c.sweep = *sweep;
  c.largest_gbps = 1e30;
  for (const Bandwidth& b : c.sweep) {
    if (b.bytes == s_.max_size) c.largest_gbps = std::min(c.largest_gbps, b.gbps);
  }
  return Status::Ok();
}

// The largest copy under `p`, the slower direction: seconds per GB.
Result<double> Tuner::LargestCopySecondsPerGb(const policy::Policy& p) {
  FERRY_RETURN_IF_ERROR(control_.ApplyPolicyText(p.ToYaml(), "tune: bandwidth guard").status());
  auto sweep = TransferSweep(s_.socket, s_.max_size, s_.quick ? 1 : 3, /*largest_only=*/true);
  FERRY_RETURN_IF_ERROR(sweep.status());
  double gbps = 1e30;
  for (const Bandwidth& b : *sweep) gbps = std::min(gbps, b.gbps);
  return 1 / gbps;
}

// Bandwidth by the same rule, four pairs: a candidate whose largest copy is slower than A's, with
// the interval above zero and by more than 3%, is rejected.
Status Tuner::GuardBandwidth(Comparison& c, const policy::Policy& a) {
  AbRule rule;
  rule.min_effect = 0.03;
  rule.min_pairs = rule.max_pairs = 4;
  auto measure = [&](int i) -> Result<AbPair> {
    AbPair p;
    for (int side = 0; side < 2; ++side) {
      const bool b_side = (side == 1) != (i % 2 == 1);
      FERRY_ASSIGN_OR_RETURN(double spg, LargestCopySecondsPerGb(b_side ? *c.policy : a));
      (b_side ? p.b : p.a) = spg;
    }
    if (!s_.json || ::isatty(2)) progress_->Step(c.label + ", bandwidth pair " + std::to_string(i + 1));
    return p;
  };
  auto r = CompareAb(measure, rule, &c.bandwidth_pairs);
  FERRY_RETURN_IF_ERROR(control_.ApplyPolicyText(original_yaml_, "policy running before the tune").status());
  FERRY_RETURN_IF_ERROR(r.status());
  c.bandwidth = *r;
  c.largest_gbps = r->mean_b > 0 ? 1 / r->mean_b : 0;
  return Status::Ok();
}

// dim 0: schedule, 1: streams, 2: batching, 3: priority.
std::vector<std::shared_ptr<policy::Policy>> Tuner::Alternatives(const policy::Policy& at, int dim) {
  std::vector<std::shared_ptr<policy::Policy>> out;
  auto with = [&](auto&& edit) {  // none that changes nothing
    auto p = std::make_shared<policy::Policy>(at);
    edit(*p);
    p->name = at.name;
    if (!policy::DiffPolicies(at, *p).empty()) out.push_back(std::move(p));
  };
  switch (dim) {
    case 0: {
      std::vector<uint64_t> chunks = s_.quick
                                         ? std::vector<uint64_t>{1ull << 20, 64ull << 20}
                                         : std::vector<uint64_t>{8ull << 20, 16ull << 20, 32ull << 20, 64ull << 20};
      for (uint64_t c : chunks) {
        with([&](policy::Policy& p) {
          if (p.schedule == policy::Schedule::kSideStream || p.schedule == policy::Schedule::kSerial)
            p.bulk_streams = 2;
          p.schedule = policy::Schedule::kChunked;
          p.chunk_bytes = c;
          p.max_copies_in_flight = 0;
        });
      }
      with([&](policy::Policy& p) {
        if (p.schedule == policy::Schedule::kSideStream || p.schedule == policy::Schedule::kSerial) p.bulk_streams = 2;
        p.schedule = policy::Schedule::kGeometric;
        p.ratio = 0.5;
        p.min_chunk_bytes = 1ull << 20;
        p.first_chunk_bytes = 0;
        p.max_copies_in_flight = 0;
      });
      if (!s_.quick) {
        with([&](policy::Policy& p) {
          p.schedule = policy::Schedule::kSideStream;
          p.bulk_streams = 1;
          p.max_copies_in_flight = 0;
        });
      }
      break;
    }
    case 1:
      if (at.schedule == policy::Schedule::kSideStream || at.schedule == policy::Schedule::kSerial) break;
      for (uint32_t n : s_.quick ? std::vector<uint32_t>{1, 2} : std::vector<uint32_t>{1, 2, 4}) {
        with([&](policy::Policy& p) { p.bulk_streams = n; });
      }
      break;
    case 2:
      for (uint64_t t : {256ull << 10, 1ull << 20, 4ull << 20})
        with([&](policy::Policy& p) { p.batch_threshold_bytes = t; });
      break;
    case 3:
      for (auto pr : {policy::StreamPriority::kLeast, policy::StreamPriority::kGreatest}) {
        with([&](policy::Policy& p) { p.bulk_priority = pr; });
      }
      break;
  }
  return out;
}

std::string Tuner::ReportJson() const {
  std::ostringstream j;
  const std::vector<int> looks = AbLooks(s_.rule);
  j << "{\n  \"format\": \"ferry-tune-report/2\",\n  \"issued_at\": " << json::String(issued_at_)
    << ",\n  \"engine\": " << json::String(engine_kind_) << ",\n  \"environment\": {";
  for (size_t i = 0; i < env_.size(); ++i)
    j << (i ? ", " : "") << json::String(env_[i].first) << ": " << json::String(env_[i].second);
  j << "},\n  \"previous\": ";
  if (had_previous_)
    j << "{\"issued_at\": " << json::String(previous_issued_) << "}";
  else
    j << "null";
  j << ",\n  \"environment_changes\": [";
  for (size_t i = 0; i < env_changes_.size(); ++i) j << (i ? ", " : "") << json::String(env_changes_[i]);
  j << "],\n  \"rule\": {\"statistic\": \"20% trimmed mean of the paired differences B - A over A's trimmed mean "
       "score\", "
    << "\"interval\": \"Yuen's paired t: Student's t with n - 2g - 1 degrees of freedom (g = floor(0.2 n)) on the "
       "winsorized variance, Bonferroni over the looks\", "
    << "\"order\": \"A then B in one overlap run, B then A in the next, alternating\", \"confidence\": "
    << json::Number(s_.rule.confidence) << ", \"min_effect\": " << json::Number(s_.rule.min_effect)
    << ", \"min_pairs\": " << s_.rule.min_pairs << ", \"max_pairs\": " << s_.rule.max_pairs << ", \"looks\": [";
  for (size_t i = 0; i < looks.size(); ++i) j << (i ? ", " : "") << looks[i];
  j << "]},\n  \"setting_changes\": [";
  for (size_t i = 0; i < setting_changes_.size(); ++i) j << (i ? ", " : "") << json::String(setting_changes_[i]);
  j << "],\n  \"kept_changes\": [";
  bool first = true;
  for (const Comparison& c : comparisons_) {
    if (!c.kept) continue;
    j << (first ? "" : ", ") << "{\"change\": " << json::String(c.change)
      << ", \"difference\": " << json::Number(c.ab.difference) << ", \"interval\": [" << json::Number(c.ab.low) << ", "
      << json::Number(c.ab.high) << "], \"pairs\": " << c.ab.pairs << ", \"reason\": " << json::String(c.ab.reason)
      << "}";
    first = false;
  }
  j << "],\n  \"noise_floor\": " << ComparisonJson(*noise_) << ",\n";
  if (StartedFromLastTune())
    j << "  \"previous_tuned\": {\"policy_hash\": " << json::String(previous_->Hash())
      << ", \"checks_passed\": " << (noise_->checks_passed ? "true" : "false") << "},\n";
  j << "  \"candidates\": [\n";
  for (size_t i = 0; i < comparisons_.size(); ++i)
    j << "    " << ComparisonJson(comparisons_[i]) << (i + 1 < comparisons_.size() ? "," : "") << "\n";
  j << "  ],\n  \"overlap_runs\": " << pairs_run_ << ",\n  \"tune_seconds\": " << json::Number(seconds_)
    << ",\n  \"policy_hash\": " << json::String(tuned_->Hash())
    << ",\n  \"policy_canonical\": " << json::String(tuned_->Canonical())
    << ",\n  \"policy_yaml\": " << json::String(tuned_->ToYaml()) << "\n}\n";
  return j.str();
}

void Tuner::PrintText(const std::string& start_label) const {
  std::printf("tune on");
  for (const auto& [k, v] : env_) std::printf(" %s %s,", k.c_str(), v.c_str());
  std::printf(" started from %s\n", start_label.c_str());
  if (!had_previous_) {
    std::printf("no earlier tune beside %s: nothing to compare the environment with\n", s_.out.c_str());
  } else if (env_changes_.empty()) {
    std::printf("environment unchanged since the last tune (%s)\n", previous_issued_.c_str());
  } else {
    std::printf("environment changed since the last tune (%s):\n", previous_issued_.c_str());
    for (const auto& c : env_changes_) std::printf("  %s\n", c.c_str());
  }
  const AbResult& nf = noise_->ab;
  std::printf(
      "\nnoise floor, the start against itself: %s %s over %d pairs; one pair's difference varies by %.1f%% (sd)\n",
      Pct(nf.difference).c_str(), Interval(nf).c_str(), nf.pairs, nf.pair_sd * 100);
  if (nf.verdict == AbVerdict::kBetter || nf.verdict == AbVerdict::kWorse ||
      nf.verdict == AbVerdict::kNotWorthChanging) {
    std::printf(
        "warning: the start differed from itself beyond its interval: this machine's timing drifted during "
        "the run; run again on a quiet machine before trusting a change\n");
  }
  if ((nf.high - nf.low) / 2 > s_.rule.min_effect) {
    std::printf(
        "note: the noise floor's interval is wider than the minimum effect (%.1f%%): smaller gains cannot be "
        "told from this machine's noise in %d pairs\n",
        s_.rule.min_effect * 100, nf.pairs);
  }
  std::printf(
      "rule: keep a change when its interval lies below zero and it gains at least %.1f%%; pairs at %d..%d, "
      "intervals at %.2f%% per look (99%% over the looks)\n\n",
      s_.rule.min_effect * 100, s_.rule.min_pairs, s_.rule.max_pairs,
      AbLevel(s_.rule) * 100);
  std::printf("%-50s %9s %9s %8s %18s %5s  %s\n", "candidate (change from the best so far)", "A ms", "B ms", "B - A",
              "interval", "pairs", "verdict");
  for (const Comparison& c : comparisons_) {
    const std::string label = c.label.size() > 50 ? c.label.substr(0, 47) + "..." : c.label;
    std::printf("%-50s %9.3f %9.3f %8s %18s %5d  %s\n", label.c_str(), c.ab.mean_a * 1e3, c.ab.mean_b * 1e3,
                Pct(c.ab.difference).c_str(), Interval(c.ab).c_str(), c.ab.pairs, c.verdict.c_str());
  }
  std::printf(
      "(A: the best so far, B: the candidate; scores are exposed copy time, pipelined + in-step, in ms, means\n"
      "over the pairs; B - A in percent of A; a kept change's %s copy was not over 3%% slower than A's)\n",
      FormatByteSize(s_.max_size).c_str());
  for (const Comparison& c : comparisons_) {
    if (c.checks_passed && c.ab.verdict != AbVerdict::kMorePairs)
      std::printf("  %s: %s\n", c.label.c_str(), c.ab.reason.c_str());
  }
  std::printf("\n");
  if (setting_changes_.empty()) {
    std::printf("settings unchanged from %s: no candidate gained %.1f%% or more with an interval below zero\n",
                StartedFromLastTune() ? "the last tune" : "the start",
                s_.rule.min_effect * 100);
    if (!env_changes_.empty()) std::printf("the last tune's settings still hold after the environment change\n");
  } else {
    std::printf("settings changed (%s -> new tune)%s:\n",
                StartedFromLastTune() ? "last tune" : "start",
                env_changes_.empty() ? "" : " after the environment change");
    for (const auto& c : setting_changes_) std::printf("  %s\n", c.c_str());
    std::printf("each kept because:\n");
    for (const Comparison& c : comparisons_) {
      if (c.kept)
        std::printf("  %s: %s %s over %d pairs\n", c.change.c_str(), Pct(c.ab.difference).c_str(),
                    Interval(c.ab).c_str(), c.ab.pairs);
    }
  }
  std::printf("tune time: %.1f s (%d overlap runs)\n", seconds_, pairs_run_);
  std::printf("wrote %s (hash %s) and %s.tune.json%s\n", s_.out.c_str(), tuned_->Hash().c_str(), s_.out.c_str(),
              s_.key.empty() ? "" : " (signed: .minisig)");
  std::printf(s_.apply ? "applied to ferryd\n" : "apply with: ferryctl policy apply %s\n", s_.out.c_str());
}

int Tuner::Run() {
  const double t0 = NowSeconds();
  if (s_.max_size == 0) s_.max_size = s_.quick ? (4u << 20) : (64u << 20);
  issued_at_ = IsoTimeUtcNow();
  if (Status st = control_.Open(s_.socket); !st.ok()) return Fail(st.ToString());
  auto running = control_.RunningPolicyText(/*as_yaml=*/true);
  if (!running.ok()) return Fail(running.status().ToString());
  original_yaml_ = *running;
  auto e = MakeEngine("auto", s_.socket, s_.n);
  if (!e.ok()) return Fail(e.status().ToString());
  engine_ = std::move(*e);

  // The last tune: its report beside --out.
  const std::string report_path = s_.out + ".tune.json";
  std::shared_ptr<const policy::Policy> previous;
  std::map<std::string, std::string> previous_env;
  if (::access(report_path.c_str(), R_OK) == 0) {
    std::ifstream in(report_path);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    auto root = yamlutil::LoadString(text, report_path);
    if (!root.ok()) return Fail("the last tune's report " + report_path + ": " + root.status().message());
    try {
      const std::string format = (*root)["format"].as<std::string>();
      if (format != "ferry-tune-report/1" && format != "ferry-tune-report/2")
        return Fail(report_path + " is not a tune report");
      for (const auto& kv : (*root)["environment"])
        previous_env[kv.first.as<std::string>()] = kv.second.as<std::string>();
      previous_issued_ = (*root)["issued_at"].as<std::string>();
      auto p = policy::ParsePolicy((*root)["policy_yaml"].as<std::string>(), report_path + " (policy_yaml)");
      if (!p.ok()) return Fail(p.status().message());
      previous = *p;
      had_previous_ = true;
    } catch (const YAML::Exception& ex) {
      return Fail("the last tune's report " + report_path + " is incomplete: " + ex.what());
    }
  }
  previous_ = previous;
  std::shared_ptr<const policy::Policy> start;
  std::string start_label;
  if (!s_.start.empty()) {
    auto p = policy::LoadPolicyFile(s_.start);
    if (!p.ok()) return Fail(p.status().message());
    start = *p;
    start_label = s_.start;
  } else if (previous) {
    start = previous;
    start_label = "the last tune (" + previous_issued_ + ")";
  } else {
    auto p = policy::ParsePolicy(original_yaml_, "the running policy");
    if (!p.ok()) return Fail(p.status().message());
    start = *p;
    start_label = "the running policy (" + start->name + ")";
  }

  size_t total = 1;
  for (int d = 0; d < 4; ++d) total += s_.dims[d] ? Alternatives(*start, d).size() : 0;
  progress_ = std::make_unique<Progress>(total * static_cast<size_t>(s_.rule.min_pairs));  // an estimate

  // The run's own noise: the start against itself, by the same rule, at its first two looks (a
  // measure, not a decision: it need not run to the most pairs where the machine is noisy).
  AbRule noise_rule = s_.rule;
  noise_rule.max_pairs = std::min(s_.rule.max_pairs, 2 * s_.rule.min_pairs);
  auto noise = Compare("noise floor: the start against itself", "start: " + start_label, start, start, noise_rule);
  if (!noise.ok()) return Fail(noise.status().ToString());
  if (!noise->checks_passed)
    return Fail("the starting policy fails the correctness checks (" + noise->check_failure +
                "); not tuning on a broken setup");
  noise_ = *noise;
  if (Status st = Sweep(*noise_); !st.ok()) return Fail(st.ToString());

  // Coordinate descent: each candidate against the best so far; a change is kept on the rule's
  // "better" (and the bandwidth guard) and becomes the best the next candidates face.
  std::shared_ptr<const policy::Policy> best = start;
  for (int d = 0; d < 4; ++d) {
    if (!s_.dims[d]) continue;
    // Each against the best as it is now: a change kept earlier in this setting may have made
    // a candidate the best already, or changed what it differs in ("key: old -> new; ...").
    for (const auto& candidate : Alternatives(*best, d)) {
      std::string change;
      for (const auto& diff : policy::DiffPolicies(*best, *candidate)) change += (change.empty() ? "" : "; ") + diff;
      if (change.empty()) continue;
      auto c = Compare(std::string(kDimNames[d]) + ": " + ShortLabel(*candidate, d), change, best, candidate, s_.rule);
      if (!c.ok()) return Fail(c.status().ToString());
      if (c->checks_passed && c->ab.verdict == AbVerdict::kBetter) {
        if (Status st = GuardBandwidth(*c, *best); !st.ok()) return Fail(st.ToString());
        if (c->bandwidth.verdict == AbVerdict::kWorse && c->bandwidth.difference > 0.03) {
          c->verdict = "rejected: better, but its largest copy is " + Pct(c->bandwidth.difference) + " slower " +
                       Interval(c->bandwidth);
        } else {
          c->verdict = "better: kept";
          c->kept = true;
          best = candidate;
        }
      }
      comparisons_.push_back(std::move(*c));
    }
  }
  auto tuned = std::make_shared<policy::Policy>(*best);
  tuned->name = "tuned";
  {
    std::string chip;
    for (const auto& [k, v] : env_) {
      if (k == "chip") chip = v;
    }
    char d[200];
    std::snprintf(d, sizeof d, "tuned by ferryctl tune on %s, %s", chip.c_str(), issued_at_.c_str());
    tuned->description = d;
  }
  tuned_ = tuned;

  for (const auto& [k, v] : env_) {
    auto it = previous_env.find(k);
    if (!had_previous_) break;
    if (it == previous_env.end())
      env_changes_.push_back(k + ": (not recorded) -> " + v);
    else if (it->second != v)
      env_changes_.push_back(k + ": " + it->second + " -> " + v);
  }
  // What this run changed and measured: from its start.
  for (const std::string& c : policy::DiffPolicies(*start, *tuned)) {
    if (c.rfind("name:", 0) != 0 && c.rfind("description:", 0) != 0) setting_changes_.push_back(c);
  }
  seconds_ = NowSeconds() - t0;

  // Write the policy, then its report (signed), then say what happened.
  const std::string policy_file =
      "# " + tuned->description + "\n# hash " + tuned->Hash() + "; report: " + report_path + "\n" + tuned->ToYaml();
  if (Status st = WriteWholeFile(s_.out, policy_file); !st.ok()) return Fail(st.message());
  const std::string report = ReportJson();
  if (Status st = WriteWholeFile(report_path, report); !st.ok()) return Fail(st.message());
  if (!s_.key.empty()) {
    if (Status st = SignFile(report_path, report, s_.key, "tune"); !st.ok())
      return Fail("signing the report: " + st.ToString());
  }
  if (s_.apply) {
    auto r = control_.ApplyPolicyText(tuned->ToYaml(), s_.out);
    if (!r.ok()) return Fail("applying the tuned policy: " + r.status().ToString());
  }
  if (s_.json) {
    std::fputs(report.c_str(), stdout);
    return 0;
  }
  PrintText(start_label);
  return 0;
}

}  // namespace

int Tune(const std::vector<std::string>& args) {
  TuneSettings s;
  int max_pairs = 0;
  cli::Args a(args);
  while (a.Next()) {
    if (a.IsHelp()) {
      return cli::Help(kUsage);
    } else if (a.Is("--socket")) {
      s.socket = a.Value();
    } else if (a.Is("--out")) {
      s.out = a.Value();
    } else if (a.Is("--start")) {
      s.start = a.Value();
    } else if (a.Is("--sign-key")) {
      s.key = a.Value();
    } else if (a.Is("--apply")) {
      s.apply = true;
    } else if (a.Is("--quick")) {
      s.quick = true;
    } else if (a.Is("--json")) {
      s.json = true;
    } else if (a.Is("--only")) {
      std::fill(std::begin(s.dims), std::end(s.dims), false);
      std::istringstream in(a.Value());
      for (std::string dim; std::getline(in, dim, ',');) {
        auto it = std::find(std::begin(kDimNames), std::end(kDimNames), dim);
        if (it == std::end(kDimNames))
          return Fail("--only takes settings among schedule, streams, batching, priority, not '" + dim + "'");
        s.dims[it - std::begin(kDimNames)] = true;
      }
    } else if (a.Is("--min-effect")) {
      const std::string v = a.Value();
      char* end = nullptr;
      const double pct = std::strtod(v.c_str(), &end);
      if (v.empty() || *end != '\0' || !(pct >= 0 && pct <= 90))
        return Fail("--min-effect takes a percentage, 0..90 (e.g. 5 or 2.5)");
      s.rule.min_effect = pct / 100;
    } else if (a.Is("--max-pairs")) {
      if (!a.IntValue(4, 200, max_pairs)) return Fail("--max-pairs takes 4..200");
    } else if (a.Is("--n")) {
      if (!a.IntValue(64, 16384, s.n)) return Fail("--n takes 64..16384");
    } else if (a.Is("--max-size")) {
      if (!a.ByteSizeValue(64 << 10, 1ull << 32, s.max_size)) return Fail("--max-size takes 64 KiB .. 4 GiB");
    } else {
      return Fail("unknown option '" + a.current() + "' (try --help)");
    }
  }
  if (s.out.empty()) return Fail("--out needs a file");
  if (max_pairs) s.rule.max_pairs = max_pairs;
  s.rule.min_effect_abs = 1e-6;  // a microsecond: below the clocks' resolution of a step
  if (Status st = ValidateAbRule(s.rule); !st.ok()) return Fail(st.message());
  return Tuner(std::move(s)).Run();
}

}  // namespace ferry::bench
