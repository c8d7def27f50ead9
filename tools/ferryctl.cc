// ferryctl: the operator's tool for a running ferryd: status, and policies (apply, show, diff).
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/channel.hpp"
#include "common/fd.hpp"
#include "common/signing.hpp"
#include "common/yaml_util.hpp"
#include "daemon/policy.hpp"
#include "ferry/client.hpp"
#include "ferry/version.hpp"
#include "tools/bench_commands.hpp"
#include "tools/control.hpp"

namespace {

using namespace ferry;

constexpr const char* kUsage = R"(usage: ferryctl [--socket PATH] COMMAND ...

commands:
  status [--json]                 what the running ferryd is doing
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
  bench overlap [...]             the seed workload (matmul + its output's copy) in-process and
                                  through ferryd under each policy: exposed copy time, nine
                                  correctness checks, a signed report, a plot (--help for more)
  bench transfer [...]            pageable vs pinned vs ferry pool vs ferry staged copies over a
                                  size sweep (runs ferry-bench transfer; --help for more)
  tune [...]                      re-tune the policy on this GPU: sweep settings over the overlap
                                  workload and a transfer sweep, write the best policy, say what
                                  changed since the last tune (--help for more)
  version                         ferryctl's version

options:
  --socket PATH   ferryd's control socket (default: $FERRY_SOCKET or /run/ferry/ferryd.sock)
  -h, --help      this help
)";

int Fail(const std::string& what) {
  std::fprintf(stderr, "ferryctl: %s\n", what.c_str());
  return 1;
}

using tools::Control;

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
  auto p = daemon::LoadPolicyFile(args[0]);
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
  FERRY_ASSIGN_OR_RETURN(auto p, daemon::LoadPolicyFile(what));
  return p->Canonical();
}

int PolicyDiff(const std::vector<std::string>& args, const std::string& socket) {
  if (args.size() != 2) return Fail("policy diff takes two policies (files or \"running\")");
  auto a = CanonicalOf(args[0], socket);
  if (!a.ok()) return Fail(a.status().message());
  auto b = CanonicalOf(args[1], socket);
  if (!b.ok()) return Fail(b.status().message());
  const auto changed = daemon::DiffCanonical(*a, *b);
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
  auto local = daemon::LoadPolicyFile(file);
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
  ConnectOptions o;
  o.socket_path = socket;
  o.name = "ferryctl";
  auto client = Client::Connect(o);
  if (!client.ok()) return Fail(client.status().ToString());
  auto st = (*client)->Stats();
  if (!st.ok()) return Fail(st.status().ToString());
  Control c;
  std::string policy_line;
  if (c.Open(socket).ok()) {
    if (auto r = c.RunningPolicy(); r.ok()) policy_line = r->name + " (" + r->hash + ")";
  }
  const char* backend = (*client)->backend() == BackendKind::kCuda ? "cuda" : "host";
  if (json) {
    std::printf("{\"backend\":\"%s\",\"sessions\":%llu,\"copies_completed\":%llu,\"bytes_h2d\":%llu,\"bytes_d2h\":%llu,"
                "\"pool_bytes\":%llu,\"pool_free_bytes\":%llu,\"evictions\":%llu,\"rejected\":%llu,\"policy\":\"%s\"}\n",
                backend, (unsigned long long)st->sessions, (unsigned long long)st->copies_completed,
                (unsigned long long)st->bytes_h2d, (unsigned long long)st->bytes_d2h, (unsigned long long)st->pool_bytes,
                (unsigned long long)st->pool_free_bytes, (unsigned long long)st->evictions,
                (unsigned long long)st->rejected, policy_line.c_str());
    return 0;
  }
  std::printf("backend          %s\nclients          %llu (this one included)\ncopies done      %llu\n"
              "bytes h2d / d2h  %llu / %llu\npool             %llu MiB free of %llu MiB\nevictions        %llu\n"
              "rejected         %llu\npolicy           %s\n",
              backend, (unsigned long long)st->sessions, (unsigned long long)st->copies_completed,
              (unsigned long long)st->bytes_h2d, (unsigned long long)st->bytes_d2h,
              (unsigned long long)(st->pool_free_bytes >> 20), (unsigned long long)(st->pool_bytes >> 20),
              (unsigned long long)st->evictions, (unsigned long long)st->rejected, policy_line.c_str());
  return 0;
}

