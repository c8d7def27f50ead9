// Signed records as a buyer's `ferryctl verify` reads them, from arbitrary bytes: public key
// files, .minisig files, and records (common/signing, common/signed_records). Never a crash or a
// hang, and nothing is believed but what was signed: whatever the bytes, a signature that
// verifies does so over the signed record's exact bytes and returns its exact trusted comment.
// The first byte says what the rest is:
//   0: a public key file's text;
//   1: a whole .minisig for the record below, checked against the key below;
//   2: edits to the record's real .minisig (pairs of position and byte; an odd last byte cuts it
//      there), so the search starts next to a valid signature;
//   3: edits to the record, checked against its real .minisig.
#include <sodium.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "common/signed_records.hpp"
#include "common/signing.hpp"

namespace {

using namespace ferry::signing;

struct Fixture {
  PublicKey pk;
  std::string record = "{\"format\": \"ferry-snapshot/3\", \"seq\": 7}\n";
  std::string trusted, minisig;
  Fixture() {
    if (sodium_init() < 0) __builtin_trap();
    uint8_t seed[crypto_sign_SEEDBYTES];
    for (size_t i = 0; i < sizeof seed; ++i) seed[i] = static_cast<uint8_t>(i * 7 + 1);
    SecretKey sk;
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

// Position and byte pairs applied to `text`; an odd last byte cuts the text at that position.
std::string Edit(std::string text, const uint8_t* p, size_t n) {
  for (size_t i = 0; i + 2 < n; i += 3) {
    if (text.empty()) break;
    text[(static_cast<size_t>(p[i]) << 8 | p[i + 1]) % text.size()] = static_cast<char>(p[i + 2]);
  }
  if (n % 3 != 0 && !text.empty()) text.resize(p[n - 1] % text.size());
  return text;
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
  switch (data[0] % 4) {
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
  }
  return 0;
}
