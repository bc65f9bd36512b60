// idem-consume: the consumer sidecar (docs/idem-consume.md). It receives messages from RabbitMQ or
// a Redis stream and POSTs each to an HTTP handler once per message id, in any language.
//
//   idem-consume --source URL --deliver URL [--store URL] [--admin-listen HOST:PORT] [--config FILE]
//
// Exit codes: 0 after SIGTERM/SIGINT (in-flight deliveries finished or handed back), 1 when the
// store cannot be opened or the broker refuses the credentials, 2 for a bad flag or configuration.

#include <atomic>
#include <csignal>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "config.hpp"
#include "http_delivery.hpp"
#include "idem/admin_server.hpp"
#include "idem/client/curl_transport.hpp"
#include "idem/consume_loop.hpp"
#include "idem/gateway/log.hpp"
#include "idem/key_holds.hpp"
#include "idem/open_broker.hpp"
#include "idem/open_store.hpp"
#include "idem/redact.hpp"
#include "idem/sidecar/cli.hpp"
#include "metrics.hpp"

namespace {

using namespace idem;
namespace log = idem::gateway::log;
using gateway::LogLevel;

int fail(int code, const std::string& message) {
  log::drain(std::chrono::seconds(2));  // the lines logged before this one come first
  // Every URL in it redacted, whoever built the message (a CLI11 error quotes arguments).
  std::fprintf(stderr, "idem-consume: %s\n", redact_text(message).c_str());
  return code;
}

// The process's stop request, wherever start-up has got to.
struct Stop {
  std::atomic<bool> requested{false};
  std::mutex mutex;
  ConsumeLoop* loop = nullptr;

  void request() {
    requested.store(true);
    const std::lock_guard lock(mutex);
    if (loop) loop->stop();
  }
  void attach(ConsumeLoop* l) {
    const std::lock_guard lock(mutex);
    loop = l;
    if (l && requested.load()) l->stop();
  }
};

// "source URL: why", or just "why" when it names the source itself already (the broker modules'
// errors start with the source's URL, its secrets hidden).
std::string source_error(const std::string& url, const std::string& why) {
  const auto scheme = url.find("://");
  if (scheme != std::string::npos && why.starts_with(std::string_view(url).substr(0, scheme + 3))) return "source " + why;
  return "source " + redact_url(url) + ": " + why;
}

// Opens the source, waiting while the broker cannot be reached (it may be starting too); a
// broker that refuses the credentials or the queue is an error at once.
BrokerResult<std::unique_ptr<MessageSource>> open_source_patiently(const consume::Config& c, const SourceSettings& s,
                                                                   Stop& stop) {
  Millis delay = s.reconnect_min;
  bool told = false;
  while (true) {
    auto source = open_source(c.source, s);
    if (source || !source.error().retryable() || stop.requested.load()) return source;
    if (!told) log::write(LogLevel::warn, source_error(c.source, source.error().message) + "; waiting for it");
    told = true;
    for (Millis waited{0}; waited < delay && !stop.requested.load(); waited += Millis(50)) {
      std::this_thread::sleep_for(Millis(50));
    }
    delay = std::min(delay * 2, s.reconnect_max);
  }
}

void log_outcome(const Delivery& d, std::string_view outcome, std::string_view detail) {
  const bool bad = outcome.starts_with("dead_letter:");
  const LogLevel level = bad ? LogLevel::warn : LogLevel::info;
  if (!log::enabled(level)) return;
  std::string line = "message id=";
  log::append_quoted(line, d.has_message_id ? d.message_id : std::string("-"));
  line += " outcome=";
  line += outcome;
  if (!d.broker_ref.empty()) line += " ref=" + d.broker_ref;
  if (d.delivery_count > 1) line += " deliveries=" + std::to_string(d.delivery_count);
  if (!detail.empty()) {
    line += " detail=";
    log::append_quoted(line, detail);
  }
  log::write(level, line);
}

int run(int argc, char** argv) {
  CLI::App app{"idem-consume: delivers queue messages to an HTTP handler once per message id (docs/idem-consume.md)",
               "idem-consume"};
  sidecar::FlagOptions options(app, {
      {"source", "amqp[s]://USER:PASS@HOST:PORT/VHOST?queue=NAME, redis+stream://HOST:PORT/STREAM?group=GROUP, kafka://HOST:PORT[,HOST:PORT...]/TOPIC?group=GROUP or sqs+https://HOST/ACCOUNT/QUEUE"},
      {"deliver", "the handler's URL: http://HOST:PORT/PATH or https://... (TLS files: handler_ca_file, handler_cert_file, handler_key_file in --config)"},
      {"store", "where processed message ids are kept (memory:, sqlite:PATH, postgres://, redis://, ...)"},
      {"admin_listen", "HOST:PORT for /metrics, /healthz, /readyz, or off"},
      {"name", "consumer name (records under tenant \"consumer NAME\"); default: the queue, or STREAM/GROUP"},
      {"log_level", "error, warn, info or debug"}});
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    return fail(2, e.what());
  }
  const sidecar::Flags flags = options.flags();

  consume::Config config;
  try {
    config = consume::load(flags);
  } catch (const sidecar::ConfigError& e) {
    return fail(2, e.what());
  }
  log::set_level(config.log_level);

  Stop stop;
  sidecar::StopSignals signals([&stop](int sig) {
    log::notice(std::string(sig == SIGINT ? "SIGINT" : "SIGTERM") +
                ": stopping: no new deliveries; in-flight ones finish or go back to the broker");
    stop.request();
  }, [] { log::write(LogLevel::warn, "SIGHUP ignored: idem-consume does not reload; restart it to apply changes"); });

