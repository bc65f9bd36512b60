#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "idem/clock.hpp"
#include "idem/encrypted_store.hpp"
#include "idem/outbox.hpp"
#include "idem/redact.hpp"  // redact_url, for printing a store URL
#include "idem/store.hpp"
#include "idem/store_admin.hpp"

namespace idem {

/// A store opened from a URL, with its operator interface.
struct OpenedStore {
  std::unique_ptr<Store> store;
  StoreAdmin* admin = nullptr;  ///< the same object as `store`, seen as StoreAdmin
  std::string name;             ///< the URL with any password removed, for logs
  /// With OpenStoreOptions::encryption: `store` itself, seen as the decorator (to swap its keys,
  /// or to reach the backend beneath); null otherwise.
  EncryptedStore* encrypted = nullptr;
};

/// Settings that apply to every backend opened by URL.
struct OpenStoreOptions {
  /// Clock for background work (the reaper); the system clock when null. Must outlive the store.
  const Clock* clock = nullptr;
  /// How often the store's own reaper deletes expired records; zero: none.
  Millis reaper_interval{0};
  /// Keys to encrypt stored responses with (docs/security.md): the backend is then wrapped in an
  /// EncryptedStore. Null (the default): responses are stored as they are.
  std::shared_ptr<const KeyRing> encryption;
};

/// Call first thing in main(), before any store or outbox is opened: process-wide settings the
/// stores' libraries want (sqlite_configure_process: SQLite's allocations without a global mutex).
void configure_process_for_stores();

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

/// Settings for open_outbox_reader, whatever the database.
struct OutboxReaderOptions {
  /// A relay's reader (idem-relay): creates the outbox table if missing and, on SQLite, takes
  /// the file's relay lock (one relay per file). False for an operator's (idemctl): it changes
  /// no schema, takes no lock (it works while a relay runs) and cannot claim or settle.
  bool relay = true;
  /// PostgreSQL: the schema holding idem_outbox (the store's PostgresOptions::schema).
  std::string schema = "public";
  /// PostgreSQL: how long connecting may take. (SQLite: the URL's busy_timeout_ms applies.)
  Millis connect_timeout{5000};
};

/// Opens the outbox a URL names (docs/outbox.md):
///   sqlite:PATH[?busy_timeout_ms=N]   the outbox in an existing SQLite file (never created)
///   postgres://USER[:PASS]@HOST[:PORT]/DB[?opts]   the outbox in options.schema
/// Any other scheme is refused: the outbox shares a transaction with the business writes, which
/// only SQLite and PostgreSQL give. Errors say what is wrong without echoing a password.
StoreResult<std::unique_ptr<OutboxReader>> open_outbox_reader(std::string_view url,
                                                              const OutboxReaderOptions& options = {});

}  // namespace idem
