// Loading the keys tokens are verified with: JWK Sets (RFC 7517) and PEM public keys through
// libjose, HMAC secrets from a file. Every check a key can fail is made here, once, so the
// request path only picks among keys known to be usable.
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <set>
#include <utility>

#include "jose.hpp"

namespace idem::auth {
namespace {

constexpr std::size_t kMaxKeyFile = 1024 * 1024;  // a JWK Set of hundreds of keys fits
constexpr std::size_t kMaxSecret = 512;
constexpr std::size_t kMaxClaims = 16;
constexpr unsigned kMinRsaBits = 2048;  // RFC 7518 §3.3

constexpr std::array<Algorithm, 6> kRsaAlgorithms = {Algorithm::RS256, Algorithm::RS384, Algorithm::RS512,
                                                     Algorithm::PS256, Algorithm::PS384, Algorithm::PS512};
constexpr std::array<Algorithm, 3> kHmacAlgorithms = {Algorithm::HS256, Algorithm::HS384, Algorithm::HS512};

struct Named {
  Algorithm algorithm;
  std::string_view name;
};
constexpr std::array<Named, 12> kNames = {{{Algorithm::RS256, "RS256"},
                                           {Algorithm::RS384, "RS384"},
                                           {Algorithm::RS512, "RS512"},
                                           {Algorithm::PS256, "PS256"},
                                           {Algorithm::PS384, "PS384"},
                                           {Algorithm::PS512, "PS512"},
                                           {Algorithm::ES256, "ES256"},
                                           {Algorithm::ES384, "ES384"},
                                           {Algorithm::ES512, "ES512"},
                                           {Algorithm::HS256, "HS256"},
                                           {Algorithm::HS384, "HS384"},
                                           {Algorithm::HS512, "HS512"}}};

void drop_error(void*, const char*, int, std::uint64_t, const char*, va_list) {}

// Appended, not "\"" + std::string(s): GCC 12 at -O3 warns on that (a false -Wrestrict).
std::string quoted(std::string_view s) { return std::string(1, '"').append(s).append(1, '"'); }

// A value from a file or a token, safe to put in a message: visible ASCII, at most 64 bytes.
std::string printable(std::string_view s) {
  std::string out;
  for (const char c : s.substr(0, 64)) out += (c >= 0x21 && c <= 0x7e) ? c : '?';
  if (s.size() > 64) out += "...";
  return out;
}

std::string list(const std::vector<Algorithm>& algorithms) {
  std::string out;
  for (const auto a : algorithms) out += (out.empty() ? "" : ", ") + std::string(to_string(a));
  return out;
}

bool allowed(const JwtOptions& options, Algorithm a) {
  return std::find(options.algorithms.begin(), options.algorithms.end(), a) != options.algorithms.end();
}

// The hash size an HMAC algorithm needs its key to reach at least (RFC 7518 §3.2).
std::size_t hmac_min_key(Algorithm a) {
  switch (a) {
    case Algorithm::HS384:
      return 48;
    case Algorithm::HS512:
      return 64;
    default:
      return 32;
  }
}

// The file's bytes; above `limit` bytes an error saying "larger than `shown` bytes".
std::expected<std::string, std::string> read_file(const std::string& what, const std::string& path, std::size_t limit,
                                                  std::size_t shown) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::unexpected(what + " " + quoted(path) + ": cannot read the file: " + std::strerror(errno));
  std::string text;
  char buffer[8192];
  while (in.read(buffer, sizeof buffer) || in.gcount() > 0) {
    text.append(buffer, static_cast<std::size_t>(in.gcount()));
    if (text.size() > limit) {
      OPENSSL_cleanse(text.data(), text.size());
      return std::unexpected(what + " " + quoted(path) + ": larger than " + std::to_string(shown) + " bytes");
    }
  }
  if (in.bad()) return std::unexpected(what + " " + quoted(path) + ": read failed");
  return text;
}

const char* string_member(const json_t* object, const char* name) {
  const json_t* v = json_object_get(object, name);
  return json_is_string(v) ? json_string_value(v) : nullptr;
}

// Where one key came from, for its messages.
struct Origin {
  std::string file;
  std::size_t index = 0;  // 1-based position in the file
};

class Loader {
 public:
  Loader(JwtOptions& options, std::vector<std::string>* warnings) : options_(options), warnings_(warnings) {}

