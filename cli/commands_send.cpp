// idemctl send: curl for unsafe requests. One key per invocation (a new UUIDv4 unless --key), the
// same key on every retry, the client's backoff, Retry-After and deadline; with --journal the
// operation survives a crash of idemctl itself (idemctl resume sends it again).

#include <CLI/CLI.hpp>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "client_args.hpp"
#include "client_commands.hpp"
#include "commands.hpp"
#include "idem/client/curl_transport.hpp"
#include "idem/client/key.hpp"

namespace idem::cli {
namespace {

bool is_final(client::StopReason stop) {
  return stop == client::StopReason::success || stop == client::StopReason::non_retryable;
}

bool is_token(std::string_view s) {
  if (s.empty()) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
  });
}

bool is_http_url(std::string_view url) {
  const auto lower_prefix = [&](std::string_view prefix) {
    if (url.size() <= prefix.size()) return false;
    for (std::size_t i = 0; i < prefix.size(); ++i) {
      char c = url[i];
      if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
      if (c != prefix[i]) return false;
    }
    return true;
  };
  return lower_prefix("http://") || lower_prefix("https://");
}

}  // namespace

int send_exit_code(const client::SendResult& result) {
  if (result.ok()) return kExitOk;
  if (result.stop == client::StopReason::invalid_request) return kExitUsage;
  return kExitFailure;
}

std::string summary_line(const client::SendResult& r) {
  std::string line = "key=" + (r.key.empty() ? std::string("none") : r.key);
  line += " attempts=" + std::to_string(r.attempts);
  line += std::string(" replayed=") + (r.replayed ? "true" : "false");
  line += " status=" + (r.response ? std::to_string(r.response->status) : std::string("none"));
  line += " stop=" + std::string(client::to_string(r.stop));
  if (r.error) line += " error=" + json_quoted(std::string(client::to_string(r.error->code)) + ": " + r.error->message);
  if (!r.detail.empty()) line += " detail=" + json_quoted(r.detail);
  return line;
}

nlohmann::json result_json(const client::SendResult& r) {
  nlohmann::json j;
  j["key"] = r.key;
  j["attempts"] = r.attempts;
  j["replayed"] = r.replayed;
  j["stop"] = client::to_string(r.stop);
  if (r.response) {
    j["status"] = r.response->status;
    j["headers"] = headers_json(r.response->headers);
    j["body_size"] = r.response->body.size();
    j["body_base64"] = base64(r.response->body);
  } else {
    j["status"] = nullptr;
  }
  j["error"] = r.error ? nlohmann::json{{"code", client::to_string(r.error->code)}, {"message", r.error->message}}
                       : nlohmann::json(nullptr);
  if (!r.detail.empty()) j["detail"] = r.detail;
  if (!r.journal_error.empty()) j["journal_error"] = r.journal_error;
  return j;
}

int report_send(const client::SendResult& r, const std::string& journal_path, const Output& o) {
  if (o.json) {
    write_json(o.out, result_json(r));
  } else if (r.response && !r.error) {
    o.out.write(r.response->body.data(), static_cast<std::streamsize>(r.response->body.size()));
  }
  o.out.flush();
  error(o, kExitOk, summary_line(r));
  if (!r.journal_error.empty()) error(o, kExitOk, "journal: " + r.journal_error);
  const bool kept = !is_final(r.stop) && r.stop != client::StopReason::invalid_request &&
                    r.stop != client::StopReason::journal_failed;
  if (r.stop == client::StopReason::outcome_unknown) {
    error(o, kExitOk,
          "the server cannot tell whether the first attempt took effect; an operator decides "
          "(idemctl get/release/resolve on the server's store)");
  }
  if (kept && !journal_path.empty()) {
    error(o, kExitOk, "kept in the dead letters; to send it again with the same key: idemctl dead-letters --journal " +
                          shell_quote(journal_path) + " retry " + shell_quote(r.key));
  } else if (kept) {
    error(o, kExitOk, "no final answer; to try again safely, send the same request with --key " + shell_quote(r.key));
  }
  return send_exit_code(r);
}

int run_send(client::Client& client, client::HttpRequest request, std::optional<std::string> key,
             const std::string& journal_path, const Output& o) {
  return report_send(client.send(std::move(request), std::move(key)), journal_path, o);
}

// ---- options shared by every command that sends ----------------------------------------------

