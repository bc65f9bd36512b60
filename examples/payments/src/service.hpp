#pragma once

#include <chrono>
#include <memory>
#include <string>

namespace idem::payments {

/// How the payments service runs; set from the command line.
struct ServiceOptions {
  std::string host = "127.0.0.1";
  unsigned short port = 8081;
  /// The SQLite file holding the ledger (and, in-process, the idempotency records too).
  std::string db_path = "./var/payments.db";
  /// true: libidem in-process, ledger writes and key completion in one transaction (SPEC §4.4);
  /// false: a plain service meant to sit behind idem-gateway.
  bool inprocess = false;
  /// Enqueue each succeeded payment's payment.succeeded event, and each refund's
  /// payment.refunded, in the outbox (idem_outbox in the ledger's file, docs/outbox.md), in the
  /// ledger write's transaction, the payment id as ordering key; idem-relay publishes them.
  bool outbox = true;
  /// In-process mode: how long a request may hold its key before a retry may take it over.
  std::chrono::milliseconds lease{60'000};
  /// For tests of the attempt fence (tests/payments/fence_test.py): a write carrying
  /// Idempotency-Attempt `hold_attempt` waits `hold` before it runs, as a slow first call would.
  /// 0: none.
  unsigned hold_attempt = 0;
  std::chrono::milliseconds hold{0};
};

/// The HTTP service: one event loop, a coroutine per connection, the ledger over SQLite.
class Service {
 public:
  /// Opens the database(s) and binds the listener; throws std::runtime_error on failure.
  explicit Service(const ServiceOptions& options);
  ~Service();
  /// Serves until SIGINT or SIGTERM.
  void run();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace idem::payments
