// idem-notifier: the payments example's receipt sender (docs/outbox.md, docs/payments.md). It
// takes the payment.succeeded events the payments service enqueues in its outbox and idem-relay
// publishes (its other events, payment.refunded, it lets pass), and "sends" one receipt per
// payment: a row in its own SQLite receipts table, written exactly once with
// process_once_in_transaction (the receipt and the "processed" record of the event's id commit
// together).
//
//   idem-notifier --db PATH --listen HOST:PORT         a webhook (idem-relay --sink http://...)
//   idem-notifier --db PATH --source URL               a consumer (RabbitMQ queue, Redis stream)
//
// Webhook: POST /events with Idempotency-Key: <event id> and the event as its body: 200 once the
// receipt is committed (or was before); 200 {"ignored": TYPE} for an event of another type (the
// payments service also publishes payment.refunded: not the notifier's business, acknowledged and
// left); 409 with Retry-After while another delivery of the same event is being processed; 422
// for an event it cannot use (the relay marks it dead); 503 when its database fails (the relay
// retries). From a broker, an event of another type is acknowledged, one it cannot use
// dead-lettered. GET /v1/receipts/PAYMENT_ID shows the receipt; GET /healthz answers 200. Both
// forms run until SIGTERM/SIGINT and exit 0.
//
// Exit codes: 0 after SIGTERM/SIGINT, 1 when the database, the listener or the source cannot be
// opened, 2 for a bad flag.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <sqlite3.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <mutex>
#include <string>
#include <thread>

#include "idem/admin_server.hpp"
#include "idem/consume_loop.hpp"
#include "idem/open_broker.hpp"
#include "idem/redact.hpp"
#include "idem/sqlite_consumer.hpp"
#include "idem/sqlite_store.hpp"

namespace {

using json = nlohmann::json;

// A receipt, as taken from a payment.succeeded event.
struct Receipt {
  std::string event_id;
  std::string payment_id;
  std::string payer;
  std::int64_t amount = 0;
  std::string currency;
};

// What an event is to the notifier.
enum class EventKind : std::uint8_t {
  receipt,    ///< a payment.succeeded: `r` is its receipt
  other,      ///< an event of another type (`detail`: the type): acknowledged, nothing sent
  malformed,  ///< not an event, or a payment.succeeded without what a receipt needs (`detail`: why)
};

EventKind parse_event(std::string_view body, std::string event_id, Receipt& r, std::string& detail) {
  const json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) {
    detail = "not an event: a JSON object with a \"type\" is expected";
    return EventKind::malformed;
  }
  if (const auto& type = j["type"].get_ref<const std::string&>(); type != "payment.succeeded") {
    detail = type;
    return EventKind::other;
  }
  if (!j.contains("payment") || !j["payment"].is_object()) {
    detail = "a payment.succeeded event without its payment";
    return EventKind::malformed;
  }
  const json& p = j["payment"];
  if (!p.contains("id") || !p["id"].is_string() || !p.contains("from") || !p["from"].is_string() ||
      !p.contains("amount") || !p["amount"].is_number_integer() || !p.contains("currency") ||
      !p["currency"].is_string()) {
    detail = "the event's payment lacks id, from, amount or currency";
    return EventKind::malformed;
  }
  r.event_id = std::move(event_id);
  r.payment_id = p["id"].get<std::string>();
  r.payer = p["from"].get<std::string>();
  r.amount = p["amount"].get<std::int64_t>();
  r.currency = p["currency"].get<std::string>();
  return EventKind::receipt;
}

bool exec(sqlite3* db, const char* sql, std::string& error) {
  char* message = nullptr;
  if (sqlite3_exec(db, sql, nullptr, nullptr, &message) == SQLITE_OK) return true;
  error = message ? message : sqlite3_errmsg(db);
  sqlite3_free(message);
  return false;
}

// The receipts table, beside the store's in the same file. No unique constraint on payment_id on
// purpose: "exactly once" is idem's to prove here, and the tests count the rows.
bool create_receipts(sqlite3* db, std::string& error) {
  return exec(db,
              "CREATE TABLE IF NOT EXISTS receipts (event_id TEXT NOT NULL, payment_id TEXT NOT NULL, "
              "payer TEXT NOT NULL, amount INTEGER NOT NULL, currency TEXT NOT NULL, sent_at INTEGER NOT NULL);"
              "CREATE INDEX IF NOT EXISTS receipts_payment ON receipts (payment_id);",
              error);
}

