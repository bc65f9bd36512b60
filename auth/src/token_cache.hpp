#pragma once

// Private to idem::auth: the verified-token cache of one JwtVerifier.

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <list>
#include <string>
#include <string_view>
#include <unordered_map>

namespace idem::auth {

/// SHA-256 of a token: the cache's key, so the map holds no credential, only its hash.
using TokenDigest = std::array<unsigned char, 32>;

/// The SHA-256 of `token`.
TokenDigest digest_of(std::string_view token);

/// Verified tokens by digest: least recently used out first once `capacity` is reached, each
/// valid until its expiry (epoch milliseconds, the leeway included). One thread.
class TokenCache {
 public:
  explicit TokenCache(std::size_t capacity) : capacity_(capacity) {}

  /// What a lookup found.
  struct Hit {
    const std::string* tenant = nullptr;  ///< null: not cached (or expired, and now dropped)
    bool expired = false;                 ///< cached, but past its expiry: dropped
  };

  /// The tenant of a token verified before and still valid at `now_ms`; an expired entry is
  /// dropped and reported as such (its token needs no new signature check to be refused).
  Hit find(const TokenDigest& digest, std::int64_t now_ms) {
    const auto it = index_.find(digest);
    if (it == index_.end()) return {};
    if (now_ms > it->second->expires_ms) {
      lru_.erase(it->second);
      index_.erase(it);
      return Hit{nullptr, true};
    }
    lru_.splice(lru_.begin(), lru_, it->second);
    return Hit{&it->second->tenant, false};
  }

  /// Remembers a verified token; the least recently used one makes room when full.
  void insert(const TokenDigest& digest, std::string tenant, std::int64_t expires_ms) {
    if (capacity_ == 0) return;
    if (const auto it = index_.find(digest); it != index_.end()) {
      it->second->tenant = std::move(tenant);
      it->second->expires_ms = expires_ms;
      lru_.splice(lru_.begin(), lru_, it->second);
      return;
    }
    if (index_.size() >= capacity_) {
      index_.erase(lru_.back().digest);
      lru_.pop_back();
    }
    lru_.push_front(Entry{digest, std::move(tenant), expires_ms});
    index_.emplace(digest, lru_.begin());
  }

  /// Entries held, expired ones included.
  std::size_t size() const { return index_.size(); }

 private:
  struct Entry {
    TokenDigest digest;
    std::string tenant;
    std::int64_t expires_ms;
  };
  struct DigestHash {
    // A SHA-256 is uniformly distributed already: its first bytes are a hash.
    std::size_t operator()(const TokenDigest& d) const {
      std::size_t h;
      std::memcpy(&h, d.data(), sizeof h);
      return h;
    }
  };

  std::size_t capacity_;
  std::list<Entry> lru_;  // most recently used first
  std::unordered_map<TokenDigest, std::list<Entry>::iterator, DigestHash> index_;
};

}  // namespace idem::auth
