// idemctl fingerprint: the request fingerprint the gateway stores with a key, for checking why a
// retry was answered with 422 idempotency_key_mismatch.

#include <CLI/CLI.hpp>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "commands.hpp"
#include "idem/fingerprint.hpp"
#include "idem/http_view.hpp"

namespace idem::cli {
namespace {

struct Args {
  std::string method;
  std::string path;
  std::string query;
  std::string content_type;
  std::vector<std::string> headers;  // "Name: value"
  std::vector<std::string> json_ignore;
  std::vector<std::string> include_headers;
};

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// "Name: value" -> {Name, value}; the name must be an HTTP token.
bool split_header(std::string_view line, std::string_view& name, std::string_view& value) {
  const std::size_t colon = line.find(':');
  if (colon == std::string_view::npos || colon == 0) return false;
  name = line.substr(0, colon);
  for (const char c : name) {
    const bool token = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                       std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
    if (!token) return false;
  }
  value = trim(line.substr(colon + 1));
  return true;
}

void run(const Args& args) {
  if (args.path.find('?') != std::string::npos) {
    fail(kExitUsage, "--path must not contain '?'; pass the query with --query");
  }
  std::vector<HeaderView> headers;
  if (!args.content_type.empty()) headers.push_back({"Content-Type", args.content_type});
  for (const std::string& line : args.headers) {
    HeaderView h;
    split_header(line, h.name, h.value);  // validated when parsed
    if (!args.content_type.empty() && iequals(h.name, "Content-Type")) {
      fail(kExitUsage, "--content-type and --header 'Content-Type: ...' both given");
    }
    headers.push_back(h);
  }
  FingerprintOptions options;
  options.json_ignore = args.json_ignore;
  options.headers = args.include_headers;

  const std::string body = read_stdin();
  std::string_view query = args.query;
  if (query.starts_with('?')) query.remove_prefix(1);
  const RequestView request{args.method, args.path, query, headers, body};
  write_stdout(fingerprint(request, options) + "\n");
}

}  // namespace

void register_fingerprint(CLI::App& app) {
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "fingerprint", "Print the request fingerprint (lowercase hex SHA-256) of a request whose body "
                     "is read from stdin (use </dev/null for none)");
  cmd->add_option("--method", args->method, "HTTP method, as sent (e.g. POST)")->required();
  cmd->add_option("--path", args->path, "request path without the query (e.g. /v1/payments)")
      ->required();
  cmd->add_option("--query", args->query, "query string, with or without the leading '?'");
  cmd->add_option("--content-type", args->content_type,
                  "the request's Content-Type, as if sent as a header");
  const CLI::Validator header_line(
      [](std::string& line) {
        std::string_view name, value;
        return split_header(line, name, value) ? std::string()
                                               : "'" + line + "' is not 'Name: value'";
      },
      "", "header");
  cmd->add_option("--header", args->headers, "a request header, 'Name: value' (repeatable)")
      ->type_name("'NAME: VALUE'")
      ->allow_extra_args(false)
      ->check(header_line);
  cmd->add_option("--json-ignore", args->json_ignore,
                  "RFC 6901 JSON Pointer left out of a JSON body, e.g. /client_ts (repeatable); "
                  "like the route's fingerprint.json_ignore")
      ->type_name("POINTER")
      ->allow_extra_args(false);
  cmd->add_option("--include-header", args->include_headers,
                  "name of a header whose values enter the fingerprint (repeatable); like the "
                  "route's fingerprint.headers")
      ->type_name("NAME")
      ->allow_extra_args(false);
  cmd->footer(
      "Headers: --header describes the request; of those, only the ones named by\n"
      "--include-header count, as with the gateway's fingerprint.headers (none by default).\n"
      "Content-Type (from --content-type or a --header) always picks how the body is read:\n"
      "application/json and */*+json as RFC 8785 JSON (invalid JSON as raw bytes),\n"
      "application/x-www-form-urlencoded decoded and sorted, anything else raw bytes.\n"
      "Give the content type one way, not both.");
  cmd->callback([args] { run(*args); });
}

}  // namespace idem::cli