// "Sends" the receipt: on the store's connection, in its transaction.
bool send_receipt(sqlite3* db, const Receipt& r, std::string& error) {
  sqlite3_stmt* stmt = nullptr;
  bool ok = sqlite3_prepare_v2(db,
                               "INSERT INTO receipts (event_id, payment_id, payer, amount, currency, sent_at) "
                               "VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                               -1, &stmt, nullptr) == SQLITE_OK;
  if (ok) {
    sqlite3_bind_text(stmt, 1, r.event_id.c_str(), -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(stmt, 2, r.payment_id.c_str(), -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(stmt, 3, r.payer.c_str(), -1, SQLITE_TRANSIENT);
    sqlite3_bind_int64(stmt, 4, r.amount);
    sqlite3_bind_text(stmt, 5, r.currency.c_str(), -1, SQLITE_TRANSIENT);
    sqlite3_bind_int64(stmt, 6, static_cast<std::int64_t>(std::time(nullptr)));
    ok = sqlite3_step(stmt) == SQLITE_DONE;
  }
  if (!ok) error = sqlite3_errmsg(db);
  sqlite3_finalize(stmt);
  return ok;
}

// GET /v1/receipts/ID on a read connection of its own (WAL: never waits for the writer).
idem::admin::AdminResponse show_receipts(sqlite3* reader, std::mutex& reader_mutex, std::string_view payment_id) {
  const std::lock_guard lock(reader_mutex);
  sqlite3_stmt* stmt = nullptr;
  json receipts = json::array();
  if (sqlite3_prepare_v2(reader,
                         "SELECT event_id, payer, amount, currency, sent_at FROM receipts WHERE payment_id = ?1",
                         -1, &stmt, nullptr) != SQLITE_OK) {
    return {503, "application/json", json({{"error", sqlite3_errmsg(reader)}}).dump() + "\n"};
  }
  sqlite3_bind_text(stmt, 1, payment_id.data(), static_cast<int>(payment_id.size()), SQLITE_TRANSIENT);
  while (sqlite3_step(stmt) == SQLITE_ROW) {
    receipts.push_back({{"event_id", reinterpret_cast<const char*>(sqlite3_column_text(stmt, 0))},
                        {"payer", reinterpret_cast<const char*>(sqlite3_column_text(stmt, 1))},
                        {"amount", sqlite3_column_int64(stmt, 2)},
                        {"currency", reinterpret_cast<const char*>(sqlite3_column_text(stmt, 3))},
                        {"sent_at", sqlite3_column_int64(stmt, 4)}});
  }
  sqlite3_finalize(stmt);
  if (receipts.empty()) return {404, "application/json", R"({"error":"no receipt for this payment"})" "\n"};
  return {200, "application/json",
          json({{"object", "receipts"}, {"payment", payment_id}, {"receipts", receipts}}).dump() + "\n"};
}

sigset_t stop_signal_set() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  return set;
}

// Waits for SIGTERM/SIGINT (blocked in every thread since main began).
void wait_for_stop() {
  const sigset_t set = stop_signal_set();
  int sig = 0;
  sigwait(&set, &sig);
}

}  // namespace

int main(int argc, char** argv) {
  idem::sqlite_configure_process();  // before SQLite's first use
  CLI::App app{"idem-notifier: sends one receipt per payment.succeeded event (docs/outbox.md)", "idem-notifier"};
  std::string db_path, listen, source_url, name = "receipts";
  app.add_option("--db", db_path, "SQLite file holding the receipts and the processed event ids")->required();
  app.add_option("--listen", listen, "HOST:PORT: take events as a webhook (POST /events)");
  app.add_option("--source", source_url, "consume events from a broker (amqp://...?queue=Q, redis+stream://...?group=G, kafka://...?group=G, sqs+https://...)");
  app.add_option("--name", name, "consumer name (event ids are scoped by it)")->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (listen.empty() == source_url.empty()) {
    std::fprintf(stderr, "idem-notifier: give exactly one of --listen HOST:PORT and --source URL\n");
    return 2;
  }
  const sigset_t stops = stop_signal_set();
  pthread_sigmask(SIG_BLOCK, &stops, nullptr);  // before any thread starts: all inherit it
  std::signal(SIGPIPE, SIG_IGN);

  auto store = idem::SqliteStore::open({.path = db_path, .reaper_interval = idem::Millis(60'000)});
  if (!store) {
    std::fprintf(stderr, "idem-notifier: --db %s: %s\n", db_path.c_str(), store.error().message.c_str());
    return 1;
  }
  sqlite3* reader = nullptr;
  std::string error;
  if (sqlite3_open_v2(db_path.c_str(), &reader, SQLITE_OPEN_READWRITE, nullptr) != SQLITE_OK ||
      !create_receipts(reader, error)) {
    std::fprintf(stderr, "idem-notifier: --db %s: %s\n", db_path.c_str(), error.empty() ? sqlite3_errmsg(reader) : error.c_str());
    sqlite3_close(reader);
    return 1;
  }
  sqlite3_busy_timeout(reader, 5000);
  std::mutex reader_mutex;
  auto consumer = idem::Consumer::create(**store, {.name = name, .lease = idem::Millis(30'000)});
  if (!consumer) {
    std::fprintf(stderr, "idem-notifier: %s\n", consumer.error().c_str());
    return 2;
  }
  // One payment.succeeded, once: the receipt and the event's record in one transaction.
  auto process = [&](const std::string& event_id, std::string_view body, const Receipt& receipt) {
    return idem::process_once_in_transaction(*consumer, **store, event_id, body, [&](sqlite3* db, std::string& e) {
      return send_receipt(db, receipt, e);
    });
  };

  int code = 0;
  if (!listen.empty()) {
    const auto colon = listen.rfind(':');
    const std::string host = colon == std::string::npos ? listen : listen.substr(0, colon);
    const int port = colon == std::string::npos ? -1 : std::atoi(listen.c_str() + colon + 1);
    if (port < 0 || port > 65535) {
      std::fprintf(stderr, "idem-notifier: --listen %s: expected HOST:PORT\n", listen.c_str());
      return 2;
    }
    auto server = idem::admin::AdminServer::start(host, static_cast<std::uint16_t>(port), [&](const idem::admin::AdminRequest& r)
                                                  -> idem::admin::AdminResponse {
      constexpr std::string_view kReceipts = "/v1/receipts/";
      if (r.method == "GET" && r.target == "/healthz") return {200, "application/json", "{\"status\":\"ok\"}\n"};
      if (r.method == "GET" && r.target.starts_with(kReceipts)) {
        return show_receipts(reader, reader_mutex, r.target.substr(kReceipts.size()));
      }
      if (r.method != "POST" || r.target != "/events") return {404, "application/json", "{\"error\":\"not found\"}\n"};
      const std::string key(r.header("Idempotency-Key"));
      if (key.empty()) return {400, "application/json", "{\"error\":\"Idempotency-Key is required\"}\n"};
      Receipt receipt;
      std::string detail;
      switch (parse_event(r.body, key, receipt, detail)) {
        case EventKind::malformed:
          return {422, "application/json", json({{"error", detail}}).dump() + "\n"};
        case EventKind::other:  // nothing to do, nothing to remember: any delivery is answered alike
          return {200, "application/json", json({{"ignored", detail}}).dump() + "\n"};
        case EventKind::receipt:
          break;
      }
      auto outcome = process(key, r.body, receipt);
      if (!outcome) return {503, "application/json", json({{"error", outcome.error().message}}).dump() + "\n"};
      switch (outcome->status) {
        case idem::MessageStatus::processed:
        case idem::MessageStatus::duplicate:
          return {200, "application/json", json({{"receipt", receipt.payment_id}, {"outcome", idem::to_string(outcome->status)}}).dump() + "\n"};
        case idem::MessageStatus::in_progress:
        case idem::MessageStatus::lost:
          return {409, "application/json", json({{"error", outcome->detail}}).dump() + "\n"};
        case idem::MessageStatus::handler_failed:
          return {503, "application/json", json({{"error", outcome->detail}}).dump() + "\n"};
        default:
          return {422, "application/json", json({{"error", outcome->detail}}).dump() + "\n"};
      }
    });
    if (!server) {
      std::fprintf(stderr, "idem-notifier: %s\n", server.error().c_str());
      return 1;
    }
    std::fprintf(stderr, "idem-notifier: webhook on %s:%u (POST /events), db %s\n", host.c_str(),
                 static_cast<unsigned>((*server)->port()), db_path.c_str());
    wait_for_stop();
  } else {
    auto source = idem::open_source(source_url, {});
    if (!source) {
      std::fprintf(stderr, "idem-notifier: --source %s: %s\n", idem::redact_url(source_url).c_str(),
                   source.error().message.c_str());
      return 1;
    }
    idem::ConsumeLoopOptions options;
    options.on_warning = [](std::string_view line) {
      std::fprintf(stderr, "idem-notifier: %.*s\n", static_cast<int>(line.size()), line.data());
    };
    idem::ConsumeLoop loop(**source, [&](const idem::Delivery& d, const idem::DeliveryAttempt&) {
      Receipt receipt;
      std::string detail;
      switch (parse_event(d.body, d.message_id, receipt, detail)) {
        case EventKind::malformed:
          return idem::MessageDisposition::dead_letter_it("rejected", detail);
        case EventKind::other:
          return idem::MessageDisposition::ack_it("ignored");
        case EventKind::receipt:
          break;
      }
      return idem::disposition_of(process(d.message_id, d.body, receipt));
    }, options);
    std::fprintf(stderr, "idem-notifier: consuming %s, db %s\n", (*source)->name().c_str(), db_path.c_str());
    std::atomic<bool> done{false};
    std::thread waiter([&] {
      const timespec tick{0, 200'000'000};
      while (!done.load()) {
        if (sigtimedwait(&stops, nullptr, &tick) > 0) {
          loop.stop();
          return;
        }
      }
    });
    auto result = loop.run();
    done.store(true);
    waiter.join();
    if (!result) {
      std::fprintf(stderr, "idem-notifier: --source %s: %s\n", (*source)->name().c_str(), result.error().message.c_str());
      code = 1;
    }
  }
  sqlite3_close(reader);
  std::fprintf(stderr, "idem-notifier: stopped\n");
  return code;
}
