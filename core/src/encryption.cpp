#include "idem/encryption.hpp"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/opensslv.h>
#include <openssl/rand.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <ctime>
#include <mutex>

#include "idem/fingerprint.hpp"
#include "idem/headers_codec.hpp"
#include "idem/private_file.hpp"

namespace idem {

struct KeyRing::Key {
  std::string id;
  std::array<unsigned char, 32> bytes{};
  /// Unique for the life of the process (never reused, unlike the Key's address once a reload
  /// freed it): what the per-thread cipher contexts are cached by.
  std::uint64_t serial = 0;
  /// The sealed header's value for this key: "v1 ID".
  std::string marker;
  ~Key() { OPENSSL_cleanse(bytes.data(), bytes.size()); }
};

namespace {

constexpr std::size_t kKeySize = 32;
constexpr std::size_t kNonceSize = 12;  // 96 bits: GCM's native IV, no GHASH of the IV
constexpr std::size_t kTagSize = 16;
constexpr std::size_t kPrefixSize = 6;  // status (2) + headers blob length (4)
constexpr std::size_t kMaxIdLength = 64;
constexpr std::size_t kMaxKeyFileSize = 1024 * 1024;
constexpr std::string_view kVersionTag = "v1";
constexpr std::string_view kDecryptOnly = "decrypt-only";

// ---- randomness --------------------------------------------------------------------------
//
// Nonces come from OpenSSL's CSPRNG in blocks, as fencing tokens do (store.cpp): RAND_bytes
// costs a getpid() system call per call. A forked child must never reuse its parent's buffered
// bytes (two processes sealing with the same nonce and key would reveal both plaintexts' XOR),
// so fork bumps a generation that invalidates every thread's block.

std::atomic<std::uint64_t> fork_generation{0};
std::once_flag fork_handler_installed;

struct RandomBlock {
  std::array<unsigned char, 4080> bytes{};  // 340 nonces
  std::size_t next = 4080;
  std::uint64_t generation = 0;
  ~RandomBlock() { OPENSSL_cleanse(bytes.data(), bytes.size()); }
};

bool random_bytes(unsigned char* out, std::size_t n) {
  std::call_once(fork_handler_installed, [] {
    pthread_atfork(nullptr, nullptr, [] { fork_generation.fetch_add(1, std::memory_order_relaxed); });
  });
  thread_local RandomBlock block;
  const std::uint64_t generation = fork_generation.load(std::memory_order_relaxed);
  if (block.next + n > block.bytes.size() || block.generation != generation) {
    if (RAND_bytes(block.bytes.data(), static_cast<int>(block.bytes.size())) != 1) return false;
    block.next = 0;
    block.generation = generation;
  }
  std::memcpy(out, block.bytes.data() + block.next, n);  // nonces are public: no need to wipe them
  block.next += n;
  return true;
}

// ---- AES-256-GCM ---------------------------------------------------------------------------

const EVP_CIPHER* aes_256_gcm() {
#if OPENSSL_VERSION_NUMBER >= 0x30000000L
  // Fetched once: the implicit fetch behind EVP_aes_256_gcm() costs a lookup on every init.
  static const EVP_CIPHER* cipher = [] {
    const EVP_CIPHER* fetched = EVP_CIPHER_fetch(nullptr, "AES-256-GCM", nullptr);
    return fetched != nullptr ? fetched : EVP_aes_256_gcm();
  }();
  return cipher;
#else
  return EVP_aes_256_gcm();
#endif
}

struct CtxFree {
  void operator()(EVP_CIPHER_CTX* ctx) const { EVP_CIPHER_CTX_free(ctx); }
};

std::atomic<std::uint64_t> next_key_serial{1};

// Contexts with a key already set, per thread: initialising one with the cipher and key costs
// about 1.5 us (a provider context allocated, the AES key schedule and the GHASH table computed),
// more than sealing a 1 KiB response; with the key kept, each record only sets its nonce. A few
// keys per thread (the sealing key, the one or two a rotation still opens); the least recently
// used goes when a reload brought more. EVP_CIPHER_CTX_free wipes the key schedule.
struct KeyedCtx {
  std::uint64_t serial = 0;
  bool encrypt = false;
  std::unique_ptr<EVP_CIPHER_CTX, CtxFree> ctx;
};

EVP_CIPHER_CTX* keyed_ctx(const KeyRing::Key& key, bool encrypt) {
  thread_local std::vector<KeyedCtx> cache;
  for (std::size_t i = 0; i < cache.size(); ++i) {
    if (cache[i].serial == key.serial && cache[i].encrypt == encrypt) {
      if (i != 0) std::swap(cache[i], cache[0]);  // most recent first
      return cache[0].ctx.get();
    }
  }
  std::unique_ptr<EVP_CIPHER_CTX, CtxFree> ctx(EVP_CIPHER_CTX_new());
  if (!ctx) return nullptr;
  const int ok = encrypt ? EVP_EncryptInit_ex(ctx.get(), aes_256_gcm(), nullptr, key.bytes.data(), nullptr)
                         : EVP_DecryptInit_ex(ctx.get(), aes_256_gcm(), nullptr, key.bytes.data(), nullptr);
  if (ok != 1) return nullptr;
  constexpr std::size_t kMaxCached = 8;
  if (cache.size() == kMaxCached) cache.pop_back();
  cache.insert(cache.begin(), KeyedCtx{key.serial, encrypt, std::move(ctx)});
  return cache[0].ctx.get();
}

// Starts a record on a context that has its key: only the nonce is set. OpenSSL 3's
// EVP_CipherInit_ex2 goes straight to the provider; the older call re-checks engines and
// re-references the cipher every time.
bool set_nonce(EVP_CIPHER_CTX* ctx, const unsigned char* nonce, bool encrypt) {
#if OPENSSL_VERSION_NUMBER >= 0x30000000L
  return EVP_CipherInit_ex2(ctx, nullptr, nullptr, nonce, encrypt ? 1 : 0, nullptr) == 1;
#else
  return (encrypt ? EVP_EncryptInit_ex(ctx, nullptr, nullptr, nullptr, nonce)
                  : EVP_DecryptInit_ex(ctx, nullptr, nullptr, nullptr, nonce)) == 1;
#endif
}

// EVP takes int lengths: larger inputs go in pieces (GCM is a stream mode, output = input).
bool cipher_update(EVP_CIPHER_CTX* ctx, unsigned char* out, const unsigned char* in, std::size_t size, bool encrypt) {
  while (size > 0) {
    const int piece = static_cast<int>(std::min<std::size_t>(size, 1u << 30));
    int written = 0;
    const int ok = encrypt ? EVP_EncryptUpdate(ctx, out, &written, in, piece)
                           : EVP_DecryptUpdate(ctx, out, &written, in, piece);
    if (ok != 1 || written != piece) return false;
    out += piece;
    in += piece;
    size -= static_cast<std::size_t>(piece);
  }
  return true;
}

bool add_ad(EVP_CIPHER_CTX* ctx, const std::string& ad, bool encrypt) {
  int ignored = 0;
  const auto* data = reinterpret_cast<const unsigned char*>(ad.data());
  const int size = static_cast<int>(ad.size());  // bounded: ids of at most a few KiB
  return (encrypt ? EVP_EncryptUpdate(ctx, nullptr, &ignored, data, size)
                  : EVP_DecryptUpdate(ctx, nullptr, &ignored, data, size)) == 1;
}

void put_u32(std::string& out, std::size_t v) {
  const char bytes[4] = {static_cast<char>((v >> 24) & 0xff), static_cast<char>((v >> 16) & 0xff),
                         static_cast<char>((v >> 8) & 0xff), static_cast<char>(v & 0xff)};
  out.append(bytes, sizeof bytes);
}

std::uint32_t get_u32(const unsigned char* p) {
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) | p[3];
}

// The associated data: what the ciphertext is bound to. Length prefixes keep (tenant "a", key
// "bc") apart from (tenant "ab", key "c"). Built in a buffer each thread reuses: no allocation.
const std::string& associated_data(const RecordId& id, std::string_view key_id) {
  thread_local std::string ad;
  ad.clear();
  ad += "idem stored response ";
  ad += kVersionTag;
  ad.push_back('\0');
  put_u32(ad, id.tenant.size());
  ad += id.tenant;
  put_u32(ad, id.key.size());
  ad += id.key;
  put_u32(ad, key_id.size());
  ad += key_id;
  return ad;
}

// ---- text ----------------------------------------------------------------------------------

// A string for a one-line message: quoted, with anything but printable ASCII escaped.
std::string quoted(std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "\"";
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') {
      out.push_back(ch);
    } else {
      out += "\\x";
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 0xf]);
    }
  }
  out.push_back('"');
  return out;
}