namespace {

const CLI::Validator kDurationCheck(
    [](std::string& text) {
      const auto d = parse_duration(text);
      if (!d) return "'" + text + "' is not a duration like 500ms, 30s, 5m, 1h30m";
      if (*d <= Millis{0}) return "'" + text + "' must be positive";
      return std::string();
    },
    "", "duration");

}  // namespace

void add_client_options(CLI::App* cmd, const std::shared_ptr<ClientArgs>& args) {
  const client::RetryOptions defaults;
  cmd->add_option("--attempts", args->attempts,
                  "attempts at most, the first included (default " + std::to_string(defaults.max_attempts) + ")")
      ->check(CLI::Range(1, 100))
      ->group("Retries");
  cmd->add_option("--timeout", args->timeout, "bound on each attempt, connect to last byte (default 30s)")
      ->check(kDurationCheck)
      ->type_name("DUR")
      ->group("Retries");
  cmd->add_option("--deadline", args->deadline, "bound on all attempts and waits together (default 5m)")
      ->check(kDurationCheck)
      ->type_name("DUR")
      ->group("Retries");
  cmd->add_option("--retry-delay", args->retry_delay,
                  "backoff before the first retry, doubling each time up to 30s, with full jitter; "
                  "a Retry-After from the server wins (default 1s)")
      ->check(kDurationCheck)
      ->type_name("DUR")
      ->group("Retries");
  cmd->add_option("--key-header", args->key_header, "the header carrying the key (default Idempotency-Key)")
      ->group("Retries");
  cmd->add_flag("-k,--insecure", args->insecure, "do not verify the server's TLS certificate (test servers only)")
      ->group("Transport");
  cmd->add_option("--cacert", args->cacert, "verify TLS against this CA bundle instead of the system's")
      ->check(CLI::ExistingFile)
      ->group("Transport");
}

client::ClientOptions client_options(const ClientArgs& args) {
  client::ClientOptions options;
  options.retry.max_attempts = args.attempts;
  options.retry.attempt_timeout = *parse_duration(args.timeout);
  options.retry.deadline = *parse_duration(args.deadline);
  options.retry.base_delay = *parse_duration(args.retry_delay);
  options.retry.max_delay = std::max(options.retry.max_delay, options.retry.base_delay);
  options.key_header = args.key_header;
  return options;
}

std::shared_ptr<client::Journal> open_journal_or_fail(const std::string& path, JournalUse use) {
  std::error_code ec;
  if (use == JournalUse::must_exist && !std::filesystem::exists(path, ec)) {
    fail(kExitFailure, "cannot open journal " + path + ": it does not exist (nothing was ever sent with it; " +
                           "give the path `idemctl send --journal` or the client used)");
  }
  auto journal = client::Journal::open(path);
  if (!journal) fail(kExitFailure, "cannot open journal " + path + ": " + journal.error().message);
  return std::shared_ptr<client::Journal>(std::move(*journal));
}

std::unique_ptr<client::Client> make_client(const ClientArgs& args, const std::string& journal_path, JournalUse use) {
  client::CurlOptions curl;
  curl.verify_tls = !args.insecure;
  curl.ca_file = args.cacert;
  curl.user_agent = "idemctl/0.1";
  std::shared_ptr<client::Journal> journal;
  if (!journal_path.empty()) journal = open_journal_or_fail(journal_path, use);
  return std::make_unique<client::Client>(client_options(args), std::make_shared<client::CurlTransport>(curl),
                                          std::move(journal));
}

// ---- idemctl send ----------------------------------------------------------------------------

namespace {

// What an interrupted send (Ctrl-C during a backoff, a kill) prints: the key to reuse. Formatted
// before sending; the handler only write(2)s it.
char g_interrupt_message[1024];
std::size_t g_interrupt_length = 0;

extern "C" void on_interrupt(int sig) {
  [[maybe_unused]] const auto written = ::write(STDERR_FILENO, g_interrupt_message, g_interrupt_length);
  ::_exit(128 + sig);
}

void say_key_on_interrupt(const std::string& key, const std::string& journal_path) {
  const std::string message =
      journal_path.empty()
          ? "\nidemctl: interrupted; the request may have taken effect. To try again safely, send the same "
            "request with --key " + shell_quote(key) + "\n"
          : "\nidemctl: interrupted; key " + key + " stays pending: idemctl resume --journal " +
                shell_quote(journal_path) + "\n";
  g_interrupt_length = std::min(message.size(), sizeof g_interrupt_message);
  std::memcpy(g_interrupt_message, message.data(), g_interrupt_length);
  for (const int sig : {SIGINT, SIGTERM, SIGHUP}) {
    struct sigaction old {};
    ::sigaction(sig, nullptr, &old);
    if (old.sa_handler == SIG_IGN) continue;  // nohup, or a background job: leave it ignored
    struct sigaction action {};
    action.sa_handler = on_interrupt;
    sigemptyset(&action.sa_mask);
    ::sigaction(sig, &action, nullptr);
  }
}

}  // namespace