  auto opened = open_store(config.store, {});
  if (!opened) return fail(1, "store " + redact_url(config.store) + ": " + opened.error().message);
  ConsumerOptions consumer_options;
  consumer_options.name = config.name;
  consumer_options.lease = config.lease;
  consumer_options.retention = config.retention;
  consumer_options.on_lease_expiry = config.on_lease_expiry;
  auto consumer = Consumer::create(*opened->store, consumer_options);
  if (!consumer) return fail(2, consumer.error());

  SourceSettings source_settings;
  source_settings.prefetch = config.prefetch;
  source_settings.consumer = config.consumer;
  source_settings.claim_idle = config.claim_idle;
  source_settings.connect_timeout = config.connect_timeout;
  auto source = open_source_patiently(config, source_settings, stop);
  if (!source) return fail(1, source_error(config.source, source.error().message));

  client::CurlOptions curl;
  curl.connect_timeout = std::min(config.connect_timeout, config.handler_timeout);
  curl.user_agent = "idem-consume/0.1";
  curl.max_idle_handles = config.workers;
  curl.ca_file = config.handler_ca_file;
  curl.cert_file = config.handler_cert_file;
  curl.key_file = config.handler_key_file;
  curl.key_passphrase_file = config.handler_key_passphrase_file;
  auto made = client::CurlTransport::create(curl);
  if (!made) return fail(2, "handler TLS: " + made.error());
  client::CurlTransport& transport = **made;
  consume::HttpDeliveryOptions delivery_options{config.deliver, config.handler_timeout, (*source)->name()};
  if (!config.sign_secret_file.empty()) {
    auto signer = webhook::StandardSigner::load(config.sign_secret_file);
    if (!signer) return fail(2, "sign_secret_file: " + signer.error());
    delivery_options.signer = std::make_shared<const webhook::StandardSigner>(std::move(*signer));
  }
  consume::HttpDelivery delivery(*consumer, transport, delivery_options);

  ConsumeLoopOptions loop_options;
  loop_options.workers = config.workers;
  loop_options.max_in_flight = config.prefetch;
  loop_options.ordering = config.ordering;
  StoreKeyHolds holds(*opened->store, config.name);
  if (config.ordering == ConsumeOrdering::key && config.hold_after_dead_letter) loop_options.holds = &holds;
  loop_options.max_message_bytes = config.max_message_bytes;
  loop_options.max_attempts = config.max_attempts;
  loop_options.retry_min = config.retry_min;
  loop_options.retry_max = config.retry_max;
  loop_options.drain_timeout = config.drain_timeout;
  loop_options.on_outcome = log_outcome;
  loop_options.on_warning = [](std::string_view line) { log::write(LogLevel::warn, line); };
  // The batched form: each receive's messages claimed with one store call, completions shared.
  ConsumeLoop loop(**source, *consumer,
                   [&delivery](const Delivery& d, const DeliveryAttempt& a) { return delivery.effect(d, a); },
                   loop_options);

  std::unique_ptr<admin::AdminServer> admin_server;
  if (config.admin_listen) {
    auto started = admin::AdminServer::start(
        config.admin_listen->host, config.admin_listen->port,
        [&](const admin::AdminRequest& request) -> admin::AdminResponse {
          const std::string_view target = request.target;
          if (target == "/healthz") return {200, "text/plain; charset=utf-8", "ok\n"};
          if (target == "/readyz") {
            if (!loop.ready()) return {503, "text/plain; charset=utf-8", "not ready: the broker does not answer\n"};
            if (auto pinged = BlockingStore(*opened->store).ping(); !pinged) {
              return {503, "text/plain; charset=utf-8", "not ready: store: " + pinged.error().message + "\n"};
            }
            return {200, "text/plain; charset=utf-8", "ready\n"};
          }
          if (target == "/metrics") {
            consume::MetricsExtras extras{loop.ready(), (*source)->reconnects(), log::dropped_lines()};
            return {200, "text/plain; version=0.0.4; charset=utf-8", consume::render_metrics(loop.stats(), extras)};
          }
          return {404, "text/plain; charset=utf-8", "not found: /metrics, /healthz, /readyz\n"};
        });
    if (!started) return fail(1, "admin listener: " + started.error());
    admin_server = std::move(*started);
  }

  std::string line = "consuming " + (*source)->name() + " as consumer \"" + config.name + "\", delivering to " +
                     redact_url(config.deliver) + ", store " + redact_url(config.store) + ", " +
                     std::to_string(config.workers) + " workers, prefetch " + std::to_string(config.prefetch);
  if (!config.handler_cert_file.empty()) line += ", client certificate " + config.handler_cert_file;
  if (delivery_options.signer) {
    line += ", signing with " + std::to_string(delivery_options.signer->secret_count()) + " secret(s)";
  }
  if (admin_server) line += ", admin on " + config.admin_listen->host + ":" + std::to_string(admin_server->port());
  log::notice(line);

  stop.attach(&loop);
  auto result = loop.run();
  stop.attach(nullptr);
  admin_server.reset();
  if (!result) return fail(1, "source " + (*source)->name() + ": " + result.error().message);
  if (!loop.drained()) {
    // A handler call is still running past drain_timeout; its message was not acked, so the
    // broker delivers it again. Waiting for it would overrun the orchestrator's stop timeout.
    log::write(LogLevel::warn, "drain timeout: deliveries still running are left to the broker to deliver again");
    log::drain(std::chrono::seconds(2));
    std::_Exit(0);
  }
  log::notice("stopped");
  log::drain(std::chrono::seconds(2));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  idem::configure_process_for_stores();  // before SQLite's first use
  std::signal(SIGPIPE, SIG_IGN);  // a vanished peer is an error code, not a fatal signal
  idem::sidecar::block_stop_signals();  // before any thread starts, so that all inherit it
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    return fail(1, e.what());
  }
}
