// idem-relay: publishes a transactional outbox (docs/outbox.md) to RabbitMQ, a Redis stream or a
// webhook, at least once, each row with its stable message id.
//
//   idem-relay --outbox sqlite:PATH|postgres://... --sink URL [--admin-listen HOST:PORT] [--config FILE]
//
// Exit codes: 0 after SIGTERM/SIGINT (the batch in hand settled), 1 when the outbox or the sink
// cannot be opened (or another relay holds an SQLite outbox), 2 for a bad flag or configuration.
#include <csignal>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "config.hpp"
#include "idem/admin_server.hpp"
#include "idem/client/curl_transport.hpp"
#include "idem/gateway/log.hpp"
#include "idem/open_broker.hpp"
#include "idem/open_store.hpp"
#include "idem/redact.hpp"
#include "idem/sidecar/cli.hpp"
#include "metrics.hpp"
#include "relay_loop.hpp"
#include "webhook_sink.hpp"

namespace {

using namespace idem;
namespace log = idem::gateway::log;
using gateway::LogLevel;

int fail(int code, const std::string& message) {
  log::drain(std::chrono::seconds(2));
  // Every URL in it redacted, whoever built the message (a CLI11 error quotes arguments).
  std::fprintf(stderr, "idem-relay: %s\n", redact_text(message).c_str());
  return code;
}

bool is_webhook(const std::string& url) { return url.starts_with("http://") || url.starts_with("https://"); }

int run(int argc, char** argv) {
  CLI::App app{"idem-relay: publishes an outbox to a broker or a webhook, at least once (docs/outbox.md)", "idem-relay"};
  sidecar::FlagOptions options(app, {
      {"outbox", "the outbox: sqlite:PATH or postgres://USER:PASS@HOST/DB"},
      {"sink", "amqp[s]://USER:PASS@HOST:PORT/VHOST?exchange=E, redis+stream://HOST:PORT/STREAM, kafka://HOST:PORT[,HOST:PORT...]/TOPIC, sqs+https://HOST/ACCOUNT/QUEUE or http(s)://..."},
      {"admin_listen", "HOST:PORT for /metrics, /healthz, /readyz, or off"},
      {"name", "this relay's name on the rows it holds (default HOSTNAME-PID)"},
      {"log_level", "error, warn, info or debug"}});
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    return fail(2, e.what());
  }
  relay::Config config;
  try {
    config = relay::load(options.flags());
  } catch (const sidecar::ConfigError& e) {
    return fail(2, e.what());
  }
  log::set_level(config.log_level);

  std::mutex loop_mutex;
  relay::RelayLoop* running = nullptr;
  std::atomic<bool> stop_requested{false};
  sidecar::StopSignals signals([&](int sig) {
    log::notice(std::string(sig == SIGINT ? "SIGINT" : "SIGTERM") + ": stopping after the batch in hand");
    stop_requested.store(true);
    const std::lock_guard lock(loop_mutex);
    if (running) running->stop();
  }, [] { log::write(LogLevel::warn, "SIGHUP ignored: idem-relay does not reload; restart it to apply changes"); });

  OutboxReaderOptions reader_options;
  auto outbox = open_outbox_reader(config.outbox, reader_options);
  if (!outbox) return fail(1, "outbox " + redact_url(config.outbox) + ": " + outbox.error().message);

