#include "common/signing.hpp"

#include <fcntl.h>
#include <sodium.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "common/fd.hpp"
#include "common/status_macros.hpp"

namespace ferry::signing {
namespace {

bool SodiumReady() {
  static const bool ok = sodium_init() >= 0;
  return ok;
}

std::string Base64(const uint8_t* p, size_t n) {
  std::string out(sodium_base64_ENCODED_LEN(n, sodium_base64_VARIANT_ORIGINAL), '\0');
  sodium_bin2base64(out.data(), out.size(), p, n, sodium_base64_VARIANT_ORIGINAL);
  out.resize(std::strlen(out.c_str()));
  return out;
}

Result<std::vector<uint8_t>> Unbase64(std::string_view s, size_t want) {
  std::vector<uint8_t> out(want + 8);
  size_t len = 0;
  const char* end = nullptr;
  if (sodium_base642bin(out.data(), out.size(), s.data(), s.size(), nullptr, &len, &end,
                        sodium_base64_VARIANT_ORIGINAL) != 0 ||
      end != s.data() + s.size() || len != want) {
    return InvalidArgument("malformed base64 (expected " + std::to_string(want) + " bytes)");
  }
  out.resize(len);
  return out;
}

// Splits text into lines without their "\n" (a final "\r" is dropped too).
std::vector<std::string_view> Lines(std::string_view text) {
  std::vector<std::string_view> out;
  while (!text.empty()) {
    size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    out.push_back(line);
    if (nl == std::string_view::npos) break;
    text.remove_prefix(nl + 1);
  }
  return out;
}

Status WriteNew(const std::string& path, std::string_view data, mode_t mode) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode));
  if (!fd.valid()) return ErrnoStatus("create " + path, errno);
  if (::fchmod(fd.get(), mode) != 0) return ErrnoStatus("chmod " + path, errno);
  if (::write(fd.get(), data.data(), data.size()) != static_cast<ssize_t>(data.size())) return ErrnoStatus("write " + path, errno);
  if (::fsync(fd.get()) != 0) return ErrnoStatus("fsync " + path, errno);
  return Status::Ok();
}

}  // namespace

SecretKey::SecretKey() : key_(static_cast<uint8_t*>((SodiumReady(), sodium_malloc(crypto_sign_SECRETKEYBYTES)))) {}
SecretKey::~SecretKey() { sodium_free(key_); }

std::string KeyIdHex(const KeyId& id) {
  char hex[17];
  for (int i = 0; i < 8; ++i) std::snprintf(hex + 2 * i, 3, "%02X", id[7 - i]);  // stored little-endian
  return hex;
}

Result<KeyId> GenerateKeyFiles(const std::string& dir, const std::string& name) {
  if (!SodiumReady()) return Internal("libsodium failed to initialize");
  SecretKey sk;
  PublicKey pk;
  crypto_sign_keypair(pk.key.data(), sk.key());
  randombytes_buf(pk.id.data(), pk.id.size());
  sk.id = pk.id;
  std::vector<uint8_t> blob(2 + 8 + crypto_sign_SECRETKEYBYTES);
  blob[0] = 'E';
  blob[1] = 'd';
  std::memcpy(blob.data() + 2, sk.id.data(), 8);
  std::memcpy(blob.data() + 10, sk.key(), crypto_sign_SECRETKEYBYTES);
  std::string sk_text = "untrusted comment: ferry secret key " + KeyIdHex(pk.id) + "\n" + Base64(blob.data(), blob.size()) + "\n";
  sodium_memzero(blob.data(), blob.size());
  uint8_t pub[2 + 8 + 32] = {'E', 'd'};
  std::memcpy(pub + 2, pk.id.data(), 8);
  std::memcpy(pub + 10, pk.key.data(), 32);
  const std::string pk_text = "untrusted comment: minisign public key " + KeyIdHex(pk.id) + "\n" + Base64(pub, sizeof pub) + "\n";
  Status st = WriteNew(dir + "/" + name + ".key", sk_text, 0600);
  sodium_memzero(sk_text.data(), sk_text.size());
  FERRY_RETURN_IF_ERROR(st);
  FERRY_RETURN_IF_ERROR(WriteNew(dir + "/" + name + ".pub", pk_text, 0644));
  return pk.id;
}