  std::expected<void, std::string> load_key_file(const std::string& path) {
    const std::string what = "keys " + quoted(path);
    auto text = read_file("keys", path, kMaxKeyFile, kMaxKeyFile);
    if (!text) return std::unexpected(text.error());
    const auto first = text->find_first_not_of(" \t\r\n");
    if (first == std::string::npos) return std::unexpected(what + ": the file is empty");
    if ((*text)[first] == '{') return load_jwk_set(path, *text);
    if (text->find("-----BEGIN ") != std::string::npos) return load_pem(path, *text);
    return std::unexpected(what + ": neither a JWK Set (JSON) nor PEM");
  }

  std::expected<void, std::string> load_secret(const std::string& path) {
    const std::string what = "secret_file " + quoted(path);
    // Room for a line ending after the longest secret.
    auto text = read_file("secret_file", path, kMaxSecret + 2, kMaxSecret);
    if (!text) return std::unexpected(text.error());
    // Editors and `echo` end files with a newline; a secret ending in one is implausible.
    std::size_t size = text->size();
    if (size > 0 && (*text)[size - 1] == '\n') --size;
    if (size > 0 && (*text)[size - 1] == '\r') --size;
    std::size_t needed = 0;
    for (const auto a : options_.algorithms) needed = std::max(needed, hmac_min_key(a));
    std::expected<void, std::string> result;
    if (size == 0) {
      result = std::unexpected(what + ": the file is empty");
    } else if (size > kMaxSecret) {
      result = std::unexpected(what + ": larger than " + std::to_string(kMaxSecret) + " bytes");
    } else if (size < needed) {
      result =
          std::unexpected(what + ": the secret is " + std::to_string(size) + " bytes; " + list(options_.algorithms) +
                          " needs at least " + std::to_string(needed) + " (RFC 7518 3.2)");
    } else {
      Json k(jose_b64_enc(text->data(), size));
      Jwk jwk(json_pack("{s:s,s:O}", "kty", "oct", "k", k.get()));
      if (!k || !jwk) {
        result = std::unexpected(what + ": out of memory");
      } else {
        Key key;
        key.jwk = std::move(jwk);
        key.name = "the secret in " + quoted(path);
        for (const auto a : options_.algorithms) key.algorithms.push_back(a);
        keys_.push_back(std::move(key));
      }
    }
    OPENSSL_cleanse(text->data(), text->size());
    return result;
  }

  std::vector<Key> take() { return std::move(keys_); }

 private:
  void warn(const std::string& line) {
    if (warnings_ != nullptr) warnings_->push_back(line);
  }

  std::expected<void, std::string> load_jwk_set(const std::string& path, const std::string& text) {
    const std::string what = "keys " + quoted(path);
    json_error_t error{};
    Json doc(json_loadb(text.data(), text.size(), JSON_REJECT_DUPLICATES, &error));
    if (!doc) {
      return std::unexpected(what + ": not valid JSON (line " + std::to_string(error.line) + ": " + error.text + ")");
    }
    // A JWK Set ({"keys": [...]}, what providers publish), or one bare JWK.
    std::vector<json_t*> entries;
    if (json_t* keys = json_object_get(doc.get(), "keys")) {
      if (!json_is_array(keys)) return std::unexpected(what + ": \"keys\" is not an array");
      std::size_t i = 0;
      json_t* entry = nullptr;
      json_array_foreach(keys, i, entry) entries.push_back(entry);
      if (entries.empty()) return std::unexpected(what + ": the key set is empty");
    } else if (json_object_get(doc.get(), "kty") != nullptr) {
      entries.push_back(doc.get());
    } else {
      return std::unexpected(what + ": neither a JWK Set ({\"keys\": [...]}) nor a JWK");
    }
    for (std::size_t i = 0; i < entries.size(); ++i) {
      auto admitted = admit(entries[i], Origin{path, i + 1});
      if (!admitted) return std::unexpected(admitted.error());
    }
    return {};
  }

