// idem-ledger-consumer: an example message consumer (docs/consumers.md). It posts each message
// to an SQLite ledger exactly once: the posting and the "processed" record commit in one
// transaction (idem::process_once_in_transaction). Messages come from a real broker, or from
// stdin as a queue would deliver them (some twice, some concurrently to several consumers).
//
//   idem-ledger-consumer --db PATH --source URL [--workers N] [--name NAME] [--lease-ms N] ...
//   idem-ledger-consumer --db PATH [--name NAME] [--lease-ms N] [--frozen ACCOUNT]... [--work-delay-ms N]
//
// With --source (amqp://...?queue=Q, redis+stream://HOST:PORT/STREAM?group=G,
// kafka://HOSTS/TOPIC?group=G or sqs+https://HOST/ACCOUNT/QUEUE), a message's id is its message_id
// and its body {"account": "acct_1", "amount": 250}; each receive's messages are posted in one
// transaction with a savepoint each (idem::process_batch_in_transaction: one that fails rolls back
// alone), and the consume loop acks a message once its posting committed, retries a failed one
// and dead-letters what can never be posted (no id, an
// unreadable body, a frozen account after the attempts limit). It prints "ID OUTCOME" for each,
// and runs until SIGTERM or SIGINT (then exits 0, in-flight postings finished).
//
// From stdin:
// A message: {"id": "m-1", "account": "acct_1", "amount": 250}. For each line it prints one line
// on stdout, "ID STATUS", flushed at once: what a real consumer would ack or not. STATUS, the last
// word, is processed, duplicate, in_progress, handler_failed, lost, conflict, outcome_unknown,
// invalid_id, rejected or store_error; ID is "-" when the line has no printable id. A line that
// is not such a message is rejected (nothing changes) and the consumer goes on.
//
// Exit codes: 0 at the end of the input (or after SIGTERM), 1 when the ledger or the source cannot
// be opened, 2 for a bad flag.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <sqlite3.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <csignal>

#include "idem/consume_loop.hpp"
#include "idem/open_broker.hpp"
#include "idem/redact.hpp"
#include "idem/sqlite_consumer.hpp"
#include "idem/sqlite_store.hpp"

namespace {

struct Message {
  std::string id;
  std::string account;
  long long amount = 0;
};

// Parses one message: its id from the line's "id" (stdin), or given (a broker's message_id); on
// failure says why in `error`.
bool parse(const std::string& line, Message& m, std::string& error, const std::string* given_id = nullptr) {
  const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) {
    error = "not a JSON object";
    return false;
  }
  const auto id = j.find("id");
  const auto account = j.find("account");
  const auto amount = j.find("amount");
  if (given_id) {
    m.id = *given_id;
  } else if (id == j.end() || !id->is_string()) {
    error = "no string \"id\"";
    return false;
  } else {
    m.id = id->get<std::string>();
  }
  if (account == j.end() || !account->is_string() || account->get<std::string>().empty()) {
    error = "no string \"account\"";
    return false;
  }
  if (amount == j.end() || !amount->is_number_integer()) {
    error = "no integer \"amount\"";
    return false;
  }
  m.account = account->get<std::string>();
  m.amount = amount->get<long long>();
  return true;
}

// The id as printed: "-" unless it is printable ASCII, so that each message stays one line.
std::string printable(const std::string& id) {
  const bool ok = !id.empty() && std::all_of(id.begin(), id.end(), [](char c) { return c >= 0x20 && c <= 0x7e; });
  return ok ? id : "-";
}

bool exec(sqlite3* db, const char* sql, std::string& error) {
  char* message = nullptr;
  if (sqlite3_exec(db, sql, nullptr, nullptr, &message) == SQLITE_OK) return true;
  error = message ? message : sqlite3_errmsg(db);
  sqlite3_free(message);
  return false;
}

// The ledger's tables, beside the store's in the same file.
bool create_ledger(const std::string& path, std::string& error) {
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE, nullptr) != SQLITE_OK) {
    error = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return false;
  }
  sqlite3_busy_timeout(db, 5000);
  const bool ok = exec(db,
                       "CREATE TABLE IF NOT EXISTS postings (message_id TEXT NOT NULL, account TEXT NOT NULL, "
                       "amount INTEGER NOT NULL);"
                       "CREATE TABLE IF NOT EXISTS balances (account TEXT PRIMARY KEY, balance INTEGER NOT NULL);",
                       error);
  sqlite3_close(db);
  return ok;
}