std::string describe(const RecordId& id) {
  return "the response of record (tenant " + quoted(id.tenant) + ", key " + quoted(id.key) + ")";
}

bool valid_key_id(std::string_view id) {
  if (id.empty() || id.size() > kMaxIdLength) return false;
  return std::all_of(id.begin(), id.end(), [](char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
           c == '-';
  });
}

int base64_value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

// Strict standard base64 (RFC 4648 §4) with padding; nullopt for anything else. The output is
// wiped by the caller: it is key material.
std::optional<std::string> base64_decode(std::string_view text) {
  if (text.empty() || text.size() % 4 != 0) return std::nullopt;
  std::string out;
  out.reserve(text.size() / 4 * 3);
  for (std::size_t i = 0; i < text.size(); i += 4) {
    const bool last = i + 4 == text.size();
    int v[4];
    int pad = 0;
    for (int j = 0; j < 4; ++j) {
      const char c = text[i + j];
      if (c == '=' && last && j >= 2) {
        v[j] = 0;
        ++pad;
        continue;
      }
      if (pad > 0) return std::nullopt;  // data after padding
      v[j] = base64_value(c);
      if (v[j] < 0) return std::nullopt;
    }
    const std::uint32_t n = (std::uint32_t(v[0]) << 18) | (std::uint32_t(v[1]) << 12) | (std::uint32_t(v[2]) << 6) |
                            std::uint32_t(v[3]);
    out.push_back(static_cast<char>((n >> 16) & 0xff));
    if (pad < 2) out.push_back(static_cast<char>((n >> 8) & 0xff));
    if (pad < 1) out.push_back(static_cast<char>(n & 0xff));
    // Non-canonical spellings (stray bits under the padding) would let two texts name one key.
    if ((pad == 1 && (n & 0xff) != 0) || (pad == 2 && (n & 0xffff) != 0)) {
      OPENSSL_cleanse(out.data(), out.size());
      return std::nullopt;
    }
  }
  return out;
}

