// Ed25519 keys and signatures in minisign's format, so that a buyer verifies ferry's records
// with the stock `minisign -V` as well as with `ferryctl verify`.
//
//   public key file:  "untrusted comment: ..." / base64("Ed" || key id (8) || public key (32))
//   signature file:   "untrusted comment: ..." / base64("ED" || key id || Ed25519(BLAKE2b-512(file)))
//                     "trusted comment: ..."   / base64(Ed25519(signature || trusted comment))
//
// The secret key file is ferry's own ("Ed" || key id || secret key (64), base64), created 0600;
// loading refuses a file that group or others can read. Its bytes are never logged.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "ferry/status.hpp"

namespace ferry::signing {

using KeyId = std::array<uint8_t, 8>;

struct PublicKey {
  KeyId id{};
  std::array<uint8_t, 32> key{};
};

// Holds a secret key in memory locked against swapping; wiped when destroyed.
class SecretKey {
 public:
  SecretKey();
  ~SecretKey();
  SecretKey(const SecretKey&) = delete;
  SecretKey& operator=(const SecretKey&) = delete;
  KeyId id{};
  uint8_t* key() { return key_; }  // 64 bytes
  const uint8_t* key() const { return key_; }

 private:
  uint8_t* key_;  // sodium_malloc'd
};

std::string KeyIdHex(const KeyId& id);  // 16 hex digits, as minisign prints it (most significant first)

// Writes DIR/NAME.key (0600, refusing to overwrite) and DIR/NAME.pub; returns the key id.
Result<KeyId> GenerateKeyFiles(const std::string& dir, const std::string& name);
Result<PublicKey> LoadPublicKey(const std::string& path);
Result<PublicKey> ParsePublicKey(std::string_view text);
Status LoadSecretKey(const std::string& path, SecretKey& out);
PublicKey PublicKeyOf(const SecretKey& sk);  // to check one's own records
// OK when `path` is a regular file (not a symlink) that only its owner can read; else why not
// and what to do. A secret key is checked before each use, not only when loaded.
Status CheckSecretKeyFile(const std::string& path);

// A complete .minisig file for `data`. Comments must not contain newlines.
Result<std::string> Sign(const SecretKey& sk, std::string_view data, std::string_view trusted_comment,
                         std::string_view untrusted_comment);
// Checks a .minisig against `data` and `pk`; on success returns the trusted comment.
Result<std::string> Verify(const PublicKey& pk, std::string_view data, std::string_view minisig);

std::string Sha256Hex(std::string_view data);
std::string Sha256Base64(std::string_view data);  // as a Content-Security-Policy hash names a script
std::string Base64(std::string_view data);        // the original alphabet, padded
// A short id for a record, from its SHA-256: "FRY-" and four groups of five Crockford base32
// characters (100 bits).
std::string RecordId(std::string_view record);

}  // namespace ferry::signing
