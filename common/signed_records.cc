#include "common/signed_records.hpp"

#include <dirent.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>

#include "common/fd.hpp"
#include "common/status_macros.hpp"

namespace ferry::signing {

std::string SnapshotTrustedComment(std::string_view record_id, uint64_t seq) {
  return "ferry snapshot " + std::string(record_id) + " seq " + std::to_string(seq);
}

std::string ReportTrustedComment(std::string_view kind, std::string_view record_id) {
  return "ferry report " + std::string(kind) + " " + std::string(record_id);
}

Result<SignedIdentity> VerifyRecord(const PublicKey& pk, std::string_view record, std::string_view minisig) {
  FERRY_ASSIGN_OR_RETURN(std::string trusted, Verify(pk, record, minisig));
  SignedIdentity who;
  char a[64] = {0}, b[64] = {0};
  unsigned long long seq = 0;
  // Parsed, then written again and compared: nothing before, between or after the fields.
  if (std::sscanf(trusted.c_str(), "ferry report %63s %63s", a, b) == 2 && trusted == ReportTrustedComment(a, b)) {
    who.is_report = true;
    who.report_kind = a;
    who.id = b;
  } else if (std::sscanf(trusted.c_str(), "ferry snapshot %63s seq %llu", a, &seq) == 2 &&
             trusted == SnapshotTrustedComment(a, seq)) {
    who.id = a;
    who.seq = seq;
  } else {
    return InvalidArgument("trusted comment is not a ferry record's: '" + trusted + "'");
  }
  if (RecordId(record) != who.id) {
    return InvalidArgument("record id " + who.id + " does not match the record's hash");
  }
  return who;
}

Result<SignedFile> ReadSignedFile(const std::string& path, size_t max_record_bytes, bool follow_links) {
  SignedFile f;
  f.path = path;
  FERRY_ASSIGN_OR_RETURN(f.record, ReadWholeFile(path, max_record_bytes, follow_links));
  auto sig = ReadWholeFile(path + ".minisig", kMaxMinisigBytes, follow_links);
  if (!sig.ok()) return Status(sig.status().code(), sig.status().message() + " (no signature beside the record)");
  f.minisig = std::move(*sig);
  return f;
}

std::string SnapshotName(uint64_t seq) {
  char b[40];
  std::snprintf(b, sizeof b, "snapshot-%06" PRIu64 ".json", seq);
  return b;
}

Result<SnapshotListing> ListSnapshots(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return ErrnoStatus("open directory " + dir, errno);
  SnapshotListing found;
  while (dirent* e = ::readdir(d)) {
    const std::string_view name = e->d_name;
    if (!name.starts_with("snapshot-") || !name.ends_with(".json")) continue;
    unsigned long long n = 0;
    char tail[8] = {0};
    if (std::sscanf(e->d_name, "snapshot-%20llu.%5s", &n, tail) == 2 && std::string_view(tail) == "json" &&
        name == SnapshotName(n)) {
      found.snapshots.emplace_back(n, name);
    } else {
      found.strays.emplace_back(name);
    }
  }
  ::closedir(d);
  std::sort(found.snapshots.begin(), found.snapshots.end());
  std::sort(found.strays.begin(), found.strays.end());
  return found;
}

Status NoStrays(const std::string& dir, const SnapshotListing& listing) {
  if (listing.strays.empty()) return Status::Ok();
  return InvalidArgument(dir + "/" + listing.strays.front() +
                         " is not a name ferryd gives a snapshot (snapshot-NNNNNN.json, the sequence in at least six "
                         "digits); move it out of the directory");
}

}  // namespace ferry::signing