std::string base64_encode(const unsigned char* bytes, std::size_t size) {
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((size + 2) / 3 * 4);
  std::size_t i = 0;
  for (; i + 2 < size; i += 3) {
    const std::uint32_t n = (std::uint32_t{bytes[i]} << 16) | (std::uint32_t{bytes[i + 1]} << 8) | bytes[i + 2];
    for (int shift : {18, 12, 6, 0}) out.push_back(kAlphabet[(n >> shift) & 63]);
  }
  if (i < size) {
    const std::uint32_t n = (std::uint32_t{bytes[i]} << 16) | (i + 1 < size ? std::uint32_t{bytes[i + 1]} << 8 : 0);
    out.push_back(kAlphabet[(n >> 18) & 63]);
    out.push_back(kAlphabet[(n >> 12) & 63]);
    out.push_back(i + 1 < size ? kAlphabet[(n >> 6) & 63] : '=');
    out.push_back('=');
  }
  return out;
}

std::string key_check(const std::array<unsigned char, 32>& bytes) {
  Sha256 hash;
  hash.update("idem key check v1");
  hash.update(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
  return hash.hex_digest().substr(0, 16);
}

// Splits a line into whitespace-separated fields.
std::vector<std::string_view> fields_of(std::string_view line) {
  std::vector<std::string_view> out;
  std::size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
    const std::size_t start = i;
    while (i < line.size() && line[i] != ' ' && line[i] != '\t') ++i;
    if (i > start) out.push_back(line.substr(start, i - start));
  }
  return out;
}

}  // namespace