int Keygen(const std::vector<std::string>& args) {
  std::string dir = ".", name = "ferry";
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--dir" && i + 1 < args.size()) dir = args[++i];
    else if (args[i] == "--name" && i + 1 < args.size()) name = args[++i];
    else return Fail("keygen: unknown argument " + args[i]);
  }
  auto id = signing::GenerateKeyFiles(dir, name);
  if (!id.ok()) return Fail(id.status().ToString());
  std::printf("key id %s\nsecret key %s/%s.key (mode 0600: keep it on the node, put its path in snapshots.key)\n"
              "public key %s/%s.pub (give it to whoever checks the records)\n",
              signing::KeyIdHex(*id).c_str(), dir.c_str(), name.c_str(), dir.c_str(), name.c_str());
  return 0;
}

struct VerifiedRecord {
  std::string file, id, issued_at, policy, prev;
  std::string chain, chain_broken;  // format 2: the chain's id; on a new chain's head, why the last one ended
  uint64_t seq = 0;
  std::string hash;
  uint64_t copies = 0;
  double p99 = 0;
};

// A record and its .minisig, read once.
struct SignedFile {
  std::string file, record, sig;
  bool is_report() const { return sig.find("trusted comment: ferry report ") != std::string::npos; }
};

constexpr size_t kMaxSnapshotBytes = 1 << 20, kMaxReportBytes = 16 << 20;

Result<SignedFile> ReadSigned(const std::string& file) {
  UniqueFd rf(::open(file.c_str(), O_RDONLY | O_CLOEXEC));
  if (!rf.valid()) return NotFound(file + ": " + std::strerror(errno));
  SignedFile f{file, "", ""};
  FERRY_ASSIGN_OR_RETURN(f.record, ReadWholeFd(rf.get(), kMaxReportBytes));
  UniqueFd sf(::open((file + ".minisig").c_str(), O_RDONLY | O_CLOEXEC));
  if (!sf.valid()) return NotFound(file + ".minisig: " + std::strerror(errno) + " (no signature)");
  FERRY_ASSIGN_OR_RETURN(f.sig, ReadWholeFd(sf.get(), 4096));
  return f;
}

// Verifies one snapshot: signature, trusted comment, record id, key id. Nothing of the record
// is believed before its signature checks out.
Result<VerifiedRecord> VerifyOne(const signing::PublicKey& pk, const SignedFile& in) {
  const std::string& file = in.file;
  const std::string& record = in.record;
  if (record.size() > kMaxSnapshotBytes) return InvalidArgument("larger than a snapshot can be (1 MiB)");
  FERRY_ASSIGN_OR_RETURN(std::string trusted, signing::Verify(pk, record, in.sig));
  VerifiedRecord v;
  v.file = file;
  char id[64] = {0};
  unsigned long long seq = 0;
  if (std::sscanf(trusted.c_str(), "ferry snapshot %40s seq %llu", id, &seq) != 2) {
    return InvalidArgument("trusted comment is not a ferry snapshot's: '" + trusted + "'");
  }
  v.id = id;
  v.seq = seq;
  if (signing::RecordId(record) != v.id) return InvalidArgument("record id " + v.id + " does not match the record's hash");
  auto root = yamlutil::LoadString(record, file);
  if (!root.ok()) return root.status();
  try {
    const YAML::Node& r = *root;
    const std::string format = r["format"].as<std::string>();
    if (format != "ferry-snapshot/1" && format != "ferry-snapshot/2") return InvalidArgument("unknown record format");
    if (r["seq"].as<uint64_t>() != v.seq) return InvalidArgument("sequence in the record differs from the signed one");
    if (r["key_id"].as<std::string>() != signing::KeyIdHex(pk.id)) return InvalidArgument("record names another key");
    v.issued_at = r["issued_at"].as<std::string>();
    v.policy = r["policy"]["name"].as<std::string>() + " (" + r["policy"]["hash"].as<std::string>() + ")";
    v.prev = r["prev_sha256"].as<std::string>();
    if (format == "ferry-snapshot/1") {
      v.copies = r["metrics"]["copies"].as<uint64_t>();
      v.p99 = r["metrics"]["exposed_p99_seconds"].as<double>();
    } else {
      v.copies = r["measured_by_ferryd"]["copies"].as<uint64_t>();
      v.p99 = r["reported_by_clients"]["exposed_p99_seconds"].as<double>();
      v.chain = r["chain"].as<std::string>();
      if (r["previous_chain_broken"]) v.chain_broken = r["previous_chain_broken"].as<std::string>();
    }
  } catch (const YAML::Exception& e) {
    return InvalidArgument(std::string("record is not a complete ferry snapshot: ") + e.what());
  }
  v.hash = signing::Sha256Hex(record);
  return v;
}