// The effect: a posting and the account's new balance, on the store's connection and transaction.
bool post(sqlite3* db, const Message& m, std::string& error) {
  sqlite3_stmt* stmt = nullptr;
  const char* sql =
      "INSERT INTO postings (message_id, account, amount) VALUES (?1, ?2, ?3);";
  bool ok = sqlite3_prepare_v2(db, sql, -1, &stmt, nullptr) == SQLITE_OK;
  if (ok) {
    sqlite3_bind_text(stmt, 1, m.id.c_str(), -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(stmt, 2, m.account.c_str(), -1, SQLITE_TRANSIENT);
    sqlite3_bind_int64(stmt, 3, m.amount);
    ok = sqlite3_step(stmt) == SQLITE_DONE;
  }
  sqlite3_finalize(stmt);
  stmt = nullptr;
  if (ok) {
    ok = sqlite3_prepare_v2(db,
                            "INSERT INTO balances (account, balance) VALUES (?1, ?2) "
                            "ON CONFLICT (account) DO UPDATE SET balance = balance + excluded.balance",
                            -1, &stmt, nullptr) == SQLITE_OK;
    if (ok) {
      sqlite3_bind_text(stmt, 1, m.account.c_str(), -1, SQLITE_TRANSIENT);
      sqlite3_bind_int64(stmt, 2, m.amount);
      ok = sqlite3_step(stmt) == SQLITE_DONE;
    }
    sqlite3_finalize(stmt);
  }
  if (!ok) error = sqlite3_errmsg(db);
  return ok;
}

// SIGTERM and SIGINT: taken by a thread of their own (sigtimedwait) in broker mode, blocked in
// every other thread, which is why main blocks them before any thread starts.
sigset_t stop_signal_set() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  return set;
}

