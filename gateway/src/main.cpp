// idem-gateway: a reverse proxy that makes any HTTP API idempotent (docs/gateway.md).
//
//   idem-gateway [--config FILE] [--listen HOST:PORT] [--upstream URL] [--store URL]
//                [--admin-listen HOST:PORT]
//
// Exit codes: 0 after a clean shutdown, 1 when start-up fails (store, bind, resolve), 2 for a
// bad flag or configuration.
#include <CLI/CLI.hpp>

#include <sys/resource.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "idem/encrypted_store.hpp"
#include "idem/engine.hpp"
#include "idem/gateway/config.hpp"
#include "idem/gateway/log.hpp"
#include "idem/open_store.hpp"
#include "idem/redact.hpp"
#include "server.hpp"

namespace {

using namespace idem;
using namespace idem::gateway;

int fail(int code, const std::string& message) {
  log::drain(std::chrono::seconds(2));  // the lines logged before this one come first
  // Every URL in it redacted, whoever built the message (a CLI11 error quotes arguments).
  std::fprintf(stderr, "idem-gateway: %s\n", redact_text(message).c_str());
  return code;
}

// Opens the configured store, encrypting stored responses when the configuration has keys
// (`encrypted` then points at the decorator); on failure returns null and sets `error`.
std::unique_ptr<Store> open_configured_store(const Config& config, EncryptedStore*& encrypted, std::string& error) {
  const StoreUrl& url = config.store;
  if (url.kind == StoreUrl::Kind::sqlite) {
    // The directory is created like the file itself would be: a missing ./var is not an error.
    const std::filesystem::path path(url.path);
    if (path.has_parent_path()) {
      std::error_code ec;
      std::filesystem::create_directories(path.parent_path(), ec);
      if (ec) {
        error = "store " + redact_url(url.text) + ": cannot create directory " + path.parent_path().string() + ": " + ec.message();
        return nullptr;
      }
    }
  }
  OpenStoreOptions options;
  options.reaper_interval = Millis{0};  // the gateway runs its own reaper for every store
  options.encryption = config.encryption_keys;
  auto opened = open_store(url.text, options);
  if (!opened) {
    error = "store " + redact_url(url.text) + ": " + opened.error().message;
    return nullptr;
  }
  encrypted = opened->encrypted;
  return std::move(opened->store);
}

// Raises the soft limit on open files to what max_connections needs: a client connection takes a
// descriptor and, while forwarded, an upstream one; 1024 more cover the store, the pool's idle
// connections and the admin listener. Debian's default soft limit, 1024 (systemd's too), would
// otherwise refuse connections at ~500 clients. The hard limit only root can raise: below the
// need, say so.
void raise_open_files_limit(const Config& config) {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return;
  const rlim_t needed = static_cast<rlim_t>(config.max_connections) * 2 + 1024;
  const rlim_t reachable = limit.rlim_max == RLIM_INFINITY ? needed : std::min(needed, limit.rlim_max);
  if (limit.rlim_cur != RLIM_INFINITY && limit.rlim_cur < reachable) {
    rlimit raised = limit;
    raised.rlim_cur = reachable;
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) limit = raised;
  }
  if (limit.rlim_cur != RLIM_INFINITY && limit.rlim_cur < needed) {
    log::write(LogLevel::warn, "open files limit " + std::to_string(limit.rlim_cur) + " is below the " +
                                   std::to_string(needed) + " that max_connections = " +
                                   std::to_string(config.max_connections) +
                                   " needs: connections beyond ~" + std::to_string(limit.rlim_cur / 2) +
                                   " will wait to be accepted (raise LimitNOFILE / ulimit -Hn, or lower max_connections)");
  }
}

