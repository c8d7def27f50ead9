// ferry's signed records on disk: a record (a snapshot ferryd wrote, or a report ferry-bench or
// ferryctl tune wrote) with its minisign signature beside it (RECORD.minisig); the names
// snapshots go by; and the check every reader makes of one before believing any of it
// (ferryctl verify, ferryctl report html, ferryd continuing its own chain). The trusted comment
// names the record: its id (signing::RecordId of the record's bytes) and, for a snapshot, its
// sequence; it is signed, so it is believed once the signature checks out.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/signing.hpp"
#include "ferry/status.hpp"

namespace ferry::signing {

std::string SnapshotTrustedComment(std::string_view record_id, uint64_t seq);   // "ferry snapshot ID seq N"
std::string ReportTrustedComment(std::string_view kind, std::string_view record_id);  // "ferry report KIND ID"

// What a verified record's trusted comment says.
struct SignedIdentity {
  bool is_report = false;
  std::string report_kind;  // a report's: "overlap", "tune"
  std::string id;           // the record id, checked against the record's bytes
  uint64_t seq = 0;         // a snapshot's sequence
};
// Checks `minisig` against `record` and `pk`, reads the trusted comment as a ferry snapshot's
// or report's (exactly as written above), and checks that the id it names is the record's.
Result<SignedIdentity> VerifyRecord(const PublicKey& pk, std::string_view record, std::string_view minisig);

// A record and its signature, read once. Whether it is a report or a snapshot is known only
// once VerifyRecord has checked it (the untrusted comment could say anything).
struct SignedFile {
  std::string path, record, minisig;
};
inline constexpr size_t kMaxMinisigBytes = 4096;
// Reads PATH and PATH.minisig, regular files only (symlinks refused unless follow_links: a record
// found in a directory is never read through a link, which could point at any file, a secret
// key included); a missing signature says "(no signature beside the record)".
Result<SignedFile> ReadSignedFile(const std::string& path, size_t max_record_bytes, bool follow_links = true);

std::string SnapshotName(uint64_t seq);  // snapshot-000042.json (six digits at least)
// The snapshots in `dir` by sequence, numerically (names are padded to six digits only, so
// seq 1000000 sorts before 999999 as text): (seq, name) of every entry named exactly
// SnapshotName(seq). `strays`: other names that look like one (snapshot-*.json), which ferryd
// never writes: a reader of the directory says so rather than pass over them in silence.
struct SnapshotListing {
  std::vector<std::pair<uint64_t, std::string>> snapshots;
  std::vector<std::string> strays;
};
Result<SnapshotListing> ListSnapshots(const std::string& dir);
// OK when `listing` of `dir` has no strays; else an error naming the first.
Status NoStrays(const std::string& dir, const SnapshotListing& listing);

}  // namespace ferry::signing