  std::expected<void, std::string> load_pem(const std::string& path, const std::string& text) {
    const std::string what = "keys " + quoted(path);
    std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new_mem_buf(text.data(), static_cast<int>(text.size())),
                                                  &BIO_free);
    if (!bio) return std::unexpected(what + ": out of memory");
    Cfg cfg = quiet_cfg();
    std::size_t index = 0;
    for (;;) {
      char* name = nullptr;
      char* header = nullptr;
      unsigned char* data = nullptr;
      long length = 0;
      if (PEM_read_bio(bio.get(), &name, &header, &data, &length) != 1) {
        ERR_clear_error();  // the end of the file reads as an error too
        break;
      }
      ++index;
      const std::string block = name;
      const unsigned char* p = data;
      EVP_PKEY* pkey = nullptr;
      if (block == "PUBLIC KEY") {
        pkey = d2i_PUBKEY(nullptr, &p, length);
      } else if (block == "RSA PUBLIC KEY") {
        pkey = d2i_PublicKey(EVP_PKEY_RSA, nullptr, &p, length);
      } else if (block == "CERTIFICATE") {
        if (X509* cert = d2i_X509(nullptr, &p, length)) {
          pkey = X509_get_pubkey(cert);
          X509_free(cert);
        }
      }
      OPENSSL_cleanse(data, static_cast<std::size_t>(length));
      OPENSSL_free(name);
      OPENSSL_free(header);
      OPENSSL_free(data);
      ERR_clear_error();
      const std::string where = what + ": PEM block #" + std::to_string(index) + " (" + printable(block) + ")";
      if (block.find("PRIVATE KEY") != std::string::npos) {
        return std::unexpected(where +
                               " is a private key: give the gateway the public key only "
                               "(openssl pkey -in KEY -pubout)");
      }
      if (block != "PUBLIC KEY" && block != "RSA PUBLIC KEY" && block != "CERTIFICATE") {
        return std::unexpected(where + ": not a public key (PUBLIC KEY, RSA PUBLIC KEY or CERTIFICATE)");
      }
      if (pkey == nullptr) return std::unexpected(where + ": malformed");
      Json jwk(jose_openssl_jwk_from_EVP_PKEY(cfg.get(), pkey));
      EVP_PKEY_free(pkey);
      if (!jwk) return std::unexpected(where + ": a key type libjose does not read (RSA and EC keys are)");
      auto admitted = admit(jwk.get(), Origin{path, index});
      if (!admitted) return std::unexpected(admitted.error());
    }
    if (index == 0) return std::unexpected(what + ": no PEM block could be read");
    return {};
  }