// A signed report (bench overlap, tune): "report KIND RECORD-ID" once its signature and id
// check out.
Result<std::string> VerifyReport(const signing::PublicKey& pk, const SignedFile& in) {
  const std::string& record = in.record;
  FERRY_ASSIGN_OR_RETURN(std::string trusted, signing::Verify(pk, record, in.sig));
  char kind[32] = {0}, id[64] = {0};
  if (std::sscanf(trusted.c_str(), "ferry report %31s %63s", kind, id) != 2) {
    return InvalidArgument("trusted comment is not a ferry report's: '" + trusted + "'");
  }
  if (signing::RecordId(record) != id) return InvalidArgument(std::string("record id ") + id + " does not match the report's hash");
  return std::string("report ") + kind + " " + id;
}

int Verify(const std::vector<std::string>& args) {
  std::string pub;
  bool json = false, allow_missing_head = false;
  std::optional<uint64_t> from_seq, expect_seq;
  std::string expect_id;
  auto number = [](const std::string& text, uint64_t* out) {
    char* end = nullptr;
    errno = 0;
    const unsigned long long v = std::strtoull(text.c_str(), &end, 10);
    if (text.empty() || text[0] == '-' || *end != '\0' || errno != 0) return false;
    *out = v;
    return true;
  };
  std::vector<std::string> files;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--pub" && i + 1 < args.size()) {
      pub = args[++i];
    } else if (args[i] == "--json") {
      json = true;
    } else if (args[i] == "--allow-missing-head") {
      allow_missing_head = true;
    } else if (args[i] == "--from-seq" && i + 1 < args.size()) {
      uint64_t n = 0;
      if (!number(args[++i], &n) || n == 0) return Fail("--from-seq takes a sequence number (1 or more), not '" + args[i] + "'");
      from_seq = n;
    } else if (args[i] == "--expect-latest" && i + 1 < args.size()) {
      const std::string v = args[++i];
      const size_t colon = v.find(':');
      uint64_t n = 0;
      if (!number(v.substr(0, colon), &n) || n == 0) {
        return Fail("--expect-latest takes SEQ or SEQ:RECORD_ID (from ferryd's ferry_snapshot_latest_* metrics), not '" + v + "'");
      }
      expect_seq = n;
      if (colon != std::string::npos) expect_id = v.substr(colon + 1);
    } else if (args[i].rfind("--", 0) == 0) {
      return Fail("verify: unknown option " + args[i] + " (try --help)");
    } else {
      files.push_back(args[i]);
    }
  }
  if (pub.empty() || files.empty()) return Fail("verify needs --pub KEY and at least one record or directory");
  auto pk = signing::LoadPublicKey(pub);
  if (!pk.ok()) return Fail(pk.status().message());
  std::vector<std::string> records;
  for (const auto& f : files) {
    struct stat st{};
    if (::stat(f.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
      // In sequence order, not name order: names are padded to six digits only.
      std::vector<std::pair<uint64_t, std::string>> in_dir;
      if (DIR* d = ::opendir(f.c_str())) {
        while (dirent* e = ::readdir(d)) {
          std::string n = e->d_name;
          if (n.rfind("snapshot-", 0) == 0 && n.size() > 5 && n.substr(n.size() - 5) == ".json") {
            in_dir.emplace_back(std::strtoull(n.c_str() + 9, nullptr, 10), f + "/" + n);
          }
        }
        ::closedir(d);
      }
      std::sort(in_dir.begin(), in_dir.end());
      for (auto& [seq, path] : in_dir) records.push_back(std::move(path));
    } else {
      records.push_back(f);
    }
  }
  // Signed reports (bench overlap, tune) stand alone: a signature and a record id, no chain.
  std::vector<SignedFile> snapshots;
  int reports = 0;
  for (const auto& f : records) {
    auto in = ReadSigned(f);
    if (!in.ok()) return Fail("FAILED: " + f + ": " + in.status().message());
    if (!in->is_report()) {
      snapshots.push_back(std::move(*in));
      continue;
    }
    auto r = VerifyReport(*pk, *in);
    if (!r.ok()) return Fail("FAILED: " + f + ": " + r.status().message());
    ++reports;
    if (!json) std::printf("verified %s: %s, signed by key %s\n", f.c_str(), r->c_str(), signing::KeyIdHex(pk->id).c_str());
  }
  if (reports > 0 && snapshots.empty()) {
    if (json) std::printf("{\"ok\":true,\"key_id\":\"%s\",\"reports\":%d}\n", signing::KeyIdHex(pk->id).c_str(), reports);
    return 0;
  }
  if (snapshots.empty()) return Fail("no snapshot records found");
  // Every record's own signature first; then what the set says: replays, order, gaps, chain.
  std::vector<VerifiedRecord> ok;
  for (const SignedFile& f : snapshots) {
    auto v = VerifyOne(*pk, f);
    if (!v.ok()) return Fail("FAILED: " + f.file + ": " + v.status().message());
    ok.push_back(std::move(*v));
  }
  std::map<uint64_t, std::string> by_seq;
  for (const auto& v : ok) {
    auto [it, fresh] = by_seq.emplace(v.seq, v.file);
    if (!fresh) {
      return Fail("FAILED: " + v.file + ": sequence " + std::to_string(v.seq) + " again, as in " + it->second +
                  " (replayed record)");
    }
  }
  for (size_t i = 1; i < ok.size(); ++i) {
    if (ok[i].seq < ok[i - 1].seq) {
      return Fail("FAILED: " + ok[i].file + ": sequence " + std::to_string(ok[i].seq) + " after " +
                  std::to_string(ok[i - 1].seq) + " (records out of order)");
    }
  }
  const std::string no_prev(64, '0');
  // A chain's head: seq 1, or the first record of a chain ferryd started because the one before
  // did not verify (it says why). Either names no previous record.
  auto is_head = [&](const VerifiedRecord& v) { return v.prev == no_prev && (v.seq == 1 || !v.chain_broken.empty()); };
  std::vector<std::string> notes;
  for (size_t i = 1; i < ok.size(); ++i) {
    const VerifiedRecord &p = ok[i - 1], &v = ok[i];
    if (is_head(v)) {
      notes.push_back("a new chain " + v.chain + " starts at sequence " + std::to_string(v.seq) + " (" + v.file +
                      "): ferryd says the chain before it broke: " + v.chain_broken);
      continue;
    }
    if (v.seq != p.seq + 1) {
      return Fail("FAILED: " + v.file + ": sequence " + std::to_string(v.seq) + " follows " + std::to_string(p.seq) +
                  " (records " + std::to_string(p.seq + 1) + ".." + std::to_string(v.seq - 1) + " missing)");
    }
    if (v.prev != p.hash) return Fail("FAILED: " + v.file + ": its previous-record hash is not " + p.file + "'s (chain broken)");
  }
  const VerifiedRecord& first = ok.front();
  if (first.seq == 1 && first.prev != no_prev) {
    return Fail("FAILED: " + first.file + ": the first record of a chain must not name a previous one");
  }
  if (from_seq && first.seq != *from_seq) {
    return Fail("FAILED: " + first.file + ": the records start at sequence " + std::to_string(first.seq) +
                ", not at " + std::to_string(*from_seq) + " as --from-seq says");
  }
  if (!from_seq && !allow_missing_head && !is_head(first)) {
    return Fail("FAILED: " + first.file + ": sequence " + std::to_string(first.seq) +
                " is not the head of its chain (records before it are missing); if they were removed on purpose, "
                "say where the records start: --from-seq " + std::to_string(first.seq));
  }
  if (expect_seq) {
    auto it = std::find_if(ok.begin(), ok.end(), [&](const VerifiedRecord& v) { return v.seq == *expect_seq; });
    if (it == ok.end()) {
      return Fail("FAILED: the expected latest record, sequence " + std::to_string(*expect_seq) +
                  ", is not there (the newest given is " + std::to_string(ok.back().seq) +
                  "): records were deleted, or the wrong directory was given");
    }
    if (!expect_id.empty() && it->id != expect_id) {
      return Fail("FAILED: " + it->file + ": sequence " + std::to_string(*expect_seq) + " is record " + it->id +
                  ", not the expected " + expect_id);
    }
  }
  for (const std::string& n : notes) std::fprintf(stderr, "ferryctl: note: %s\n", n.c_str());
  if (json) {
    std::printf("{\"ok\":true,\"key_id\":\"%s\",\"records\":[", signing::KeyIdHex(pk->id).c_str());
    for (size_t i = 0; i < ok.size(); ++i) {
      std::printf("%s{\"file\":\"%s\",\"id\":\"%s\",\"seq\":%llu,\"issued_at\":\"%s\",\"sha256\":\"%s\"}",
                  i ? "," : "", ok[i].file.c_str(), ok[i].id.c_str(), (unsigned long long)ok[i].seq,
                  ok[i].issued_at.c_str(), ok[i].hash.c_str());
    }
    std::printf("]}\n");
    return 0;
  }
  for (const auto& v : ok) {
    std::printf("verified %s  seq %llu  issued %s  policy %s  copies %llu  exposed p99 %.6f s\n", v.id.c_str(),
                (unsigned long long)v.seq, v.issued_at.c_str(), v.policy.c_str(), (unsigned long long)v.copies, v.p99);
  }
  std::printf("OK: %zu records signed by key %s, sequences %llu..%llu, hash chain intact%s\n", ok.size(),
              signing::KeyIdHex(pk->id).c_str(), (unsigned long long)ok.front().seq, (unsigned long long)ok.back().seq,
              is_head(ok.front()) ? " from the chain's head" : " (from --from-seq / --allow-missing-head)");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string socket;
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (args.empty() && (a == "-h" || a == "--help")) {  // after a command: that command's help
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (a == "--socket" && i + 1 < argc) {
      socket = argv[++i];
      continue;
    }
    args.push_back(a);
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
  if (cmd == "bench" && !rest.empty()) {
    std::vector<std::string> bargs(rest.begin() + 1, rest.end());
    if (rest[0] == "overlap") return tools::BenchOverlap(bargs, socket);
    if (rest[0] == "transfer") return tools::BenchTransfer(bargs, socket);
  }
  if (cmd == "tune") return tools::Tune(rest, socket);
  if (cmd == "keygen") return Keygen(rest);
  if (cmd == "verify") return Verify(rest);
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