std::string_view to_string(OpenErrc code) {
  switch (code) {
    case OpenErrc::unknown_key: return "unknown_key";
    case OpenErrc::rejected: return "rejected";
    case OpenErrc::malformed: return "malformed";
  }
  return "unknown";
}

bool is_sealed(const StoredResponse& response) {
  return !response.headers.empty() && response.headers.front().name == kSealedHeader;
}

std::optional<std::string_view> sealed_key_id(const StoredResponse& response) {
  if (!is_sealed(response) || response.headers.size() != 1 || response.status != kSealedStatus) return std::nullopt;
  std::string_view value = response.headers.front().value;
  if (!value.starts_with(kVersionTag) || value.size() < kVersionTag.size() + 2 || value[kVersionTag.size()] != ' ') {
    return std::nullopt;
  }
  value.remove_prefix(kVersionTag.size() + 1);
  if (!valid_key_id(value)) return std::nullopt;
  return value;
}

KeyRing::~KeyRing() = default;

std::expected<std::shared_ptr<const KeyRing>, std::string> KeyRing::parse(std::string_view text,
                                                                           std::string_view source,
                                                                           std::vector<std::string>* warnings) {
  const std::string where(source);
  std::shared_ptr<KeyRing> ring(new KeyRing());
  std::size_t line_no = 0;
  std::size_t pos = 0;
  // No message below quotes a line, a field that failed to parse or a key: a line with the columns
  // swapped, or a key pasted where an id belongs, must not end up in a log.
  while (pos < text.size()) {
    const std::size_t eol = text.find('\n', pos);
    std::string_view line = text.substr(pos, eol == std::string_view::npos ? std::string_view::npos : eol - pos);
    pos = eol == std::string_view::npos ? text.size() : eol + 1;
    ++line_no;
    if (line.ends_with('\r')) line.remove_suffix(1);
    if (const auto hash = line.find('#'); hash != std::string_view::npos) line = line.substr(0, hash);
    const auto fields = fields_of(line);
    if (fields.empty()) continue;
    const std::string at = where + ": line " + std::to_string(line_no) + ": ";
    if (fields.size() < 2 || fields.size() > 3) {
      return std::unexpected(at + "expected \"ID BASE64-KEY\" or \"ID BASE64-KEY decrypt-only\" (" +
                             std::to_string(fields.size()) + " fields)");
    }
    if (!valid_key_id(fields[0])) {
      return std::unexpected(at + "the key id must be 1-" + std::to_string(kMaxIdLength) +
                             " characters of A-Z a-z 0-9 . _ - (the id comes first, then the key)");
    }
    const std::string id(fields[0]);
    bool decrypt_only = false;
    if (fields.size() == 3) {
      if (fields[2] != kDecryptOnly) {
        return std::unexpected(at + "key " + quoted(id) + ": the third field may only be \"decrypt-only\"");
      }
      decrypt_only = true;
    }
    auto bytes = base64_decode(fields[1]);
    if (!bytes || bytes->size() != kKeySize) {
      std::string why = !bytes ? std::string("the key is not standard base64 (A-Z a-z 0-9 + /, padded with =)")
                               : "the key is " + std::to_string(bytes->size()) + " bytes, expected 32";
      if (bytes) OPENSSL_cleanse(bytes->data(), bytes->size());
      return std::unexpected(at + "key " + quoted(id) + ": " + why + "; make one with `openssl rand -base64 32`");
    }
    auto key = std::make_unique<Key>();
    key->id = id;
    key->serial = next_key_serial.fetch_add(1, std::memory_order_relaxed);
    key->marker = std::string(kVersionTag) + " " + id;
    std::memcpy(key->bytes.data(), bytes->data(), kKeySize);
    OPENSSL_cleanse(bytes->data(), bytes->size());
    for (const auto& other : ring->keys_) {
      if (other->id == id) return std::unexpected(at + "key id " + quoted(id) + " is listed twice");
      if (CRYPTO_memcmp(other->bytes.data(), key->bytes.data(), kKeySize) == 0) {
        return std::unexpected(at + "key " + quoted(id) + " has the same bytes as key " + quoted(other->id) +
                               "; every key must be new random bytes");
      }
    }
    ring->info_.push_back(KeyInfo{id, decrypt_only, key_check(key->bytes)});
    if (!decrypt_only) ring->sealing_ = key.get();
    ring->keys_.push_back(std::move(key));
  }
  if (ring->keys_.empty()) {
    return std::unexpected(where + ": no key; add a line \"ID BASE64-KEY\", e.g. `idemctl keys add --key-file " +
                           where + "`");
  }
  if (ring->sealing_ == nullptr && warnings != nullptr) {
    warnings->push_back(where + ": every key is decrypt-only: encrypted records still replay, but new records are "
                                "stored unencrypted");
  }
  return std::shared_ptr<const KeyRing>(std::move(ring));
}