  // Checks one JWK; adds it to keys_ when it can verify something, warns when it is skipped.
  std::expected<void, std::string> admit(const json_t* entry, const Origin& origin) {
    std::string name = "key #" + std::to_string(origin.index);
    if (!json_is_object(entry))
      return std::unexpected("keys " + quoted(origin.file) + ": " + name + ": not a JSON object");
    const json_t* kid_node = json_object_get(entry, "kid");
    std::optional<std::string> kid;
    if (kid_node != nullptr) {
      if (!json_is_string(kid_node)) {
        return std::unexpected("keys " + quoted(origin.file) + ": " + name + ": \"kid\" is not a string");
      }
      kid.emplace(json_string_value(kid_node), json_string_length(kid_node));
      name += " (kid " + quoted(printable(*kid)) + ")";
    }
    name += " in " + quoted(origin.file);
    auto fail = [&](const std::string& why) { return std::unexpected(name + ": " + why); };
    auto skip = [&](const std::string& why) {
      warn(name + " skipped: " + why);
      return std::expected<void, std::string>();
    };

    const char* kty = string_member(entry, "kty");
    if (kty == nullptr) return fail("no \"kty\"");
    if (const json_t* use = json_object_get(entry, "use")) {
      if (!json_is_string(use)) return fail("\"use\" is not a string");
      if (std::strcmp(json_string_value(use), "sig") != 0) {
        return skip("\"use\" is " + quoted(printable(json_string_value(use))) + ", not \"sig\"");
      }
    }
    if (const json_t* ops = json_object_get(entry, "key_ops")) {
      if (!json_is_array(ops)) return fail("\"key_ops\" is not an array");
      bool verify = false;
      std::size_t i = 0;
      const json_t* op = nullptr;
      json_array_foreach(ops, i, op) {
        if (json_is_string(op) && std::strcmp(json_string_value(op), "verify") == 0) verify = true;
      }
      if (!verify) return skip("its \"key_ops\" do not include \"verify\"");
    }

    // The public JWK libjose gets is rebuilt from the members a public key has, so nothing else
    // in the file (private parts, x5c, a misleading "alg") reaches the verification.
    Jwk jwk;
    std::vector<Algorithm> type_algorithms;
    std::string type;
    if (std::strcmp(kty, "RSA") == 0) {
      const char* n = string_member(entry, "n");
      const char* e = string_member(entry, "e");
      if (n == nullptr || e == nullptr) return fail("an RSA key needs \"n\" and \"e\" (strings)");
      jwk.reset(json_pack("{s:s,s:s,s:s}", "kty", "RSA", "n", n, "e", e));
      type_algorithms.assign(kRsaAlgorithms.begin(), kRsaAlgorithms.end());
      type = "RSA";
      for (const char* secret : {"d", "p", "q", "dp", "dq", "qi", "oth"}) {
        if (json_object_get(entry, secret) != nullptr) {
          warn(name +
               " holds private key material; only its public part is used (give the gateway "
               "public keys only)");
          break;
        }
      }
    } else if (std::strcmp(kty, "EC") == 0) {
      const char* crv = string_member(entry, "crv");
      const char* x = string_member(entry, "x");
      const char* y = string_member(entry, "y");
      if (crv == nullptr || x == nullptr || y == nullptr)
        return fail("an EC key needs \"crv\", \"x\" and \"y\" (strings)");
      if (std::strcmp(crv, "P-256") == 0) {
        type_algorithms = {Algorithm::ES256};
      } else if (std::strcmp(crv, "P-384") == 0) {
        type_algorithms = {Algorithm::ES384};
      } else if (std::strcmp(crv, "P-521") == 0) {
        type_algorithms = {Algorithm::ES512};
      } else {
        return skip("curve " + quoted(printable(crv)) + " is not supported (P-256, P-384, P-521 are)");
      }
      jwk.reset(json_pack("{s:s,s:s,s:s,s:s}", "kty", "EC", "crv", crv, "x", x, "y", y));
      type = std::string("EC ") + crv;
      if (json_object_get(entry, "d") != nullptr) {
        warn(name +
             " holds private key material; only its public part is used (give the gateway "
             "public keys only)");
      }
    } else if (std::strcmp(kty, "oct") == 0) {
      return fail("a symmetric (oct) key: an HMAC secret goes in secret_file, never in keys");
    } else {
      return skip("key type " + quoted(printable(kty)) + " is not supported (RSA and EC are)");
    }
    if (!jwk) return fail("out of memory");

    // libjose turns the JWK into an OpenSSL key at every verification; doing it once now finds
    // malformed numbers and points that are not on their curve at start-up instead.
    Cfg cfg = quiet_cfg();
    EVP_PKEY* pkey = jose_openssl_jwk_to_EVP_PKEY(cfg.get(), jwk.get());
    ERR_clear_error();
    if (pkey == nullptr) return fail("a malformed " + type + " key");
    const int bits = EVP_PKEY_get_bits(pkey);
    EVP_PKEY_free(pkey);
    if (type == "RSA" && bits < static_cast<int>(kMinRsaBits)) {
      return skip("an RSA key of " + std::to_string(bits) + " bits is below " + std::to_string(kMinRsaBits) +
                  " (RFC 7518 3.3)");
    }

    std::vector<Algorithm> usable;
    if (const json_t* alg = json_object_get(entry, "alg")) {
      const auto a = json_is_string(alg) ? parse_algorithm(json_string_value(alg)) : std::nullopt;
      if (!a || std::find(type_algorithms.begin(), type_algorithms.end(), *a) == type_algorithms.end()) {
        return fail("\"alg\" " + (json_is_string(alg) ? quoted(printable(json_string_value(alg))) : "(not a string)") +
                    " does not fit a" + (type == "RSA" ? "n " : " ") + type + " key");
      }
      type_algorithms = {*a};
    }
    for (const auto a : type_algorithms) {
      if (allowed(options_, a)) usable.push_back(a);
    }
    if (usable.empty()) {
      return skip("a " + type + " key verifies " + list(type_algorithms) + ", none of which is in algorithms (" +
                  list(options_.algorithms) + ")");
    }
    Key key;
    key.jwk = std::move(jwk);
    key.kid = std::move(kid);
    key.algorithms = std::move(usable);
    key.name = std::move(name);
    keys_.push_back(std::move(key));
    return {};
  }

  JwtOptions& options_;
  std::vector<std::string>* warnings_;
  std::vector<Key> keys_;
};

