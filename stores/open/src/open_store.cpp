#include "idem/open_store.hpp"

#include "idem/memory_store.hpp"
#include "idem/postgres_outbox.hpp"
#include "idem/postgres_store.hpp"
#include "idem/redis_store.hpp"
#include "idem/sqlite_outbox.hpp"
#include "idem/sqlite_store.hpp"
#include "sqlite_url.hpp"

namespace idem {
namespace {

enum class Scheme { memory, sqlite, postgres, redis, redis_cluster, unknown };

Scheme scheme_of(std::string_view url) {
  if (url == "memory:" || url == "memory" || url == "memory://") return Scheme::memory;
  if (url.starts_with("sqlite:")) return Scheme::sqlite;
  if (url.starts_with("postgres://") || url.starts_with("postgresql://")) return Scheme::postgres;
  if (url.starts_with("redis+cluster://")) return Scheme::redis_cluster;
  if (url.starts_with("redis://")) return Scheme::redis;
  return Scheme::unknown;
}

StoreError bad_url(std::string message) { return StoreError{StoreErrc::internal, std::move(message)}; }

}  // namespace

std::optional<std::string> check_store_url(std::string_view url) {
  switch (scheme_of(url)) {
    case Scheme::memory:
      return std::nullopt;
    case Scheme::sqlite:
      if (auto parsed = open_detail::parse_sqlite_url(url); !parsed) return parsed.error();
      return std::nullopt;
    case Scheme::postgres:
      return std::nullopt;  // libpq checks the rest when connecting
    case Scheme::redis:
    case Scheme::redis_cluster:
      return std::nullopt;  // the store checks hosts and ports when it opens
    case Scheme::unknown:
      break;
  }
  if (url.starts_with("rediss://") || url.starts_with("rediss+cluster://") || url.starts_with("redis+tls://")) {
    return "Redis over TLS (" + std::string(url.substr(0, url.find("://") + 3)) +
           ") is not supported: Debian's hiredis 0.14 has no TLS. Reach a TLS-only Redis through a local TLS "
           "tunnel (stunnel, spiped) and name the tunnel's end: redis://127.0.0.1:PORT";
  }
  return "unknown store URL \"" + redact_url(url) +
         "\"; expected memory:, sqlite:PATH, postgres://..., redis://HOST:PORT or redis+cluster://HOST:PORT,...";
}

std::optional<std::string> sqlite_path_of(std::string_view url) {
  if (scheme_of(url) != Scheme::sqlite) return std::nullopt;
  auto parsed = open_detail::parse_sqlite_url(url);
  if (!parsed) return std::nullopt;
  return std::move(parsed->path);
}

namespace {

// A store that is also its own operator interface (every backend is), as OpenedStore.
template <class Backend>
StoreResult<OpenedStore> opened(std::string_view url, StoreResult<std::unique_ptr<Backend>> store) {
  if (!store) {
    // A library's message may quote the part of the URL it could not parse, password included.
    StoreError error = std::move(store.error());
    error.message = scrub_secrets(error.message, url);
    return std::unexpected(std::move(error));
  }
  OpenedStore out;
  out.name = redact_url(url);
  out.admin = store->get();
  out.store = std::move(*store);
  return out;
}

// The backend wrapped in an EncryptedStore when the options carry keys.
StoreResult<OpenedStore> encrypted(StoreResult<OpenedStore> opened, const OpenStoreOptions& options) {
  if (!opened || !options.encryption) return opened;
  auto wrapped = std::make_unique<EncryptedStore>(std::move(opened->store), opened->admin, options.encryption);
  opened->encrypted = wrapped.get();
  opened->admin = wrapped.get();
  opened->store = std::move(wrapped);
  return opened;
}

StoreResult<OpenedStore> open_backend(std::string_view url, const OpenStoreOptions& options) {
  if (auto problem = check_store_url(url)) return std::unexpected(bad_url(*problem));
  switch (scheme_of(url)) {
    case Scheme::memory:
      return opened(url, StoreResult<std::unique_ptr<MemoryStore>>(std::make_unique<MemoryStore>()));
    case Scheme::sqlite: {
      SqliteOptions sqlite = *open_detail::parse_sqlite_url(url);  // check_store_url accepted it
      sqlite.clock = options.clock;
      sqlite.reaper_interval = options.reaper_interval;
      return opened(url, SqliteStore::open(std::move(sqlite)));
    }
    case Scheme::postgres: {
      PostgresOptions pg;
      pg.conninfo = std::string(url);
      pg.clock = options.clock;
      pg.reaper_interval = options.reaper_interval;
      return opened(url, PostgresStore::open(std::move(pg)));
    }
    case Scheme::redis:
    case Scheme::redis_cluster: {
      RedisOptions redis;
      redis.url = std::string(url);
      return opened(url, RedisStore::open(std::move(redis)));
    }
    case Scheme::unknown:
      break;
  }
  return std::unexpected(bad_url("unsupported store URL"));
}

}  // namespace

void configure_process_for_stores() { (void)sqlite_configure_process(); }

StoreResult<OpenedStore> open_store(std::string_view url, const OpenStoreOptions& options) {
  return encrypted(open_backend(url, options), options);
}

StoreResult<std::unique_ptr<OutboxReader>> open_outbox_reader(std::string_view url, const OutboxReaderOptions& options) {
  // A library's message may quote the part of the URL it could not parse, password included.
  const auto done = [url](auto opened) -> StoreResult<std::unique_ptr<OutboxReader>> {
    if (!opened) {
      StoreError error = std::move(opened.error());
      error.message = scrub_secrets(error.message, url);
      return std::unexpected(std::move(error));
    }
    return std::unique_ptr<OutboxReader>(std::move(*opened));
  };
  switch (scheme_of(url)) {
    case Scheme::sqlite: {
      auto parsed = open_detail::parse_sqlite_url(url);
      if (!parsed) return std::unexpected(bad_url("outbox URL: " + parsed.error()));
      SqliteOutboxOptions sqlite;
      sqlite.path = parsed->path;
      sqlite.relay = options.relay;
      sqlite.busy_timeout = parsed->busy_timeout;
      return done(SqliteOutbox::open_reader(std::move(sqlite)));
    }
    case Scheme::postgres: {
      PostgresOutboxOptions pg;
      pg.conninfo = std::string(url);
      pg.schema = options.schema;
      pg.relay = options.relay;
      pg.connect_timeout = options.connect_timeout;
      return done(PostgresOutbox::open_reader(std::move(pg)));
    }
    case Scheme::memory:
    case Scheme::redis:
    case Scheme::redis_cluster:
    case Scheme::unknown:
      break;
  }
  return std::unexpected(bad_url(
      "the outbox needs SQLite or PostgreSQL (it commits in the transaction of the business writes): expected "
      "sqlite:PATH or postgres://..., got \"" + redact_url(url) + "\""));
}

}  // namespace idem
