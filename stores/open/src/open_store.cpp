#include "idem/open_store.hpp"

#include "idem/memory_store.hpp"
#include "idem/postgres_store.hpp"
#include "idem/redis_store.hpp"
#include "idem/sqlite_store.hpp"

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

std::string_view sqlite_path(std::string_view url) {
  std::string_view path = url.substr(7);
  if (path.starts_with("//")) path.remove_prefix(2);  // sqlite:///abs/path
  return path;
}

StoreError bad_url(std::string message) { return StoreError{StoreErrc::internal, std::move(message)}; }

}  // namespace

std::string redact_store_url(std::string_view url) {
  const auto scheme_end = url.find("://");
  if (scheme_end == std::string_view::npos) return std::string(url);
  const auto authority = scheme_end + 3;
  const auto at = url.find('@', authority);
  const auto slash = url.find('/', authority);
  if (at == std::string_view::npos || (slash != std::string_view::npos && at > slash)) return std::string(url);
  const auto colon = url.find(':', authority);
  if (colon == std::string_view::npos || colon > at) return std::string(url);
  return std::string(url.substr(0, colon + 1)) + "***" + std::string(url.substr(at));
}

std::optional<std::string> check_store_url(std::string_view url) {
  switch (scheme_of(url)) {
    case Scheme::memory:
      return std::nullopt;
    case Scheme::sqlite:
      if (sqlite_path(url).empty()) return "expected sqlite:PATH, e.g. \"sqlite:./var/idem.db\"";
      return std::nullopt;
    case Scheme::postgres:
      return std::nullopt;  // libpq checks the rest when connecting
    case Scheme::redis:
    case Scheme::redis_cluster:
      return std::nullopt;  // the store checks hosts and ports when it opens
    case Scheme::unknown:
      break;
  }
  return "unknown store URL \"" + redact_store_url(url) +
         "\"; expected memory:, sqlite:PATH, postgres://..., redis://HOST:PORT or redis+cluster://HOST:PORT,...";
}

StoreResult<OpenedStore> open_store(std::string_view url, const OpenStoreOptions& options) {
  if (auto problem = check_store_url(url)) return std::unexpected(bad_url(*problem));
  OpenedStore out;
  out.name = redact_store_url(url);
  switch (scheme_of(url)) {
    case Scheme::memory: {
      auto store = std::make_unique<MemoryStore>();
      out.admin = store.get();
      out.store = std::move(store);
      return out;
    }
    case Scheme::sqlite: {
      SqliteOptions sqlite;
      sqlite.path = std::string(sqlite_path(url));
      sqlite.clock = options.clock;
      sqlite.reaper_interval = options.reaper_interval;
      auto store = SqliteStore::open(std::move(sqlite));
      if (!store) return std::unexpected(std::move(store.error()));
      out.admin = dynamic_cast<StoreAdmin*>(store->get());
      if (!out.admin) return std::unexpected(bad_url("the sqlite store has no operator interface"));
      out.store = std::move(*store);
      return out;
    }
    case Scheme::postgres: {
      PostgresOptions pg;
      pg.conninfo = std::string(url);
      pg.clock = options.clock;
      pg.reaper_interval = options.reaper_interval;
      auto store = PostgresStore::open(std::move(pg));
      if (!store) return std::unexpected(std::move(store.error()));
      out.admin = store->get();
      out.store = std::move(*store);
      return out;
    }
    case Scheme::redis:
    case Scheme::redis_cluster: {
      RedisOptions redis;
      redis.url = std::string(url);
      auto store = RedisStore::open(std::move(redis));
      if (!store) return std::unexpected(std::move(store.error()));
      out.admin = store->get();
      out.store = std::move(*store);
      return out;
    }
    case Scheme::unknown:
      break;
  }
  return std::unexpected(bad_url("unsupported store URL"));
}

}  // namespace idem
