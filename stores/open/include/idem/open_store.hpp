#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "idem/clock.hpp"
#include "idem/redact.hpp"  // redact_url, for printing a store URL
#include "idem/store.hpp"
#include "idem/store_admin.hpp"

namespace idem {

/// A store opened from a URL, with its operator interface.
struct OpenedStore {
  std::unique_ptr<Store> store;
  StoreAdmin* admin = nullptr;  ///< the same object as `store`, seen as StoreAdmin
  std::string name;             ///< the URL with any password removed, for logs
};

/// Settings that apply to every backend opened by URL.
struct OpenStoreOptions {
  /// Clock for background work (the reaper); the system clock when null. Must outlive the store.
  const Clock* clock = nullptr;
  /// How often the store's own reaper deletes expired records; zero: none.
  Millis reaper_interval{0};
};

/// Opens the store a URL names:
///   memory:                                    in this process only
///   sqlite:PATH[?opts]                         an SQLite file (created if missing); opts:
///                                              synchronous, busy_timeout_ms, max_batch,
///                                              wal_autocheckpoint (docs/gateway.md)
///   postgres://USER[:PASS]@HOST[:PORT]/DB[?opts]  PostgreSQL
///   redis://HOST:PORT[/DB]                     Redis standalone
///   redis+cluster://HOST:PORT,HOST:PORT,...    Redis Cluster (seed nodes)
/// Errors say what is wrong without echoing a password.
StoreResult<OpenedStore> open_store(std::string_view url, const OpenStoreOptions& options = {});

/// Checks a store URL's form without connecting; nullopt when valid, else a one-line reason.
std::optional<std::string> check_store_url(std::string_view url);

/// The database file a valid `sqlite:` URL names (its options left out); nullopt for any other
/// URL.
std::optional<std::string> sqlite_path_of(std::string_view url);

}  // namespace idem
