#pragma once

// Encryption at rest of stored responses (SPEC §12, docs/security.md): AES-256-GCM under keys
// named by id, read from a key file. OpenSSL stays in core/src/encryption.cpp.
//
// A sealed response is an ordinary StoredResponse, so that every store keeps it with the codec it
// already has (SQLite and PostgreSQL columns, the Redis record string, the memory store's copy):
//
//   status   kSealedStatus (999: no HTTP status, yet inside PostgreSQL's CHECK of 100..999)
//   headers  exactly one: kSealedHeader ":idem-encrypted" = "v1 KEY_ID". A name starting with ':'
//            is not an HTTP token, so no upstream response and no `idemctl resolve -H` can carry
//            it: a plaintext record is never mistaken for a sealed one.
//   body     nonce (12 random bytes) || ciphertext || tag (16 bytes)
//
// The ciphertext is of the original status (2 bytes, big-endian), the length of its headers blob
// (4 bytes, big-endian), the headers blob (idem/headers_codec.hpp) and the body. The associated
// data is the format version, the record's tenant and key (length-prefixed) and the key id, so a
// ciphertext copied onto another record, or relabelled with another key id, fails to open.

#include <cstdint>
#include <expected>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "idem/record.hpp"
#include "idem/result.hpp"
#include "idem/store.hpp"

namespace idem {

/// The status a sealed response is stored with.
inline constexpr int kSealedStatus = 999;
/// The one header of a sealed response: format version and key id, in the clear.
inline constexpr std::string_view kSealedHeader = ":idem-encrypted";

/// What an operator may know about one key of a KeyRing (never its bytes).
struct KeyInfo {
  std::string id;             ///< 1-64 characters of A-Z a-z 0-9 . _ -
  bool decrypt_only = false;  ///< listed with `decrypt-only`: opens records, never seals new ones
  /// 16 hex digits of SHA-256("idem key check v1" || key): tells whether two key files hold the
  /// same bytes under an id without showing them.
  std::string check;
};

/// Why a sealed response could not be opened. None of them is retryable with the same keys.
enum class OpenErrc : std::uint8_t {
  unknown_key,  ///< sealed with a key id the ring does not hold (removed too early, or another file)
  rejected,     ///< the tag does not verify: bytes altered, or the ciphertext belongs to another record
  malformed,    ///< marked sealed but not in a form this version reads (format version, truncated)
};

/// "unknown_key", "rejected", "malformed".
std::string_view to_string(OpenErrc code);

/// A failed open: the reason and a one-line message naming the record and the key id, never key
/// material.
struct OpenError {
  OpenErrc code = OpenErrc::malformed;
  std::string key_id;   ///< as the record names it (empty when unreadable)
  std::string message;
};

/// Whether `response` is in the sealed form (whichever key, well-formed or not).
bool is_sealed(const StoredResponse& response);

/// The key id a sealed response names; nullopt for a plaintext response or an unreadable marker.
std::optional<std::string_view> sealed_key_id(const StoredResponse& response);

/// The keys that seal and open stored responses. Immutable once loaded: a reload builds a new
/// ring and swaps it in (EncryptedStore::set_keys), so a request in flight keeps the ring it
/// started with. Thread-safe. Key bytes are wiped when the ring is destroyed.
///
/// Key file (docs/security.md): one key per line, `ID BASE64` or `ID BASE64 decrypt-only`, where
/// BASE64 is 32 bytes in standard padded base64 (`openssl rand -base64 32`); blank lines and `#`
/// comments are ignored. The last key not marked decrypt-only seals new records; every key
/// opens. Ids and key bytes must be unique.
class KeyRing {
 public:
  /// Parses a key file's text; `source` names it in errors. Errors are one line and never quote
  /// key material (not even a malformed line). `warnings` (optional) gets what does not stop it.
  static std::expected<std::shared_ptr<const KeyRing>, std::string> parse(std::string_view text,
                                                                          std::string_view source,
                                                                          std::vector<std::string>* warnings = nullptr);

  /// Reads and parses the key file at `path`. Refuses a file that is not a regular file, or that
  /// other users can read or write, or its group can write (chmod 600, or 640 for a group the
  /// service runs in).
  static std::expected<std::shared_ptr<const KeyRing>, std::string> load(const std::string& path,
                                                                         std::vector<std::string>* warnings = nullptr);

  ~KeyRing();
  KeyRing(const KeyRing&) = delete;
  KeyRing& operator=(const KeyRing&) = delete;

  /// Every key, in file order.
  const std::vector<KeyInfo>& keys() const { return info_; }
  /// The id new records are sealed with; nullptr when every key is decrypt-only.
  const std::string* sealing_key_id() const;
  /// Whether the ring holds a key with this id.
  bool contains(std::string_view id) const;

  /// `response` sealed for the record `id` with the sealing key and a fresh random nonce; the
  /// response unchanged when every key is decrypt-only. Fails (StoreErrc::internal) only when
  /// OpenSSL does (no randomness).
  StoreResult<StoredResponse> seal(const RecordId& id, const StoredResponse& response) const;

  /// The original response of a sealed one stored under `id`; a plaintext response (stored
  /// before encryption was turned on) comes back unchanged.
  std::expected<StoredResponse, OpenError> open(const RecordId& id, StoredResponse stored) const;

  struct Key;  ///< defined in encryption.cpp: the bytes stay out of this header

 private:
  KeyRing() = default;
  const Key* find(std::string_view id) const;

  std::vector<std::unique_ptr<Key>> keys_;
  std::vector<KeyInfo> info_;
  const Key* sealing_ = nullptr;
};

/// Appends a new key of 32 random bytes (OpenSSL's CSPRNG) to the key file at `path`, creating it
/// with mode 0600 when it does not exist; the key's bytes go only to the file. `id` empty: today's
/// UTC date (2025-01-31, then 2025-01-31.2, ...). The file must load before and after (same rules
/// as KeyRing::load), and `id` must be new. Returns the new key's description.
std::expected<KeyInfo, std::string> add_key_to_file(const std::string& path, std::string id, bool decrypt_only);

}  // namespace idem
