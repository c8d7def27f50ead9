// Signed records as a buyer's `ferryctl verify` reads them, from arbitrary bytes: public key
// files, .minisig files, and records (common/signing, common/signed_records). Never a crash or a
// hang, and nothing is believed but what was signed: whatever the bytes, a signature that
// verifies does so over the signed record's exact bytes and returns its exact trusted comment.
// And a trusted comment is believed exactly as ferry writes it: signed with the fixture's key, a
// comment verifies if and only if it is SnapshotTrustedComment or ReportTrustedComment of what
// it names, naming the record's own id.
// The first byte says what the rest is:
//   0: a public key file's text;
//   1: a whole .minisig for the record below, checked against the key below;
//   2: edits to the record's real .minisig (triples of a two-byte position and a byte, replacing
//      that byte, or inserting it where the position's top bit is set; one or two bytes left
//      over cut the text there), so the search starts next to a valid signature;
//   3: edits to the record, checked against its real .minisig;
//   4: "record\0comment": the comment signed with the fixture's key over the record;
//   5: "record\0kind": the canonical comments for the record (a report of that kind, and a
//      snapshot of a sequence taken from the record's first bytes), signed: each must verify.
#include <sodium.h>

#include <cstddef>
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <string>
#include <string_view>

#include "common/signed_records.hpp"
#include "common/signing.hpp"

namespace {

using namespace ferry::signing;

struct Fixture {
  PublicKey pk;
  SecretKey sk;
  std::string record = "{\"format\": \"ferry-snapshot/3\", \"seq\": 7}\n";
  std::string trusted, minisig;
  Fixture() {
    if (sodium_init() < 0) __builtin_trap();
    uint8_t seed[crypto_sign_SEEDBYTES];
    for (size_t i = 0; i < sizeof seed; ++i) seed[i] = static_cast<uint8_t>(i * 7 + 1);
    for (size_t i = 0; i < sk.id.size(); ++i) sk.id[i] = static_cast<uint8_t>(0xA0 + i);
    crypto_sign_seed_keypair(pk.key.data(), sk.key(), seed);
    pk = PublicKeyOf(sk);
    trusted = SnapshotTrustedComment(RecordId(record), 7);
    auto sig = Sign(sk, record, trusted, "signature from a fuzzing key");
    if (!sig.ok()) __builtin_trap();
    minisig = *sig;
  }
};

const Fixture& F() {
  static const Fixture f;
  return f;
}

// Triples of a two-byte position and a byte applied to `text` (the position's top bit set:
// inserted there, else replacing); one or two bytes left over cut the text at their position.
std::string Edit(std::string text, const uint8_t* p, size_t n) {
  size_t i = 0;
  for (; i + 2 < n; i += 3) {
    const size_t at = (static_cast<size_t>(p[i] & 0x7f) << 8) | p[i + 1];
    if (p[i] & 0x80) {
      text.insert(text.begin() + static_cast<std::ptrdiff_t>(at % (text.size() + 1)), static_cast<char>(p[i + 2]));
    } else if (!text.empty()) {
      text[at % text.size()] = static_cast<char>(p[i + 2]);
    }
  }
  if (i < n) {
    const size_t at = i + 1 < n ? (static_cast<size_t>(p[i]) << 8 | p[i + 1]) : p[i];
    text.resize(std::min(text.size(), at));
  }
  return text;
}

// `comment` signed with the fixture's key over `record`: verified exactly when it is the
// canonical comment of what it names, for this record.
void CheckComment(const std::string& record, const std::string& comment) {
  const Fixture& f = F();
  auto sig = Sign(f.sk, record, comment, "fuzz");
  if (!sig.ok()) return;  // a comment minisign cannot carry (a line break)
  auto who = VerifyRecord(f.pk, record, *sig);
  const std::string id = RecordId(record);
  if (who.ok()) {
    if (who->id != id) __builtin_trap();
    const std::string rebuilt =
        who->is_report ? ReportTrustedComment(who->report_kind, who->id) : SnapshotTrustedComment(who->id, who->seq);
    if (rebuilt != comment) __builtin_trap();
  } else if (comment == SnapshotTrustedComment(id, 7) || comment == ReportTrustedComment("tune", id)) {
    __builtin_trap();
  }
}

// What may come of checking `record` against `minisig` with the fixture's key.
void Check(const std::string& record, const std::string& minisig) {
  const Fixture& f = F();
  auto trusted = Verify(f.pk, record, minisig);
  if (trusted.ok() && (record != f.record || *trusted != f.trusted)) __builtin_trap();
  auto who = VerifyRecord(f.pk, record, minisig);
  if (who.ok() != trusted.ok()) __builtin_trap();
  if (who.ok() && (who->is_report || who->seq != 7 || who->id != RecordId(f.record))) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const Fixture& f = F();
  const uint8_t* rest = data + 1;
  const size_t n = size - 1;
  const std::string text(reinterpret_cast<const char*>(rest), n);
  switch (data[0] % 6) {
    case 0:
      (void)ParsePublicKey(text);  // never a crash or a hang
      break;
    case 1:
      Check(f.record, text);
      break;
    case 2:
      Check(f.record, Edit(f.minisig, rest, n));
      break;
    case 3:
      Check(Edit(f.record, rest, n), f.minisig);
      break;
    case 4: {
      const size_t nul = text.find('\0');
      if (nul != std::string::npos) CheckComment(text.substr(0, nul), text.substr(nul + 1));
      break;
    }
    case 5: {
      const size_t nul = text.find('\0');
      if (nul == std::string::npos) break;
      const std::string record = text.substr(0, nul), kind = text.substr(nul + 1);
      uint64_t seq = 0;
      std::memcpy(&seq, record.data(), std::min(record.size(), sizeof seq));
      const std::string id = RecordId(record);
      auto snap = Sign(f.sk, record, SnapshotTrustedComment(id, seq), "fuzz");
      if (!snap.ok()) __builtin_trap();
      auto who = VerifyRecord(f.pk, record, *snap);
      if (!who.ok() || who->is_report || who->seq != seq || who->id != id) __builtin_trap();
      // A kind is one word of at most 63 characters, as bench and tune name theirs.
      const bool word = !kind.empty() && kind.size() <= 63 &&
                        kind.find_first_of(std::string(" \t\n\v\f\r\0", 7)) == std::string::npos;
      auto report = Sign(f.sk, record, ReportTrustedComment(kind, id), "fuzz");
      if (word && report.ok()) {
        auto r = VerifyRecord(f.pk, record, *report);
        if (!r.ok() || !r->is_report || r->report_kind != kind || r->id != id) __builtin_trap();
      }
      break;
    }
  }
  return 0;
}