  std::unique_ptr<client::CurlTransport> transport;
  std::unique_ptr<MessageSink> sink;
  relay::WebhookSink* webhook = nullptr;
  std::size_t signing_secrets = 0;  // for the start line: how many, never which
  if (is_webhook(config.sink)) {
    client::CurlOptions curl;
    curl.connect_timeout = std::min(config.connect_timeout, config.webhook_timeout);
    curl.user_agent = "idem-relay/0.1";
    curl.ca_file = config.webhook_ca_file;
    curl.cert_file = config.webhook_cert_file;
    curl.key_file = config.webhook_key_file;
    curl.key_passphrase_file = config.webhook_key_passphrase_file;
    auto made = client::CurlTransport::create(curl);
    if (!made) return fail(2, "webhook TLS: " + made.error());
    transport = std::move(*made);
    std::shared_ptr<const webhook::StandardSigner> signer;
    if (!config.webhook_secret_file.empty()) {
      auto loaded = webhook::StandardSigner::load(config.webhook_secret_file);
      if (!loaded) return fail(2, "webhook_secret_file: " + loaded.error());
      signer = std::make_shared<const webhook::StandardSigner>(std::move(*loaded));
      signing_secrets = signer->secret_count();
    }
    auto w = std::make_unique<relay::WebhookSink>(config.sink, *transport, config.webhook_timeout, signer);
    webhook = w.get();
    sink = std::move(w);
  } else {
    SinkSettings sink_settings;
    sink_settings.connect_timeout = config.connect_timeout;
    sink_settings.confirm_timeout = config.confirm_timeout;
    auto opened = open_sink(config.sink, sink_settings);
    // A broker that cannot be reached now is published to later (the outbox keeps the rows);
    // one that refuses us needs an operator.
    if (!opened) return fail(1, "sink " + redact_url(config.sink) + ": " + opened.error().message);
    sink = std::move(*opened);
  }

  relay::RelayOptions loop_options;
  loop_options.batch = config.batch;
  loop_options.poll_interval = config.poll_interval;
  loop_options.max_attempts = config.max_attempts;
  loop_options.retry_min = config.retry_min;
  loop_options.retry_max = config.retry_max;
  loop_options.lease = config.lease;
  loop_options.retention = config.retention;
  loop_options.owner = config.name;
  if (config.dead_rows == "pass") loop_options.dead_rows_pass.emplace_back("*");
  for (std::string_view rest = config.dead_rows_pass; !rest.empty();) {
    const auto comma = rest.find(',');
    std::string_view one = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    while (!one.empty() && one.front() == ' ') one.remove_prefix(1);
    while (!one.empty() && one.back() == ' ') one.remove_suffix(1);
    if (!one.empty()) loop_options.dead_rows_pass.emplace_back(one);
  }
  if (webhook) loop_options.retry_after = [webhook] { return webhook->take_retry_after(); };
  loop_options.on_warning = [](std::string_view line) { log::write(LogLevel::warn, line); };
  loop_options.on_info = [](std::string_view line) { log::write(LogLevel::debug, line); };
  relay::RelayLoop loop(**outbox, *sink, loop_options);

  std::unique_ptr<admin::AdminServer> admin_server;
  if (config.admin_listen) {
    auto started = admin::AdminServer::start(
        config.admin_listen->host, config.admin_listen->port,
        [&](const admin::AdminRequest& request) -> admin::AdminResponse {
          const std::string_view target = request.target;
          if (target == "/healthz") return {200, "text/plain; charset=utf-8", "ok\n"};
          if (target == "/readyz") {
            if (!loop.stats().ready) return {503, "text/plain; charset=utf-8", "not ready: the outbox or the sink does not answer\n"};
            return {200, "text/plain; charset=utf-8", "ready\n"};
          }
          if (target == "/metrics") {
            return {200, "text/plain; version=0.0.4; charset=utf-8",
                    relay::render_metrics(loop.stats(), log::dropped_lines(), SystemClock::instance().now())};
          }
          return {404, "text/plain; charset=utf-8", "not found: /metrics, /healthz, /readyz\n"};
        });
    if (!started) return fail(1, "admin listener: " + started.error());
    admin_server = std::move(*started);
  }

  std::string line = "relaying " + redact_url(config.outbox) + " to " + sink->name() + " as \"" + config.name +
                     "\", batches of " + std::to_string(config.batch);
  if (signing_secrets > 0) line += ", signing with " + std::to_string(signing_secrets) + " secret(s)";
  if (admin_server) line += ", admin on " + config.admin_listen->host + ":" + std::to_string(admin_server->port());
  log::notice(line);

  {
    const std::lock_guard lock(loop_mutex);
    running = &loop;
    if (stop_requested.load()) loop.stop();
  }
  loop.run();
  {
    const std::lock_guard lock(loop_mutex);
    running = nullptr;
  }
  admin_server.reset();
  log::notice("stopped");
  log::drain(std::chrono::seconds(2));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  idem::configure_process_for_stores();  // before SQLite's first use
  std::signal(SIGPIPE, SIG_IGN);
  idem::sidecar::block_stop_signals();  // before any thread starts, so that all inherit it
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    return fail(1, e.what());
  }
}