// Consumes a broker until SIGTERM/SIGINT: the consume loop receives, `post_batch` runs each
// receive's messages through process_batch_in_transaction (one transaction, a savepoint each),
// and the loop acks, retries or dead-letters each by its outcome.
template <class PostBatch>
int consume_broker(const std::string& url, std::size_t workers, std::size_t prefetch, PostBatch& post_batch) {
  const sigset_t stop_signals = stop_signal_set();

  idem::SourceSettings settings;
  settings.prefetch = prefetch;
  auto source = idem::open_source(url, settings);
  if (!source) {
    std::fprintf(stderr, "idem-ledger-consumer: --source %s: %s\n", idem::redact_url(url).c_str(),
                 source.error().message.c_str());
    return 1;
  }
  std::mutex out;
  idem::ConsumeLoopOptions options;
  options.workers = workers;
  options.max_in_flight = prefetch;
  options.on_outcome = [&out](const idem::Delivery& d, std::string_view outcome, std::string_view detail) {
    const std::lock_guard lock(out);
    std::printf("%s %.*s\n", printable(d.message_id).c_str(), static_cast<int>(outcome.size()), outcome.data());
    std::fflush(stdout);
    if (outcome.starts_with("dead_letter") && !detail.empty()) {
      std::fprintf(stderr, "idem-ledger-consumer: %s: %.*s\n", printable(d.message_id).c_str(),
                   static_cast<int>(detail.size()), detail.data());
    }
  };
  options.on_warning = [](std::string_view line) {
    std::fprintf(stderr, "idem-ledger-consumer: %.*s\n", static_cast<int>(line.size()), line.data());
  };
  idem::ConsumeLoop loop(**source, [&](const std::vector<idem::BatchItem>& items) {
    std::vector<idem::MessageDisposition> dispositions(items.size());
    std::vector<Message> postings;
    std::vector<std::size_t> posted;  // which item each posting is
    for (std::size_t i = 0; i < items.size(); ++i) {
      Message m;
      std::string error;
      if (!parse(items[i].delivery.body, m, error, &items[i].delivery.message_id)) {
        dispositions[i] = idem::MessageDisposition::dead_letter_it("rejected", "not a ledger posting: " + error);
        continue;
      }
      postings.push_back(std::move(m));
      posted.push_back(i);
    }
    if (!postings.empty()) {
      auto outcomes = idem::dispositions_of(post_batch(postings));
      for (std::size_t j = 0; j < posted.size(); ++j) dispositions[posted[j]] = std::move(outcomes[j]);
    }
    return dispositions;
  }, options);
  std::atomic<bool> done{false};
  std::thread waiter([&] {
    // A timed wait, so that this thread also ends when run() does by itself (a refusing broker).
    const timespec tick{0, 200'000'000};
    while (!done.load()) {
      if (sigtimedwait(&stop_signals, nullptr, &tick) > 0) {
        loop.stop();
        return;
      }
    }
  });
  auto result = loop.run();
  done.store(true);
  waiter.join();
  if (!result) {
    std::fprintf(stderr, "idem-ledger-consumer: --source %s: %s\n", idem::redact_url(url).c_str(),
                 result.error().message.c_str());
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // SIGTERM and SIGINT wait from the first instruction on: one sent while the process is still
  // starting (a supervisor stopping a consumer it has just started) is taken later, in broker
  // mode by the signal thread (a clean stop), in stdin mode by its default action once unblocked.
  const sigset_t stop_signals = stop_signal_set();
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  idem::sqlite_configure_process();  // before SQLite's first use
  CLI::App app{"idem-ledger-consumer: posts messages from stdin to an SQLite ledger exactly once (docs/consumers.md)",
               "idem-ledger-consumer"};
  std::string db_path;
  std::string name = "ledger-postings";
  long lease_ms = 30'000;
  long work_delay_ms = 0;
  std::vector<std::string> frozen;
  app.add_option("--db", db_path, "SQLite file holding the ledger and the consumer's records")->required();
  app.add_option("--name", name, "consumer name (message ids are scoped by it)")->capture_default_str();
  app.add_option("--lease-ms", lease_ms, "how long a delivery holds a message")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--frozen", frozen, "postings to this account fail (handler_failed); repeatable");
  app.add_option("--work-delay-ms", work_delay_ms, "sleep inside each posting's transaction (tests)")
      ->check(CLI::NonNegativeNumber);
  std::string source_url;
  std::size_t workers = 4;
  std::size_t prefetch = 32;
  app.add_option("--source", source_url, "consume a broker (amqp://...?queue=Q, redis+stream://...?group=G, kafka://...?group=G, sqs+https://...) instead of stdin");
  app.add_option("--workers", workers, "postings at once (--source)")->check(CLI::Range(1, 256))->capture_default_str();
  app.add_option("--prefetch", prefetch, "messages held unacknowledged at once (--source)")
      ->check(CLI::Range(1, 65535))->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }

  if (source_url.empty()) pthread_sigmask(SIG_UNBLOCK, &stop_signals, nullptr);  // stdin mode: the default action
  auto store = idem::SqliteStore::open({.path = db_path});
  if (!store) {
    std::fprintf(stderr, "idem-ledger-consumer: --db %s: %s\n", db_path.c_str(), store.error().message.c_str());
    return 1;
  }
  std::string error;
  if (!create_ledger(db_path, error)) {
    std::fprintf(stderr, "idem-ledger-consumer: --db %s: %s\n", db_path.c_str(), error.c_str());
    return 1;
  }
  auto consumer = idem::Consumer::create(**store, {.name = name, .lease = idem::Millis(lease_ms)});
  if (!consumer) {
    std::fprintf(stderr, "idem-ledger-consumer: %s\n", consumer.error().c_str());
    return 2;
  }

  // The posting of one message, in the store's transaction; `frozen` accounts refuse it.
  auto posting = [&](const Message& m) {
    const bool is_frozen = std::find(frozen.begin(), frozen.end(), m.account) != frozen.end();
    // The payload that must match on redelivery: what the message asks for, not its formatting.
    const std::string payload = m.account + "\n" + std::to_string(m.amount);
    return idem::process_once_in_transaction(
        *consumer, **store, m.id, payload, [&](sqlite3* db, std::string& work_error) {
          if (work_delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(work_delay_ms));
          if (is_frozen) {
            work_error = "account " + m.account + " is frozen";
            return false;
          }
          return post(db, m, work_error);
        });
  };
  // A receive's postings in one transaction, a savepoint each: a frozen account's posting rolls
  // back alone and is retried, the others commit together.
  auto post_batch = [&](const std::vector<Message>& postings) {
    std::vector<std::string> payloads;
    payloads.reserve(postings.size());
    for (const Message& m : postings) payloads.push_back(m.account + "\n" + std::to_string(m.amount));
    std::vector<idem::Consumer::Message> messages;
    for (std::size_t i = 0; i < postings.size(); ++i) messages.push_back({postings[i].id, payloads[i]});
    return idem::process_batch_in_transaction(
        *consumer, **store, messages, [&](std::size_t i, sqlite3* db, std::string& work_error) {
          const Message& m = postings[i];
          if (work_delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(work_delay_ms));
          if (std::find(frozen.begin(), frozen.end(), m.account) != frozen.end()) {
            work_error = "account " + m.account + " is frozen";
            return false;
          }
          return post(db, m, work_error);
        });
  };
  if (!source_url.empty()) return consume_broker(source_url, workers, prefetch, post_batch);

  std::string line;
  while (std::getline(std::cin, line)) {
    if (line.empty()) continue;
    Message m;
    if (!parse(line, m, error)) {
      std::printf("%s rejected\n", printable(m.id).c_str());
      std::fprintf(stderr, "idem-ledger-consumer: rejected a message: %s\n", error.c_str());
      std::fflush(stdout);
      continue;
    }
    auto outcome = posting(m);
    if (!outcome) {
      std::printf("%s store_error\n", printable(m.id).c_str());
      std::fprintf(stderr, "idem-ledger-consumer: %s: %s\n", printable(m.id).c_str(), outcome.error().message.c_str());
    } else {
      std::printf("%s %s\n", printable(m.id).c_str(), std::string(idem::to_string(outcome->status)).c_str());
      if (!outcome->ack()) {
        std::fprintf(stderr, "idem-ledger-consumer: %s: %s: %s\n", printable(m.id).c_str(),
                     std::string(idem::to_string(outcome->status)).c_str(), outcome->detail.c_str());
      }
    }
    std::fflush(stdout);
  }
  return 0;
}
