// idem-payments: the example ledger service (docs/payments.md).
//
//   idem-payments [--listen HOST:PORT] [--db PATH] [--idempotency off|inprocess] [--lease-ms N] [--outbox on|off]
//
// Exit codes: 0 after SIGINT/SIGTERM, 1 when start-up fails, 2 for a bad flag.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>
#include <string>

#include "idem/sqlite_store.hpp"
#include "service.hpp"

int main(int argc, char** argv) {
  idem::sqlite_configure_process();  // before SQLite's first use
  CLI::App app{"idem-payments: an example ledger service (see docs/payments.md)", "idem-payments"};
  std::string listen = "127.0.0.1:8081";
  std::string mode = "off";
  long lease_ms = 60'000;
  idem::payments::ServiceOptions options;
  app.add_option("--listen", listen, "HOST:PORT to listen on")->capture_default_str();
  app.add_option("--db", options.db_path, "SQLite ledger file")->capture_default_str();
  app.add_option("--idempotency", mode, "off (behind idem-gateway) or inprocess (libidem)")
      ->check(CLI::IsMember({"off", "inprocess"}))
      ->capture_default_str();
  app.add_option("--lease-ms", lease_ms, "inprocess: key lease in milliseconds")->check(CLI::PositiveNumber);
  std::string outbox = "on";
  app.add_option("--outbox", outbox,
                 "on: each succeeded payment enqueues payment.succeeded, each refund payment.refunded (docs/outbox.md)")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  std::string hold;
  app.add_option("--hold-attempt", hold,
                 "tests: N:MS, a write with Idempotency-Attempt N waits MS ms first (a slow first call)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  const auto colon = listen.rfind(':');
  try {
    if (colon == std::string::npos) throw std::invalid_argument("no port");
    options.host = listen.substr(0, colon);
    if (options.host.size() > 1 && options.host.front() == '[') options.host = options.host.substr(1, options.host.size() - 2);
    const int port = std::stoi(listen.substr(colon + 1));
    if (port < 0 || port > 65535) throw std::out_of_range("port");
    options.port = static_cast<unsigned short>(port);
  } catch (const std::exception&) {
    std::fprintf(stderr, "idem-payments: --listen %s: expected HOST:PORT\n", listen.c_str());
    return 2;
  }
  if (!hold.empty()) {
    const auto sep = hold.find(':');
    try {
      if (sep == std::string::npos) throw std::invalid_argument("no colon");
      std::size_t used = 0;
      const unsigned long n = std::stoul(hold.substr(0, sep), &used);
      if (used != sep || n == 0) throw std::invalid_argument("attempt");
      const std::string ms_text = hold.substr(sep + 1);
      const unsigned long ms = std::stoul(ms_text, &used);
      if (used != ms_text.size()) throw std::invalid_argument("ms");
      options.hold_attempt = static_cast<unsigned>(n);
      options.hold = std::chrono::milliseconds(ms);
    } catch (const std::exception&) {
      std::fprintf(stderr, "idem-payments: --hold-attempt %s: expected N:MS, e.g. 1:3000\n", hold.c_str());
      return 2;
    }
  }
  options.inprocess = mode == "inprocess";
  options.outbox = outbox == "on";
  options.lease = std::chrono::milliseconds(lease_ms);
  try {
    idem::payments::Service service(options);
    service.run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "idem-payments: %s\n", e.what());
    return 1;
  }
  return 0;
}