int run(int argc, char** argv) {
  CLI::App app{"idem-gateway: a reverse proxy that makes any HTTP API idempotent (see docs/gateway.md)",
               "idem-gateway"};
  std::string config_path;
  std::string listen, upstream, store_url, admin_listen;
  app.add_option("--config", config_path, "TOML configuration file");
  app.add_option("--listen", listen, "client listener HOST:PORT (overrides `listen`)");
  app.add_option("--upstream", upstream, "upstream http://HOST[:PORT] (overrides `upstream`)");
  app.add_option("--store", store_url, "memory:, sqlite:PATH, postgres://..., redis://HOST:PORT or redis+cluster://HOST:PORT,... (overrides `store`)");
  app.add_option("--admin-listen", admin_listen, "admin listener HOST:PORT or \"off\" (overrides `admin_listen`)");
  app.set_version_flag("--version", "idem-gateway 0.1.0");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    return fail(2, e.what());
  }

  Overrides overrides;
  if (app.count("--listen")) overrides.listen = listen;
  if (app.count("--upstream")) overrides.upstream = upstream;
  if (app.count("--store")) overrides.store = store_url;
  if (app.count("--admin-listen")) overrides.admin_listen = admin_listen;

  const std::optional<std::string> path = app.count("--config") ? std::optional<std::string>(config_path) : std::nullopt;
  std::shared_ptr<const Config> loaded;
  try {
    loaded = std::make_shared<const Config>(load_config(path, overrides));
  } catch (const ConfigError& e) {
    return fail(2, e.what());
  }
  const Config& config = *loaded;
  log::set_level(config.log_level);
  log::set_format(config.log_format);
  for (const auto& warning : config.warnings) log::write(LogLevel::warn, warning);
  raise_open_files_limit(config);

  std::string error;
  // The key ring sits behind an atomic pointer in the decorator: a reload swaps it
  // (encrypted->set_keys); requests in flight keep the ring they started with.
  EncryptedStore* encrypted = nullptr;
  std::unique_ptr<Store> store = open_configured_store(config, encrypted, error);
  if (!store) return fail(1, error);
  if (encrypted != nullptr) {
    const auto keys = encrypted->keys();
    const std::string* sealing = keys->sealing_key_id();
    log::write(LogLevel::info, "encryption: " + std::to_string(keys->keys().size()) + " key(s) from " +
                                   config.encryption_key_file + "; new responses " +
                                   (sealing != nullptr ? "encrypted with key id " + *sealing : "stored unencrypted"));
  }
  Engine engine(*store);
  // A reload reads the same file and applies the same flags: what the command line set stays set.
  Reloader reloader = [path, overrides]() -> std::expected<std::shared_ptr<const Config>, std::string> {
    try {
      return std::make_shared<const Config>(load_config(path, overrides));
    } catch (const ConfigError& e) {
      return std::unexpected(std::string(e.what()));
    }
  };
  auto gateway = std::make_unique<Gateway>(loaded, engine, encrypted, std::move(reloader));
  try {
    gateway->start();
  } catch (const std::exception& e) {
    return fail(1, e.what());
  }
  gateway->run();
  if (config.store.kind == StoreUrl::Kind::memory) {
    // The memory store has nothing to flush, and freeing its records one by one costs a cache
    // and TLB miss each: 2-6 s for a million records here, long enough for an orchestrator's
    // stop timeout to kill the process mid-exit. The exit frees them at once. A static raw
    // pointer (no destructor to run at exit) keeps the store reachable, so leak checkers do not
    // report it.
    [[maybe_unused]] static Store* kept_until_exit = nullptr;
    kept_until_exit = store.release();
  }
  // The store first: its last callbacks are posted to the (stopped) event loops, which must
  // still exist; then the loops, with whatever they still hold.
  store.reset();
  gateway.reset();
  log::drain(std::chrono::seconds(2));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  idem::configure_process_for_stores();  // before SQLite's first use
  std::signal(SIGPIPE, SIG_IGN);  // a vanished peer is an error code, not a fatal signal
  // A file-size limit (ulimit -f, systemd's LimitFSIZE) reached by the SQLite store or the log
  // is a failed write, which the store reports (503, nothing executes) and recovers from once
  // the limit is raised, not a reason to kill every request in flight.
  std::signal(SIGXFSZ, SIG_IGN);
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    return fail(1, e.what());
  }
}