std::expected<std::shared_ptr<const KeyRing>, std::string> KeyRing::load(const std::string& path,
                                                                          std::vector<std::string>* warnings) {
  auto read = read_private_file(path, "key file", kMaxKeyFileSize, "1 MiB");
  if (!read) return std::unexpected(std::move(read.error()));
  std::string& text = *read;
  auto ring = parse(text, path, warnings);
  OPENSSL_cleanse(text.data(), text.size());
  return ring;
}

const std::string* KeyRing::sealing_key_id() const { return sealing_ != nullptr ? &sealing_->id : nullptr; }

bool KeyRing::contains(std::string_view id) const { return find(id) != nullptr; }

const KeyRing::Key* KeyRing::find(std::string_view id) const {
  for (const auto& k : keys_) {
    if (k->id == id) return k.get();
  }
  return nullptr;
}

StoreResult<StoredResponse> KeyRing::seal(const RecordId& id, const StoredResponse& response) const {
  if (sealing_ == nullptr) return response;
  const auto failed = [](std::string why) {
    return std::unexpected(StoreError{StoreErrc::internal, "encrypting the response failed: " + why, false});
  };
  if (response.status < 0 || response.status > 0xffff) return failed("status out of range");
  const std::string headers = encode_headers(response.headers);
  if (headers.size() > 0xffffffffu) return failed("headers too large");
  unsigned char prefix[kPrefixSize];
  prefix[0] = static_cast<unsigned char>((response.status >> 8) & 0xff);
  prefix[1] = static_cast<unsigned char>(response.status & 0xff);
  const auto hsize = static_cast<std::uint32_t>(headers.size());
  prefix[2] = static_cast<unsigned char>(hsize >> 24);
  prefix[3] = static_cast<unsigned char>((hsize >> 16) & 0xff);
  prefix[4] = static_cast<unsigned char>((hsize >> 8) & 0xff);
  prefix[5] = static_cast<unsigned char>(hsize & 0xff);

  StoredResponse sealed;
  sealed.status = kSealedStatus;
  sealed.headers.reserve(1);
  sealed.headers.push_back(Header{std::string(kSealedHeader), sealing_->marker});
  std::string& body = sealed.body;
  body.resize(kNonceSize + kPrefixSize + headers.size() + response.body.size() + kTagSize);
  auto* out = reinterpret_cast<unsigned char*>(body.data());
  if (!random_bytes(out, kNonceSize)) return failed("no randomness for the nonce (RAND_bytes)");

  EVP_CIPHER_CTX* ctx = keyed_ctx(*sealing_, true);
  if (ctx == nullptr) return failed("no cipher context");
  const std::string& ad = associated_data(id, sealing_->id);
  unsigned char* p = out + kNonceSize;
  const bool ok =
      set_nonce(ctx, out, true) && add_ad(ctx, ad, true) &&
      cipher_update(ctx, p, prefix, kPrefixSize, true) &&
      cipher_update(ctx, p + kPrefixSize, reinterpret_cast<const unsigned char*>(headers.data()), headers.size(),
                    true) &&
      cipher_update(ctx, p + kPrefixSize + headers.size(),
                    reinterpret_cast<const unsigned char*>(response.body.data()), response.body.size(), true);
  int final_len = 0;
  if (!ok || EVP_EncryptFinal_ex(ctx, out + body.size() - kTagSize, &final_len) != 1 || final_len != 0 ||
      EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_GET_TAG, static_cast<int>(kTagSize), out + body.size() - kTagSize) != 1) {
    return failed("OpenSSL AES-256-GCM");
  }
  return sealed;
}

