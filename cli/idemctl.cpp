// idemctl: canonicalise JSON and compute request fingerprints the way the gateway does.

#include <CLI/CLI.hpp>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "commands.hpp"

namespace idem::cli {

std::string read_stdin() {
  std::string data;
  char buf[1 << 16];
  for (;;) {
    const std::size_t n = std::fread(buf, 1, sizeof buf, stdin);
    data.append(buf, n);
    if (n < sizeof buf) break;
  }
  if (std::ferror(stdin)) fail(kExitFailure, std::string("cannot read stdin: ") + std::strerror(errno));
  return data;
}

void write_stdout(std::string_view text) {
  if (std::fwrite(text.data(), 1, text.size(), stdout) != text.size() || std::fflush(stdout) != 0) {
    fail(kExitFailure, std::string("cannot write stdout: ") + std::strerror(errno));
  }
}

void fail(int exit_code, std::string_view message) {
  std::fprintf(stderr, "idemctl: %.*s\n", static_cast<int>(message.size()), message.data());
  throw CLI::RuntimeError(exit_code);
}

}  // namespace idem::cli

int main(int argc, char** argv) {
  using namespace idem::cli;
  CLI::App app{"idemctl: tools for idem, the HTTP idempotency toolkit"};
  app.name("idemctl");
  app.require_subcommand(1);
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    return "idemctl: " + std::string(e.what()) + "\nRun with --help for more information.\n";
  });
  app.footer("Exit status: 0 success, 1 failure, 2 usage error or invalid input.");

  register_canonicalize(app);
  register_fingerprint(app);

  try {
    app.parse(argc, argv);
  } catch (const CLI::RuntimeError& e) {  // a command ending itself; it has said why
    return e.get_exit_code();
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);  // prints help, or the usage error
    return code == 0 ? 0 : kExitUsage;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "idemctl: %s\n", e.what());
    return kExitFailure;
  }
  return 0;
}