Result<PublicKey> ParsePublicKey(std::string_view text) {
  auto lines = Lines(text);
  std::string_view b64;
  for (auto l : lines) {
    if (l.empty() || l.rfind("untrusted comment:", 0) == 0) continue;
    b64 = l;
    break;
  }
  if (b64.empty()) return InvalidArgument("no key in public key file");
  FERRY_ASSIGN_OR_RETURN(auto raw, Unbase64(b64, 42));
  if (raw[0] != 'E' || raw[1] != 'd') return InvalidArgument("not an Ed25519 minisign public key");
  PublicKey pk;
  std::memcpy(pk.id.data(), raw.data() + 2, 8);
  std::memcpy(pk.key.data(), raw.data() + 10, 32);
  return pk;
}

Result<PublicKey> LoadPublicKey(const std::string& path) {
  FERRY_ASSIGN_OR_RETURN(std::string text, ReadWholeFile(path, 4096));
  auto pk = ParsePublicKey(text);
  if (!pk.ok()) return pk.status().WithContext(path);
  return pk;
}

Status LoadSecretKey(const std::string& path, SecretKey& out) {
  if (!SodiumReady()) return Internal("libsodium failed to initialize");
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd.valid() && errno == ELOOP) {
    // The mode check below is of the file opened: a link's target could be anyone's.
    return InvalidArgument(path + " is a symbolic link; point the config at the key file itself");
  }
  if (!fd.valid()) return ErrnoStatus("open " + path, errno);
  struct stat st{};
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus("stat " + path, errno);
  if ((st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", st.st_mode & 07777);
    return PermissionDenied(path + " is mode " + mode + "; a secret key must be readable by its owner only (chmod 600)");
  }
  FERRY_ASSIGN_OR_RETURN(std::string text, ReadWholeFd(fd.get(), 4096));
  Status result = InvalidArgument(path + ": not a ferry secret key");
  for (auto l : Lines(text)) {
    if (l.empty() || l.rfind("untrusted comment:", 0) == 0) continue;
    auto raw = Unbase64(l, 2 + 8 + crypto_sign_SECRETKEYBYTES);
    if (raw.ok() && (*raw)[0] == 'E' && (*raw)[1] == 'd') {
      std::memcpy(out.id.data(), raw->data() + 2, 8);
      std::memcpy(out.key(), raw->data() + 10, crypto_sign_SECRETKEYBYTES);
      result = Status::Ok();
    }
    if (raw.ok()) sodium_memzero(raw->data(), raw->size());
    break;
  }
  sodium_memzero(text.data(), text.size());
  return result;
}

PublicKey PublicKeyOf(const SecretKey& sk) {
  PublicKey pk;
  pk.id = sk.id;
  crypto_sign_ed25519_sk_to_pk(pk.key.data(), sk.key());
  return pk;
}