void register_send(CLI::App& app) {
  struct Args {
    std::string method = "POST";
    std::string url;
    std::string data;
    bool has_data = false;
    std::vector<std::string> headers;
    std::string key;
    std::string journal;
    bool json = false;
  };
  auto args = std::make_shared<Args>();
  auto client_args = std::make_shared<ClientArgs>();

  CLI::App* cmd = app.add_subcommand(
      "send", "Send one unsafe request with an idempotency key, retrying safely (like curl, for POST)");
  cmd->group("Client");
  cmd->add_option("-X,--request", args->method, "the HTTP method (default POST)");
  cmd->add_option("url", args->url, "http:// or https:// URL")->required();
  cmd->add_option("-d,--data", args->data, "the body: DATA, @FILE, or @- for stdin (sent as is)")
      ->each([args](const std::string&) { args->has_data = true; });
  cmd->add_option("-H,--header", args->headers, "a request header, 'Name: value' (repeatable)")
      ->type_name("'NAME: VALUE'")
      ->allow_extra_args(false)
      ->check(CLI::Validator(
          [](std::string& line) {
            return parse_header_line(line) ? std::string() : "'" + line + "' is not 'Name: value'";
          },
          "", "header"));
  cmd->add_option("--key", args->key,
                  "the idempotency key (16-256 visible ASCII characters); default: a new random UUIDv4");
  cmd->add_option("--journal", args->journal,
                  "journal file (SQLite): the operation is on disk before the first attempt and until a "
                  "final answer; exhausted ones become dead letters")
      ->envname("IDEM_JOURNAL");
  cmd->add_flag("--json", args->json, "print a JSON summary (key, attempts, status, headers, body_base64) on stdout");
  add_client_options(cmd, client_args);
  cmd->footer(
      "Prints the last answer's body on stdout and one line on stderr:\n"
      "  idemctl: key=... attempts=2 replayed=true status=201 stop=success\n"
      "Retried: connection errors and lost answers, 408, 409 idempotency_key_in_use, 429, 500, 502,\n"
      "503, 504. Never retried: 400, 422 and other 4xx (the request must change: a new key).\n"
      "Exit status: 0 for a 2xx, 1 for any other final answer or when retries ran out, 2 for usage\n"
      "errors (including an invalid --key).");
  cmd->callback([args, client_args] {
    if (!is_token(args->method)) fail(kExitUsage, "-X: '" + args->method + "' is not an HTTP method");
    if (!is_http_url(args->url)) fail(kExitUsage, "the URL must start with http:// or https://: " + args->url);
    client::HttpRequest request;
    request.method = args->method;
    request.url = args->url;
    for (const std::string& line : args->headers) request.headers.push_back(*parse_header_line(line));
    if (args->has_data) {
      std::string why;
      auto body = read_data_argument(args->data, why);
      if (!body) fail(kExitUsage, "-d: " + why);
      request.body = std::move(*body);
    }
    std::optional<std::string> key;
    if (!args->key.empty()) key = args->key;
    std::string known_key = args->key;
    for (const Header& h : request.headers) {
      if (client::header_name_equals(h.name, client_args->key_header)) known_key = h.value;
    }
    if (known_key.empty()) {  // made here rather than in the client, so an interrupt can name it
      auto fresh = client::new_key();
      if (!fresh) fail(kExitFailure, "cannot make a key: " + fresh.error());
      key = known_key = *fresh;
    }
    say_key_on_interrupt(known_key, args->journal);
    auto client = make_client(*client_args, args->journal, JournalUse::may_create);
    finish(run_send(*client, std::move(request), std::move(key), args->journal, Output{std::cout, std::cerr, args->json}));
  });
}

}  // namespace idem::cli
