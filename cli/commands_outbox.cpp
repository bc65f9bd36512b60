// idemctl outbox list, show, retry, drop, stats: operating a transactional outbox (docs/outbox.md),
// named by URL (--outbox, or $IDEM_OUTBOX). What an operator needs when events stop flowing or a
// row went dead: see what waits and why, publish a dead row again, or give it up.

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <utility>

#include "commands.hpp"
#include "idem/open_store.hpp"
#include "outbox_commands.hpp"

namespace idem::cli {
namespace {

int outbox_error(const Output& o, const StoreError& e) {
  std::string message = "outbox error (" + std::string(to_string(e.code)) + "): " + e.message;
  if (e.in_doubt) message += " (the change may have been applied; check with idemctl outbox show)";
  return error(o, kExitFailure, message);
}

std::string row_name(std::int64_t id) { return "outbox row " + std::to_string(id); }

// "12.3s", "4m05s", "2h07m", "3d04h": an age an operator reads at a glance.
std::string format_age(Millis age) {
  const std::int64_t ms = std::max<std::int64_t>(age.count(), 0);
  char buf[64];
  if (ms < 60'000) {
    std::snprintf(buf, sizeof buf, "%.1fs", static_cast<double>(ms) / 1000.0);
  } else if (ms < 3'600'000) {
    std::snprintf(buf, sizeof buf, "%lldm%02llds", static_cast<long long>(ms / 60'000),
                  static_cast<long long>(ms / 1000 % 60));
  } else if (ms < 86'400'000) {
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", static_cast<long long>(ms / 3'600'000),
                  static_cast<long long>(ms / 60'000 % 60));
  } else {
    std::snprintf(buf, sizeof buf, "%lldd%02lldh", static_cast<long long>(ms / 86'400'000),
                  static_cast<long long>(ms / 3'600'000 % 24));
  }
  return buf;
}

// When a pending row goes next: "now" when due (0 is "at once", what enqueue writes).
std::string due_text(const OutboxRow& row, TimePoint now) {
  if (row.state != OutboxState::pending) return "-";
  if (row.next_attempt <= now) return "now";
  return format_time(row.next_attempt) + " (in " + format_age(row.next_attempt - now) + ")";
}

// Why retry or drop refused: absent, or not dead.
int not_dead(OutboxReader& outbox, std::int64_t id, std::string_view action, const Output& o) {
  auto row = outbox.get(id);
  if (!row) return outbox_error(o, row.error());
  if (!*row) return error(o, kExitFailure, "no " + row_name(id));
  return error(o, kExitFailure,
               row_name(id) + " is " + std::string(to_string((*row)->state)) + ", not dead: only dead rows are " +
                   std::string(action));
}

}  // namespace

nlohmann::json outbox_row_json(const OutboxRow& row, TimePoint now, bool with_body) {
  nlohmann::json j;
  j["id"] = row.id;
  j["message_id"] = row.message.message_id;
  j["state"] = to_string(row.state);
  j["destination"] = row.message.destination;
  j["ordering_key"] = row.message.ordering_key.empty() ? nullptr : nlohmann::json(row.message.ordering_key);
  j["key_seq"] = row.message.ordering_key.empty() ? nullptr : nlohmann::json(row.key_seq);
  j["content_type"] = row.message.content_type;
  nlohmann::json headers = nlohmann::json::object();
  for (const auto& [name, value] : row.message.headers) headers[name] = value;
  j["headers"] = std::move(headers);
  j["body_size"] = row.message.body.size();
  if (with_body) j["body_base64"] = base64(row.message.body);
  j["created"] = format_time(row.created);
  j["attempts"] = row.attempts;
  j["next_attempt"] = row.state == OutboxState::pending ? nlohmann::json(format_time(row.next_attempt)) : nullptr;
  j["due"] = row.state == OutboxState::pending && row.next_attempt <= now;
  j["last_error"] = row.last_error.empty() ? nullptr : nlohmann::json(row.last_error);
  j["sent"] = row.sent ? nlohmann::json(format_time(*row.sent)) : nullptr;
  j["unreadable"] = row.unreadable.empty() ? nullptr : nlohmann::json(row.unreadable);
  return j;
}

int run_outbox_list(OutboxReader& outbox, const OutboxQuery& query, TimePoint now, const Output& o) {
  auto rows = outbox.list(query);
  if (!rows) return outbox_error(o, rows.error());
  const bool more = query.limit > 0 && rows->size() >= query.limit;
  const std::int64_t last = rows->empty() ? query.after_id : rows->back().id;
  if (o.json) {
    nlohmann::json list = nlohmann::json::array();
    for (const OutboxRow& r : *rows) list.push_back(outbox_row_json(r, now, /*with_body=*/false));
    nlohmann::json j{{"rows", std::move(list)}};
    j["next_after"] = more ? nlohmann::json(last) : nullptr;
    write_json(o.out, j);
    return kExitOk;
  }
  if (rows->empty()) {
    o.out << "no rows\n";
    return kExitOk;
  }
  o.out << pad("ID", 10) << pad("STATE", 9) << pad("ATTEMPTS", 10) << pad("CREATED", 26) << "MESSAGE_ID\n";
  for (const OutboxRow& r : *rows) {
    o.out << pad(std::to_string(r.id), 10) << pad(std::string(to_string(r.state)), 9)
          << pad(std::to_string(r.attempts), 10) << pad(format_time(r.created), 26)
          // An id the relay refused may hold anything: quoted, so that it cannot garble the line.
          << (r.unreadable.empty() ? r.message.message_id : json_quoted(r.message.message_id));
    if (!r.message.destination.empty()) o.out << "  -> " << json_quoted(r.message.destination);
    if (!r.message.ordering_key.empty()) o.out << "  key " << r.message.ordering_key << " #" << r.key_seq;
    if (!r.last_error.empty()) o.out << "  (" << json_quoted(r.last_error) << ")";
    o.out << '\n';
  }
  if (more) error(o, kExitOk, "more rows may follow: add --after " + std::to_string(last));
  return kExitOk;
}

int run_outbox_show(OutboxReader& outbox, std::int64_t id, bool body_only, TimePoint now, const Output& o) {
  auto found = outbox.get(id);
  if (!found) return outbox_error(o, found.error());
  if (!*found) return error(o, kExitFailure, "no " + row_name(id));
  const OutboxRow& r = **found;
  if (body_only) {
    o.out.write(r.message.body.data(), static_cast<std::streamsize>(r.message.body.size()));
    return kExitOk;
  }
  if (o.json) {
    write_json(o.out, outbox_row_json(r, now, /*with_body=*/true));
    return kExitOk;
  }
  const auto line = [&](std::string_view name, const std::string& value) {
    o.out << pad(std::string(name), 14) << value << '\n';
  };
  line("id", std::to_string(r.id));
  line("message_id", r.unreadable.empty() ? r.message.message_id : json_quoted(r.message.message_id));
  if (!r.unreadable.empty()) line("unreadable", r.unreadable);
  line("state", std::string(to_string(r.state)));
  line("destination", r.message.destination.empty() ? "(the sink's default)" : r.message.destination);
  if (!r.message.ordering_key.empty()) {
    line("ordering_key", r.message.ordering_key + " (row " + std::to_string(r.key_seq) + " of the key, in commit order)");
  }
  line("content_type", r.message.content_type);
  for (const auto& [name, value] : r.message.headers) line("header", name + ": " + value);
  line("body", std::to_string(r.message.body.size()) + " bytes (--body prints them)");
  line("created", format_time(r.created));
  line("attempts", std::to_string(r.attempts));
  if (r.state == OutboxState::pending) line("next_attempt", due_text(r, now));
  if (!r.last_error.empty()) line("last_error", r.last_error);
  if (r.sent) line("sent", format_time(*r.sent));
  return kExitOk;
}

int run_outbox_retry(OutboxReader& outbox, std::int64_t id, TimePoint now, const Output& o) {
  auto retried = outbox.retry_dead(id, now);
  if (!retried) return outbox_error(o, retried.error());
  if (!*retried) return not_dead(outbox, id, "retried", o);
  if (o.json) {
    write_json(o.out, {{"id", id}, {"state", "pending"}, {"attempts", 0}});
  } else {
    o.out << row_name(id) << " is pending again, due now, its attempts reset: the relay publishes it next\n";
  }
  return kExitOk;
}

int run_outbox_drop(OutboxReader& outbox, std::int64_t id, const Output& o) {
  auto dropped = outbox.drop_dead(id);
  if (!dropped) return outbox_error(o, dropped.error());
  if (!*dropped) return not_dead(outbox, id, "dropped", o);
  if (o.json) {
    write_json(o.out, {{"id", id}, {"dropped", true}});
  } else {
    o.out << "dropped " << row_name(id) << ": it will never be published\n";
  }
  return kExitOk;
}

int run_outbox_stats(OutboxReader& outbox, TimePoint now, const Output& o) {
  auto counts = outbox.count();
  if (!counts) return outbox_error(o, counts.error());
  if (o.json) {
    nlohmann::json j{{"pending", counts->pending}, {"sent", counts->sent}, {"dead", counts->dead}};
    j["oldest_pending"] = counts->oldest_pending ? nlohmann::json(format_time(*counts->oldest_pending)) : nullptr;
    j["oldest_pending_age_ms"] =
        counts->oldest_pending ? nlohmann::json((now - *counts->oldest_pending).count()) : nullptr;
    j["held_keys"] = counts->held_keys;
    j["oldest_held"] = counts->oldest_held ? nlohmann::json(format_time(*counts->oldest_held)) : nullptr;
    write_json(o.out, j);
    return kExitOk;
  }
  o.out << pad("pending", 16) << counts->pending << '\n'
        << pad("sent", 16) << counts->sent << "  (kept for the relay's retention)\n"
        << pad("dead", 16) << counts->dead << (counts->dead > 0 ? "  (see: idemctl outbox list --state dead)" : "")
        << '\n';
  if (counts->oldest_pending) {
    o.out << pad("oldest_pending", 16) << format_time(*counts->oldest_pending) << " ("
          << format_age(now - *counts->oldest_pending) << " ago)\n";
  } else {
    o.out << pad("oldest_pending", 16) << "none\n";
  }
  o.out << pad("held_keys", 16) << counts->held_keys;
  if (counts->oldest_held) {
    o.out << "  (ordering keys waiting behind a dead row since " << format_time(*counts->oldest_held) << ", "
          << format_age(now - *counts->oldest_held) << " ago: idemctl outbox retry or drop it)";
  }
  o.out << '\n';
  return kExitOk;
}

// ---- the command line ------------------------------------------------------------------------

namespace {

struct OutboxArgs {
  std::string url;
  std::string schema = "public";
  bool json = false;
  std::int64_t id = 0;
  bool body = false;               // show
  std::string state;               // list
  std::size_t limit = 100;         // list
  std::int64_t after = 0;          // list
};

CLI::App* add_outbox_command(CLI::App& parent, const std::shared_ptr<OutboxArgs>& args, std::string name,
                             std::string description) {
  CLI::App* cmd = parent.add_subcommand(std::move(name), std::move(description));
  cmd->add_option("--outbox", args->url, "the outbox: sqlite:PATH or postgres://... (default: $IDEM_OUTBOX)")
      ->envname("IDEM_OUTBOX")
      ->required();
  cmd->add_option("--schema", args->schema, "PostgreSQL: the schema holding idem_outbox (default public)");
  cmd->add_flag("--json", args->json, "print JSON (one line) instead of text");
  return cmd;
}

void add_id(CLI::App* cmd, const std::shared_ptr<OutboxArgs>& args) {
  cmd->add_option("id", args->id, "the row's id (idemctl outbox list shows it)")
      ->required()
      ->check(CLI::PositiveNumber);
}

// Opens the outbox for an operator (no lock, no schema change) or ends the command: exit 2 for
// a URL that cannot name an outbox, 1 when it cannot be opened.
std::unique_ptr<OutboxReader> open_or_fail(const OutboxArgs& args) {
  const std::string& url = args.url;
  if (!url.starts_with("sqlite:") && !url.starts_with("postgres://") && !url.starts_with("postgresql://")) {
    fail(kExitUsage, "--outbox: the outbox needs SQLite or PostgreSQL: expected sqlite:PATH or postgres://..., got \"" +
                         redact_url(url) + "\"");
  }
  OutboxReaderOptions options;
  options.relay = false;
  options.schema = args.schema;
  auto opened = open_outbox_reader(url, options);
  if (!opened) fail(kExitFailure, "cannot open outbox " + redact_url(url) + ": " + opened.error().message);
  return std::move(*opened);
}

}  // namespace

void register_outbox(CLI::App& app) {
  auto args = std::make_shared<OutboxArgs>();
  const auto output = [args] { return Output{std::cout, std::cerr, args->json}; };
  const auto now = [] { return SystemClock::instance().now(); };

  CLI::App* outbox = app.add_subcommand("outbox", "Operate a transactional outbox: list, show, retry, drop, stats");
  outbox->require_subcommand(1);
  outbox->group("Outbox (operators)");
  outbox->footer("They take no lock and change no schema: they work while idem-relay runs (docs/outbox.md).");

  CLI::App* list = add_outbox_command(*outbox, args, "list", "List rows in id order, without bodies");
  list->add_option("--state", args->state, "only rows in this state")->check(CLI::IsMember({"pending", "sent", "dead"}));
  list->add_option("--limit", args->limit, "rows per page (default 100)")->check(CLI::Range(1, 1000000));
  list->add_option("--after", args->after, "start after this id (the previous page's last)")
      ->check(CLI::NonNegativeNumber);
  list->callback([args, output, now] {
    OutboxQuery query;
    if (args->state == "pending") query.state = OutboxState::pending;
    if (args->state == "sent") query.state = OutboxState::sent;
    if (args->state == "dead") query.state = OutboxState::dead;
    query.after_id = args->after;
    query.limit = args->limit;
    auto reader = open_or_fail(*args);
    finish(run_outbox_list(*reader, query, now(), output()));
  });

  CLI::App* show = add_outbox_command(*outbox, args, "show", "Print one row: message, headers, state, attempts, error");
  add_id(show, args);
  show->add_flag("--body", args->body, "print only the row's body, raw");
  show->callback([args, output, now] {
    if (args->body && args->json) fail(kExitUsage, "--body and --json exclude each other (--json has body_base64)");
    auto reader = open_or_fail(*args);
    finish(run_outbox_show(*reader, args->id, args->body, now(), output()));
  });

  CLI::App* retry = add_outbox_command(*outbox, args, "retry", "Make a dead row pending again, due now, attempts reset");
  add_id(retry, args);
  retry->callback([args, output, now] {
    auto reader = open_or_fail(*args);
    finish(run_outbox_retry(*reader, args->id, now(), output()));
  });

  CLI::App* drop = add_outbox_command(*outbox, args, "drop", "Delete a dead row: it will never be published");
  add_id(drop, args);
  drop->callback([args, output] {
    auto reader = open_or_fail(*args);
    finish(run_outbox_drop(*reader, args->id, output()));
  });

  CLI::App* stats = add_outbox_command(*outbox, args, "stats", "Count rows by state; the oldest pending row's age");
  stats->callback([args, output, now] {
    auto reader = open_or_fail(*args);
    finish(run_outbox_stats(*reader, now(), output()));
  });
}

}  // namespace idem::cli
