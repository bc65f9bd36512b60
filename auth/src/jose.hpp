#pragma once

// Private to idem::auth: RAII for libjose's and jansson's handles, and the key set's insides.

#include <jansson.h>
#include <openssl/evp.h>

// libjose's headers declare its functions without extern "C".
extern "C" {
#include <jose/b64.h>
#include <jose/cfg.h>
#include <jose/jwk.h>
#include <jose/jws.h>
#include <jose/openssl.h>
}

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "idem/auth/jwt.hpp"

namespace idem::auth {

struct JsonDeleter {
  void operator()(json_t* j) const { json_decref(j); }
};
/// An owned jansson value.
using Json = std::unique_ptr<json_t, JsonDeleter>;

struct JwkDeleter {
  void operator()(json_t* jwk) const;
};
/// An owned JWK. An HMAC secret in it ("k") is overwritten before it is freed: jansson frees
/// without clearing, and a secret should not outlive its key set in freed heap memory.
using Jwk = std::unique_ptr<json_t, JwkDeleter>;

struct CfgDeleter {
  void operator()(jose_cfg_t* c) const { jose_cfg_decref(c); }
};
/// An owned libjose configuration context.
using Cfg = std::unique_ptr<jose_cfg_t, CfgDeleter>;

/// A libjose context whose errors go nowhere. libjose's default handler prints every failure to
/// stderr, which would let each forged token write a line (and its header's `alg`) to the log.
/// jose_cfg_t's reference count is not atomic: give each thread its own.
Cfg quiet_cfg();

/// Parses JSON text: an object, no duplicate member names (RFC 7519 §4 allows rejecting them, and
/// a token whose `sub` reads one way here and another way upstream must not pass), no trailing
/// bytes. nullptr when it is anything else.
Json parse_object(std::string_view text);

/// One key that can verify tokens.
struct Key {
  Jwk jwk;                            ///< the public JWK (or the secret), as libjose takes it
  std::optional<std::string> kid;     ///< nullopt: a candidate whatever kid a token names
  std::vector<Algorithm> algorithms;  ///< what it may verify: its type's, allowed, and its own `alg`
  std::string name;                   ///< "key #2 (kid \"a\") in FILE", for messages
};

struct KeySet::Impl {
  JwtOptions options;
  std::vector<Key> keys;
};

}  // namespace idem::auth
