// idemctl: one CLI for users and operators of idem. Send requests with safe retries (send, and the
// client journal: pending, dead-letters, resume), operate a store (get, list, purge, release,
// resolve, stats, and reconcile: keys with an unknown outcome, asked about), operate an outbox (outbox list,
// show, retry, drop, stats), the keys a consumer holds behind a dead letter (holds), manage the keys that
// encrypt stored responses (keys add, list, usage), and check fingerprints (canonicalize,
// fingerprint). One file per command group.

#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>
#include <string>

#include "commands.hpp"
#include "idem/redact.hpp"

int main(int argc, char** argv) {
  using namespace idem::cli;
  CLI::App app{"idemctl: tools for idem, the HTTP idempotency toolkit"};
  app.name("idemctl");
  app.require_subcommand(1);
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    // A usage error may quote an argument, and an argument may be a URL with a password.
    return "idemctl: " + idem::redact_text(e.what()) + "\nRun with --help for more information.\n";
  });
  app.footer("Exit status: 0 success, 1 failure (or a non-2xx answer, or not found), 2 usage error or\ninvalid input.");

  register_send(app);
  register_journal(app);
  register_store(app);
  register_reconcile(app);
  register_outbox(app);
  register_holds(app);
  register_keys(app);
  register_canonicalize(app);
  register_fingerprint(app);
  for (const char* name : {"canonicalize", "fingerprint"}) app.get_subcommand(name)->group("Fingerprints");

  try {
    app.parse(argc, argv);
  } catch (const CLI::RuntimeError& e) {  // a command ending itself; it has said why
    return e.get_exit_code();
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);  // prints help, or the usage error
    return code == 0 ? 0 : kExitUsage;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "idemctl: %s\n", idem::redact_text(e.what()).c_str());
    return kExitFailure;
  }
  return 0;
}