std::expected<void, std::string> check_options(JwtOptions& options) {
  if (options.claims.empty()) return std::unexpected("claims: list at least one claim, e.g. [\"sub\"]");
  if (options.claims.size() > kMaxClaims) {
    return std::unexpected("claims: at most " + std::to_string(kMaxClaims) + " claims");
  }
  std::set<std::string> seen;
  for (const auto& c : options.claims) {
    if (c.empty()) return std::unexpected("claims: a claim name is empty");
    if (!seen.insert(c).second) return std::unexpected("claims: " + quoted(printable(c)) + " is listed twice");
  }
  const bool keys = !options.key_files.empty();
  const bool secret = !options.secret_file.empty();
  if (keys == secret) {
    return std::unexpected(keys ? "use either keys (public keys) or secret_file (an HMAC secret), not both"
                                : "from = \"jwt\" needs keys = \"FILE\" (a JWK Set or PEM public keys) or "
                                  "secret_file = \"FILE\" (an HMAC secret)");
  }
  for (const auto& f : options.key_files) {
    if (f.empty()) return std::unexpected("keys: a file name is empty");
  }
  if (options.algorithms.empty()) {
    options.algorithms =
        secret ? std::vector<Algorithm>{Algorithm::HS256} : std::vector<Algorithm>{Algorithm::RS256, Algorithm::ES256};
  }
  std::vector<Algorithm> unique;
  for (const auto a : options.algorithms) {
    if (is_symmetric(a) && keys) {
      return std::unexpected("algorithms: " + std::string(to_string(a)) +
                             " is an HMAC: it takes secret_file, and public keys never verify it");
    }
    if (!is_symmetric(a) && secret) {
      return std::unexpected("algorithms: " + std::string(to_string(a)) +
                             " is a public-key signature: it takes keys, not secret_file");
    }
    if (std::find(unique.begin(), unique.end(), a) == unique.end()) unique.push_back(a);
  }
  options.algorithms = std::move(unique);
  if (options.audience && options.audience->empty()) return std::unexpected("audience: must not be empty");
  if (options.issuer && options.issuer->empty()) return std::unexpected("issuer: must not be empty");
  if (options.leeway < Millis::zero()) return std::unexpected("leeway: must not be negative");
  if (options.max_token_size == 0) return std::unexpected("max_token_size: must be positive");
  return {};
}

}  // namespace

std::string_view to_string(Algorithm algorithm) {
  for (const auto& n : kNames) {
    if (n.algorithm == algorithm) return n.name;
  }
  return "?";
}

std::optional<Algorithm> parse_algorithm(std::string_view name) {
  for (const auto& n : kNames) {
    if (n.name == name) return n.algorithm;
  }
  return std::nullopt;
}

bool is_symmetric(Algorithm algorithm) {
  return std::find(kHmacAlgorithms.begin(), kHmacAlgorithms.end(), algorithm) != kHmacAlgorithms.end();
}

Cfg quiet_cfg() {
  Cfg cfg(jose_cfg());
  if (cfg) jose_cfg_set_err_func(cfg.get(), &drop_error, nullptr);
  return cfg;
}

void JwkDeleter::operator()(json_t* jwk) const {
  // Only the last owner clears: a JWK still shared must keep its secret.
  if (jwk != nullptr && jwk->refcount == 1) {
    if (json_t* k = json_object_get(jwk, "k"); json_is_string(k)) {
      OPENSSL_cleanse(const_cast<char*>(json_string_value(k)), json_string_length(k));
    }
  }
  json_decref(jwk);
}

Json parse_object(std::string_view text) {
  json_error_t error{};
  Json doc(json_loadb(text.data(), text.size(), JSON_REJECT_DUPLICATES, &error));
  if (!doc || !json_is_object(doc.get())) return nullptr;
  return doc;
}

KeySet::KeySet(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
KeySet::~KeySet() = default;

const JwtOptions& KeySet::options() const { return impl_->options; }
std::size_t KeySet::size() const { return impl_->keys.size(); }

std::expected<std::shared_ptr<const KeySet>, std::string> KeySet::load(JwtOptions options,
                                                                       std::vector<std::string>* warnings) {
  if (auto checked = check_options(options); !checked) return std::unexpected(checked.error());
  std::vector<std::string> local;
  Loader loader(options, &local);
  if (!options.secret_file.empty()) {
    if (auto r = loader.load_secret(options.secret_file); !r) return std::unexpected(r.error());
    // A secret others can read is a secret anyone on the machine can sign tokens with.
    struct stat st {};
    if (::stat(options.secret_file.c_str(), &st) == 0 && (st.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
      local.push_back("secret_file " + quoted(options.secret_file) + " can be read by other users (chmod 600 it)");
    }
  }
  for (const auto& file : options.key_files) {
    if (auto r = loader.load_key_file(file); !r) return std::unexpected(r.error());
  }
  auto impl = std::make_unique<Impl>();
  impl->keys = loader.take();
  if (impl->keys.empty()) {
    std::string files;
    for (const auto& f : options.key_files) files += (files.empty() ? "" : ", ") + quoted(f);
    return std::unexpected("keys " + files + ": no key can verify any of the allowed algorithms (" +
                           list(options.algorithms) + ")");
  }
  if (warnings != nullptr) warnings->insert(warnings->end(), local.begin(), local.end());
  impl->options = std::move(options);
  return std::shared_ptr<const KeySet>(new KeySet(std::move(impl)));
}

}  // namespace idem::auth
