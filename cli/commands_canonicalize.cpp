// idemctl canonicalize: the RFC 8785 form of the JSON on stdin, as fingerprints hash it.

#include <CLI/CLI.hpp>

#include <memory>
#include <string>
#include <vector>

#include "commands.hpp"
#include "idem/jcs.hpp"

namespace idem::cli {

void register_canonicalize(CLI::App& app) {
  struct Args {
    std::vector<std::string> json_ignore;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "canonicalize", "Print the RFC 8785 (JCS) form of the JSON on stdin, then a newline");
  cmd->add_option("--json-ignore", args->json_ignore,
                  "RFC 6901 JSON Pointer to leave out, e.g. /client_ts (repeatable)")
      ->type_name("POINTER")
      ->allow_extra_args(false);
  cmd->footer(
      "Invalid JSON (RFC 8259, plus RFC 8785's rules: no duplicate names, no lone surrogates,\n"
      "finite numbers only) exits with status 2 and one line on stderr saying where.");
  cmd->callback([args] {
    const std::string input = read_stdin();
    auto canonical = canonicalize_json(input, args->json_ignore);
    if (!canonical) {
      fail(kExitUsage, "invalid JSON at byte " + std::to_string(canonical.error().offset) + ": " +
                           canonical.error().message);
    }
    canonical->push_back('\n');
    write_stdout(*canonical);
  });
}

}  // namespace idem::cli