Status CheckSecretKeyFile(const std::string& path) {
  struct stat st{};
  if (::lstat(path.c_str(), &st) != 0) return ErrnoStatus("stat " + path, errno);
  if (!S_ISREG(st.st_mode)) {
    return PermissionDenied(path + " is not a regular file (a symlink or other); put the secret key itself there, " +
                            "owned by ferryd's user, mode 0600");
  }
  if ((st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", st.st_mode & 07777);
    return PermissionDenied(path + " is mode " + mode + ": others can read the secret key; chmod 600 " + path +
                            " (and, since it was exposed, consider a new key: ferryctl keygen)");
  }
  return Status::Ok();
}

Result<std::string> Sign(const SecretKey& sk, std::string_view data, std::string_view trusted_comment,
                         std::string_view untrusted_comment) {
  if (!SodiumReady()) return Internal("libsodium failed to initialize");
  if (trusted_comment.find('\n') != std::string_view::npos || untrusted_comment.find('\n') != std::string_view::npos) {
    return InvalidArgument("signature comments are one line");
  }
  uint8_t hash[crypto_generichash_BYTES_MAX];
  crypto_generichash(hash, sizeof hash, reinterpret_cast<const uint8_t*>(data.data()), data.size(), nullptr, 0);
  uint8_t sig[2 + 8 + crypto_sign_BYTES] = {'E', 'D'};
  std::memcpy(sig + 2, sk.id.data(), 8);
  crypto_sign_detached(sig + 10, nullptr, hash, sizeof hash, sk.key());
  std::string global_msg(reinterpret_cast<const char*>(sig + 10), crypto_sign_BYTES);
  global_msg.append(trusted_comment);
  uint8_t global[crypto_sign_BYTES];
  crypto_sign_detached(global, nullptr, reinterpret_cast<const uint8_t*>(global_msg.data()), global_msg.size(), sk.key());
  return "untrusted comment: " + std::string(untrusted_comment) + "\n" + Base64(sig, sizeof sig) + "\ntrusted comment: " +
         std::string(trusted_comment) + "\n" + Base64(global, sizeof global) + "\n";
}

Result<std::string> Verify(const PublicKey& pk, std::string_view data, std::string_view minisig) {
  if (!SodiumReady()) return Internal("libsodium failed to initialize");
  auto lines = Lines(minisig);
  if (lines.size() < 4 || lines[0].rfind("untrusted comment:", 0) != 0 || lines[2].rfind("trusted comment: ", 0) != 0) {
    return InvalidArgument("not a minisign signature file");
  }
  FERRY_ASSIGN_OR_RETURN(auto sig, Unbase64(lines[1], 2 + 8 + crypto_sign_BYTES));
  if (sig[0] != 'E' || sig[1] != 'D') return InvalidArgument("not a prehashed Ed25519 (ED) signature");
  if (std::memcmp(sig.data() + 2, pk.id.data(), 8) != 0) {
    KeyId got;
    std::memcpy(got.data(), sig.data() + 2, 8);
    return PermissionDenied("signed with key " + KeyIdHex(got) + ", not with the given key " + KeyIdHex(pk.id));
  }
  uint8_t hash[crypto_generichash_BYTES_MAX];
  crypto_generichash(hash, sizeof hash, reinterpret_cast<const uint8_t*>(data.data()), data.size(), nullptr, 0);
  if (crypto_sign_verify_detached(sig.data() + 10, hash, sizeof hash, pk.key.data()) != 0) {
    return PermissionDenied("signature does not match the content (changed, or signed by another key)");
  }
  const std::string_view trusted = lines[2].substr(std::string_view("trusted comment: ").size());
  FERRY_ASSIGN_OR_RETURN(auto global, Unbase64(lines[3], crypto_sign_BYTES));
  std::string msg(reinterpret_cast<const char*>(sig.data() + 10), crypto_sign_BYTES);
  msg.append(trusted);
  if (crypto_sign_verify_detached(global.data(), reinterpret_cast<const uint8_t*>(msg.data()), msg.size(),
                                  pk.key.data()) != 0) {
    return PermissionDenied("trusted comment was changed (global signature does not match)");
  }
  return std::string(trusted);
}

std::string Sha256Hex(std::string_view data) {
  SodiumReady();
  uint8_t h[crypto_hash_sha256_BYTES];
  crypto_hash_sha256(h, reinterpret_cast<const uint8_t*>(data.data()), data.size());
  char hex[2 * crypto_hash_sha256_BYTES + 1];
  sodium_bin2hex(hex, sizeof hex, h, sizeof h);
  return hex;
}

std::string Sha256Base64(std::string_view data) {
  SodiumReady();
  uint8_t h[crypto_hash_sha256_BYTES];
  crypto_hash_sha256(h, reinterpret_cast<const uint8_t*>(data.data()), data.size());
  return Base64(h, sizeof h);
}

std::string Base64(std::string_view data) { return Base64(reinterpret_cast<const uint8_t*>(data.data()), data.size()); }

std::string RecordId(std::string_view record) {
  SodiumReady();
  uint8_t h[crypto_hash_sha256_BYTES];
  crypto_hash_sha256(h, reinterpret_cast<const uint8_t*>(record.data()), record.size());
  static constexpr char kCrockford[] = "0123456789ABCDEFGHJKMNPQRSTVWXYZ";
  std::string out = "FRY";
  for (int i = 0; i < 20; ++i) {
    if (i % 5 == 0) out += '-';
    const int bit = i * 5;
    const int v = ((h[bit / 8] << 8 | h[bit / 8 + 1]) >> (11 - bit % 8)) & 31;
    out += kCrockford[v];
  }
  return out;
}

}  // namespace ferry::signing
