#include "ferryctl/verify.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/cli.hpp"
#include "common/signed_records.hpp"
#include "common/signing.hpp"
#include "common/status_macros.hpp"
#include "common/yaml_util.hpp"

namespace ferry::ctl {
namespace {

int Fail(const std::string& what) { return cli::Fail("ferryctl", what); }

struct VerifiedRecord {
  std::string file, id, issued_at, policy, prev;
  std::string chain, chain_broken;  // format 2: the chain's id; on a new chain's head, why the last one ended
  uint64_t seq = 0;
  std::string hash;
  uint64_t copies = 0;
  double p99 = 0;
};

constexpr size_t kMaxSnapshotBytes = 1 << 20, kMaxReportBytes = 16 << 20;

// The rest of one snapshot's check, once its signature, trusted comment and record id held
// (VerifyRecord gave `who`; nothing of the record is believed before): its size, format,
// sequence and key as the record states them.
Result<VerifiedRecord> VerifyOne(const signing::PublicKey& pk, const signing::SignedFile& in,
                                 const signing::SignedIdentity& who) {
  const std::string& file = in.path;
  const std::string& record = in.record;
  if (record.size() > kMaxSnapshotBytes) return InvalidArgument("larger than a snapshot can be (1 MiB)");
  VerifiedRecord v;
  v.file = file;
  v.id = who.id;
  v.seq = who.seq;
  auto root = yamlutil::LoadString(record, file);
  if (!root.ok()) return root.status();
  try {
    const YAML::Node& r = *root;
    const std::string format = r["format"].as<std::string>();
    if (format != "ferry-snapshot/1" && format != "ferry-snapshot/2" && format != "ferry-snapshot/3") {
      return InvalidArgument("unknown record format");
    }
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

}  // namespace

int Verify(const std::vector<std::string>& args) {
  std::string pub;
  bool json = false, allow_missing_head = false;
  std::optional<uint64_t> from_seq, expect_seq;
  std::string expect_id;
  auto number = [](const std::string& text, uint64_t* out) {
    long long v = 0;
    if (!cli::Args::ParseInt(text, 1, std::numeric_limits<long long>::max(), v)) return false;
    *out = static_cast<uint64_t>(v);
    return true;
  };
  std::vector<std::string> files;
  cli::Args a(args);
  while (a.Next()) {
    if (a.Is("--pub") && a.HasValue()) {
      pub = a.Value();
    } else if (a.Is("--json")) {
      json = true;
    } else if (a.Is("--allow-missing-head")) {
      allow_missing_head = true;
    } else if (a.Is("--from-seq") && a.HasValue()) {
      const std::string v = a.Value();
      uint64_t n = 0;
      if (!number(v, &n)) return Fail("--from-seq takes a sequence number (1 or more), not '" + v + "'");
      from_seq = n;
    } else if (a.Is("--expect-latest") && a.HasValue()) {
      const std::string v = a.Value();
      const size_t colon = v.find(':');
      uint64_t n = 0;
      if (!number(v.substr(0, colon), &n)) {
        return Fail("--expect-latest takes SEQ or SEQ:RECORD_ID (from ferryd's ferry_snapshot_latest_* metrics), not '" + v + "'");
      }
      expect_seq = n;
      if (colon != std::string::npos) expect_id = v.substr(colon + 1);
    } else if (a.current().rfind("--", 0) == 0) {
      return Fail("verify: unknown option " + a.current() + " (try --help)");
    } else {
      files.push_back(a.current());
    }
  }
  if (pub.empty() || files.empty()) return Fail("verify needs --pub KEY and at least one record or directory");
  auto pk = signing::LoadPublicKey(pub);
  if (!pk.ok()) return Fail(pk.status().message());
  // Records named on the command line are read as given; those found in a directory never
  // through a link, and a name there that looks like a snapshot's but is not ferryd's fails.
  std::vector<std::pair<std::string, bool>> records;  // path, follow links
  for (const auto& f : files) {
    struct stat st{};
    if (::stat(f.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
      auto in_dir = signing::ListSnapshots(f);
      if (!in_dir.ok()) return Fail("FAILED: " + in_dir.status().message());
      if (Status st = signing::NoStrays(f, *in_dir); !st.ok()) {
        return Fail("FAILED: " + st.message() + ", or name the records to check");
      }
      for (auto& [seq, name] : in_dir->snapshots) records.emplace_back(f + "/" + name, false);
    } else {
      records.emplace_back(f, true);
    }
  }
  // Each record's signature first; a signed report (bench overlap, tune) then stands alone: a
  // signature and a record id, no chain.
  std::vector<std::pair<signing::SignedFile, signing::SignedIdentity>> snapshots;
  int reports = 0;
  for (const auto& [f, follow] : records) {
    auto in = signing::ReadSignedFile(f, kMaxReportBytes, follow);
    if (!in.ok()) return Fail("FAILED: " + f + ": " + in.status().message());
    auto who = signing::VerifyRecord(*pk, in->record, in->minisig);
    if (!who.ok()) return Fail("FAILED: " + f + ": " + who.status().message());
    if (!who->is_report) {
      snapshots.emplace_back(std::move(*in), std::move(*who));
      continue;
    }
    ++reports;
    if (!json) {
      std::printf("verified %s: report %s %s, signed by key %s\n", f.c_str(), who->report_kind.c_str(), who->id.c_str(),
                  signing::KeyIdHex(pk->id).c_str());
    }
  }
  if (reports > 0 && snapshots.empty()) {
    if (json) std::printf("{\"ok\":true,\"key_id\":\"%s\",\"reports\":%d}\n", signing::KeyIdHex(pk->id).c_str(), reports);
    return 0;
  }
  if (snapshots.empty()) return Fail("no snapshot records found");
  // Every record on its own first; then what the set says: replays, order, gaps, chain.
  std::vector<VerifiedRecord> ok;
  for (const auto& [f, who] : snapshots) {
    auto v = VerifyOne(*pk, f, who);
    if (!v.ok()) return Fail("FAILED: " + f.path + ": " + v.status().message());
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

}  // namespace ferry::ctl