std::expected<StoredResponse, OpenError> KeyRing::open(const RecordId& id, StoredResponse stored) const {
  if (!is_sealed(stored)) return stored;  // stored before encryption was turned on
  const auto key_id = sealed_key_id(stored);
  if (!key_id) {
    return std::unexpected(OpenError{OpenErrc::malformed, std::string(),
                                     describe(id) + " is marked encrypted but its marker is not \"" +
                                         std::string(kVersionTag) + " KEY_ID\" with status " +
                                         std::to_string(kSealedStatus) + " (altered, or a newer format)"});
  }
  const std::string kid(*key_id);
  const Key* key = find(kid);
  if (key == nullptr) {
    return std::unexpected(OpenError{OpenErrc::unknown_key, kid,
                                     describe(id) + " is encrypted with key id " + quoted(kid) +
                                         ", which the key file does not list (restore that key to read it)"});
  }
  const std::string& body = stored.body;
  if (body.size() < kNonceSize + kPrefixSize + kTagSize) {
    return std::unexpected(OpenError{OpenErrc::malformed, kid,
                                     describe(id) + " under key id " + quoted(kid) + " is truncated (" +
                                         std::to_string(body.size()) + " bytes)"});
  }
  const auto* in = reinterpret_cast<const unsigned char*>(body.data());
  const std::size_t ct_size = body.size() - kNonceSize - kTagSize;
  std::string plain(ct_size, '\0');
  auto* pt = reinterpret_cast<unsigned char*>(plain.data());
  EVP_CIPHER_CTX* ctx = keyed_ctx(*key, false);
  const std::string& ad = associated_data(id, kid);
  unsigned char tag[kTagSize];
  std::memcpy(tag, in + body.size() - kTagSize, kTagSize);
  int final_len = 0;
  const bool ok = ctx != nullptr && set_nonce(ctx, in, false) &&
                  add_ad(ctx, ad, false) && cipher_update(ctx, pt, in + kNonceSize, ct_size, false) &&
                  EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_SET_TAG, static_cast<int>(kTagSize), tag) == 1 &&
                  EVP_DecryptFinal_ex(ctx, pt + ct_size, &final_len) == 1;
  if (!ok) {
    OPENSSL_cleanse(plain.data(), plain.size());  // unauthenticated bytes: never used
    return std::unexpected(OpenError{OpenErrc::rejected, kid,
                                     describe(id) + " does not decrypt with key id " + quoted(kid) +
                                         ": its bytes were altered, or it was copied from another record"});
  }
  const auto malformed = [&](std::string why) {
    return std::unexpected(OpenError{OpenErrc::malformed, kid, describe(id) + " under key id " + quoted(kid) +
                                                                   " decrypts to an unreadable response (" + why + ")"});
  };
  const std::uint32_t hsize = get_u32(pt + 2);
  if (kPrefixSize + std::size_t{hsize} > plain.size()) return malformed("headers run past the end");
  auto headers = decode_headers(std::string_view(plain).substr(kPrefixSize, hsize));
  if (!headers) return malformed("bad headers");
  StoredResponse out;
  out.status = (int{pt[0]} << 8) | pt[1];
  out.headers = std::move(*headers);
  plain.erase(0, kPrefixSize + hsize);
  out.body = std::move(plain);
  return out;
}

