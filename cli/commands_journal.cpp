// idemctl pending, dead-letters, resume: the client journal (an SQLite file written by `idemctl
// send --journal` or any idem::client::Client). What was sent and never answered, what the client
// gave up on, and sending it again with the original keys after a crash.

#include <CLI/CLI.hpp>

#include <iostream>
#include <memory>
#include <string>
#include <utility>

#include "client_args.hpp"
#include "client_commands.hpp"
#include "commands.hpp"

namespace idem::cli {
namespace {

int journal_error(const Output& o, const client::JournalError& e) {
  return error(o, kExitFailure, "journal: " + e.message);
}

nlohmann::json request_json(const client::HttpRequest& r) {
  return {{"method", r.method},
          {"url", r.url},
          {"headers", headers_json(r.headers)},
          {"body_size", r.body.size()},
          {"body_base64", base64(r.body)}};
}

std::string request_text(const client::HttpRequest& r) {
  return r.method + " " + r.url + " (" + std::to_string(r.body.size()) + " bytes)";
}

// The answer to dropping the journal entry `key`, a `what` ("pending operation", "dead letter").
int report_dropped(const client::JournalResult<void>& dropped, const std::string& key, std::string_view what,
                   std::string_view note, const Output& o) {
  if (!dropped) {
    if (dropped.error().code == client::JournalErrc::not_found) {
      return error(o, kExitFailure, "no " + std::string(what) + " with key " + json_quoted(key));
    }
    return journal_error(o, dropped.error());
  }
  if (o.json) {
    write_json(o.out, {{"dropped", key}});
  } else {
    o.out << "dropped " << what << ' ' << key << note << '\n';
  }
  return kExitOk;
}

}  // namespace

int run_pending(client::Journal& journal, const Output& o) {
  auto ops = journal.pending();
  if (!ops) return journal_error(o, ops.error());
  if (o.json) {
    nlohmann::json list = nlohmann::json::array();
    for (const client::Operation& op : *ops) {
      list.push_back({{"key", op.key},
                      {"attempts", op.attempts},
                      {"created", format_time(op.created)},
                      {"request", request_json(op.request)}});
    }
    write_json(o.out, {{"pending", std::move(list)}});
    return kExitOk;
  }
  if (ops->empty()) {
    o.out << "no pending operations\n";
    return kExitOk;
  }
  o.out << pad("KEY", 38) << pad("ATTEMPTS", 10) << pad("CREATED", 26) << "REQUEST\n";
  for (const client::Operation& op : *ops) {
    o.out << pad(op.key, 37) << ' ' << pad(std::to_string(op.attempts), 10) << pad(format_time(op.created), 26)
          << request_text(op.request) << '\n';
  }
  return kExitOk;
}

int run_drop_pending(client::Journal& journal, const std::string& key, const Output& o) {
  return report_dropped(journal.drop_pending(key), key, "pending operation", " (not sent again)", o);
}

int run_dead_letters(client::Journal& journal, const Output& o) {
  auto letters = journal.dead_letters();
  if (!letters) return journal_error(o, letters.error());
  if (o.json) {
    nlohmann::json list = nlohmann::json::array();
    for (const client::DeadLetter& d : *letters) {
      nlohmann::json j{{"key", d.operation.key},
                       {"attempts", d.operation.attempts},
                       {"created", format_time(d.operation.created)},
                       {"failed", format_time(d.failed)},
                       {"reason", d.reason},
                       {"request", request_json(d.operation.request)}};
      if (d.last_response) {
        j["last_response"] = {{"status", d.last_response->status},
                              {"headers", headers_json(d.last_response->headers)},
                              {"body_size", d.last_response->body.size()},
                              {"body_base64", base64(d.last_response->body)}};
      } else {
        j["last_response"] = nullptr;
      }
      j["last_error"] = d.last_error.empty() ? nlohmann::json(nullptr) : nlohmann::json(d.last_error);
      list.push_back(std::move(j));
    }
    write_json(o.out, {{"dead_letters", std::move(list)}});
    return kExitOk;
  }
  if (letters->empty()) {
    o.out << "no dead letters\n";
    return kExitOk;
  }
  o.out << pad("KEY", 38) << pad("FAILED", 26) << pad("REASON", 20) << pad("ATTEMPTS", 10) << pad("LAST", 10)
        << "REQUEST\n";
  for (const client::DeadLetter& d : *letters) {
    const std::string last = d.last_response && d.last_error.empty() ? std::to_string(d.last_response->status)
                                                                       : std::string("no answer");
    o.out << pad(d.operation.key, 37) << ' ' << pad(format_time(d.failed), 26) << pad(d.reason, 20)
          << pad(std::to_string(d.operation.attempts), 10) << pad(last, 10) << request_text(d.operation.request)
          << '\n';
    if (!d.last_error.empty()) o.out << "    last error: " << d.last_error << '\n';
  }
  return kExitOk;
}

int run_retry_dead_letter(client::Client& client, const std::string& key, const std::string& journal_path,
                          const Output& o) {
  auto result = client.retry_dead_letter(key);
  if (!result) {
    if (result.error().code == client::JournalErrc::not_found) {
      return error(o, kExitFailure, "no dead letter with key " + json_quoted(key));
    }
    return journal_error(o, result.error());
  }
  return report_send(*result, journal_path, o);
}

int run_drop_dead_letter(client::Journal& journal, const std::string& key, const Output& o) {
  return report_dropped(journal.drop_dead_letter(key), key, "dead letter", "", o);
}

int run_resume(client::Client& client, const std::string& journal_path, const Output& o) {
  auto results = client.resume();
  if (!results) return journal_error(o, results.error());
  int succeeded = 0;
  nlohmann::json list = nlohmann::json::array();
  for (const client::SendResult& r : *results) {
    if (r.ok()) ++succeeded;
    error(o, kExitOk, summary_line(r));
    if (!r.journal_error.empty()) error(o, kExitOk, "journal: " + r.journal_error);
    if (o.json) list.push_back(result_json(r));
  }
  const int total = static_cast<int>(results->size());
  if (o.json) {
    write_json(o.out, {{"resumed", total}, {"succeeded", succeeded}, {"results", std::move(list)}});
  } else {
    o.out << "resumed " << total << " pending operation" << (total == 1 ? "" : "s") << ": " << succeeded
          << " succeeded";
    if (succeeded < total) {
      o.out << ", " << (total - succeeded) << " did not (see: idemctl dead-letters --journal "
            << shell_quote(journal_path) << ")";
    }
    o.out << '\n';
  }
  return succeeded == total ? kExitOk : kExitFailure;
}

// ---- the command line ------------------------------------------------------------------------

void register_journal(CLI::App& app) {
  struct Args {
    std::string journal;
    bool json = false;
    std::string action = "list";
    std::string key;
  };
  auto args = std::make_shared<Args>();
  auto client_args = std::make_shared<ClientArgs>();
  const auto output = [args] { return Output{std::cout, std::cerr, args->json}; };
  const auto add_common = [args](CLI::App* cmd) {
    cmd->add_option("--journal", args->journal, "the journal file (default: $IDEM_JOURNAL)")
        ->envname("IDEM_JOURNAL")
        ->required();
    cmd->add_flag("--json", args->json, "print JSON (one line) instead of text");
    cmd->group("Client");
  };
  // ACTION [KEY]: KEY is required by every action but list.
  const auto check_key = [args] {
    if (args->action == "list" && !args->key.empty()) fail(kExitUsage, "list takes no KEY");
    if (args->action != "list" && args->key.empty()) fail(kExitUsage, args->action + " needs a KEY");
  };

  CLI::App* pending = app.add_subcommand("pending", "List (or drop) operations sent without a final answer yet");
  add_common(pending);
  pending->add_option("action", args->action, "list (default), or drop KEY: forget it without sending")
      ->check(CLI::IsMember({"list", "drop"}));
  pending->add_option("key", args->key, "the operation's key");
  pending->callback([args, output, check_key] {
    check_key();
    auto journal = open_journal_or_fail(args->journal, JournalUse::must_exist);
    finish(args->action == "drop" ? run_drop_pending(*journal, args->key, output()) : run_pending(*journal, output()));
  });

  CLI::App* dead = app.add_subcommand("dead-letters", "List, retry or drop operations the client gave up on");
  add_common(dead);
  dead->add_option("action", args->action,
                   "list (default); retry KEY: send again with its original key; drop KEY: delete it")
      ->check(CLI::IsMember({"list", "retry", "drop"}));
  dead->add_option("key", args->key, "the operation's key");
  add_client_options(dead, client_args);
  dead->callback([args, client_args, output, check_key] {
    check_key();
    if (args->action == "retry") {
      auto client = make_client(*client_args, args->journal, JournalUse::must_exist);
      finish(run_retry_dead_letter(*client, args->key, args->journal, output()));
      return;
    }
    auto journal = open_journal_or_fail(args->journal, JournalUse::must_exist);
    finish(args->action == "drop" ? run_drop_dead_letter(*journal, args->key, output())
                                  : run_dead_letters(*journal, output()));
  });

  CLI::App* resume = app.add_subcommand(
      "resume", "After a crash: send every pending operation again, each with its original key");
  add_common(resume);
  add_client_options(resume, client_args);
  resume->footer(
      "Operations journaled more than 12 h ago are not sent (the server may have forgotten their\n"
      "keys): they become dead letters with reason 'expired'. Exit 0 when every one got a 2xx.");
  resume->callback([args, client_args, output] {
    auto client = make_client(*client_args, args->journal, JournalUse::must_exist);
    finish(run_resume(*client, args->journal, output()));
  });
}

}  // namespace idem::cli
