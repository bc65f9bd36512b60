#pragma once

// `idemctl keys`: the encryption key file (docs/security.md) and which records need which key.
// `keys add` writes a new key into the file, `keys list` describes the file, `keys usage` counts
// a store's records per key id. None of them ever prints key material.

#include "common.hpp"
#include "idem/encryption.hpp"
#include "idem/store_admin.hpp"

namespace idem::cli {

/// `keys list`: every key of the file in order: id, role (encrypts, decrypts, decrypt-only) and
/// check value (the same key bytes give the same check in every file).
int run_keys_list(const KeyRing& keys, const std::string& path, const Output& o);

/// `keys usage`: the stored responses of `admin` (the backend itself, not an EncryptedStore) by
/// key id, plaintext ones apart, live and expired (not yet purged: never replayed, so they need no
/// key). With `keys`, each id is matched against the file: a listed key that no live record uses
/// may be removed; a live record whose key the file lacks cannot be replayed (said on stderr).
int run_keys_usage(StoreAdmin& admin, const KeyRing* keys, TimePoint now, const Output& o);

}  // namespace idem::cli