std::expected<KeyInfo, std::string> add_key_to_file(const std::string& path, std::string id, bool decrypt_only) {
  std::shared_ptr<const KeyRing> existing;
  struct stat st {};
  const bool exists = ::stat(path.c_str(), &st) == 0;
  if (exists) {
    auto loaded = KeyRing::load(path);
    if (!loaded) return std::unexpected(loaded.error());
    existing = std::move(*loaded);
  } else if (errno != ENOENT) {
    return std::unexpected(path + ": " + std::strerror(errno));
  }
  const auto taken = [&](const std::string& candidate) { return existing && existing->contains(candidate); };
  if (id.empty()) {
    char date[16];
    const std::time_t now = std::time(nullptr);
    std::tm utc{};
    ::gmtime_r(&now, &utc);
    std::strftime(date, sizeof date, "%Y-%m-%d", &utc);
    id = date;
    for (int n = 2; taken(id); ++n) id = std::string(date) + "." + std::to_string(n);
  } else if (!valid_key_id(id)) {
    return std::unexpected("key id " + quoted(id) + ": expected 1-" + std::to_string(kMaxIdLength) +
                           " characters of A-Z a-z 0-9 . _ -");
  } else if (taken(id)) {
    return std::unexpected(path + ": key id " + quoted(id) + " is already listed");
  }

  std::array<unsigned char, kKeySize> bytes{};
  if (RAND_bytes(bytes.data(), static_cast<int>(bytes.size())) != 1) {
    return std::unexpected(std::string("no randomness for a key (OpenSSL RAND_bytes failed)"));
  }
  std::string text;
  if (!exists) {
    text = "# idem encryption keys (docs/security.md): \"ID BASE64-KEY\" or \"ID BASE64-KEY decrypt-only\".\n"
           "# The last key not marked decrypt-only encrypts new records; every key decrypts.\n";
  } else if (st.st_size > 0) {
    // A file whose last line has no newline would have the new key glued onto it.
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    char last = '\n';
    if (fd >= 0) {
      if (::pread(fd, &last, 1, st.st_size - 1) != 1) last = '\n';
      ::close(fd);
    }
    if (last != '\n') text.push_back('\n');
  }
  text += id + " " + base64_encode(bytes.data(), bytes.size()) + (decrypt_only ? " decrypt-only" : "") + "\n";
  OPENSSL_cleanse(bytes.data(), bytes.size());

  const int flags = O_WRONLY | O_APPEND | O_CLOEXEC | (exists ? 0 : O_CREAT | O_EXCL);
  const int fd = ::open(path.c_str(), flags, 0600);
  std::string error;
  if (fd < 0) {
    error = path + ": cannot write the key file: " + std::strerror(errno);
  } else {
    std::size_t done = 0;
    while (done < text.size()) {
      const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        error = path + ": writing the key file failed: " + std::strerror(errno);
        break;
      }
      done += static_cast<std::size_t>(n);
    }
    if (error.empty() && ::fsync(fd) != 0) error = path + ": fsync of the key file failed: " + std::strerror(errno);
    ::close(fd);
  }
  OPENSSL_cleanse(text.data(), text.size());
  if (!error.empty()) return std::unexpected(error);

  auto reloaded = KeyRing::load(path);
  if (!reloaded) return std::unexpected(reloaded.error());
  for (const KeyInfo& info : (*reloaded)->keys()) {
    if (info.id == id) return info;
  }
  return std::unexpected(path + ": the new key is not in the file after writing it");
}

}  // namespace idem
