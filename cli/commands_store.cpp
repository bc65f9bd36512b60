// idemctl get, list, purge, release, resolve, stats: operating the records of any store, named by
// URL (--store, or $IDEM_STORE). What an operator needs when a key is stuck or a response was lost.

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <iostream>
#include <memory>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "commands.hpp"
#include "idem/open_store.hpp"
#include "store_commands.hpp"

namespace idem::cli {
namespace {

int store_error(const Output& o, const StoreError& e) {
  std::string message = "store error (" + std::string(to_string(e.code)) + "): " + e.message;
  if (e.in_doubt) message += " (the change may have been applied; check with idemctl get)";
  return error(o, kExitFailure, message);
}

std::string describe(const RecordId& id) { return "tenant " + json_quoted(id.tenant) + " key " + json_quoted(id.key); }

}  // namespace

std::optional<Encryption> open_for_display(Record& record, const KeyRing* keys) {
  if (!record.response || !is_sealed(*record.response)) return std::nullopt;
  Encryption e;
  e.key_id = std::string(sealed_key_id(*record.response).value_or(""));
  if (keys == nullptr) return e;
  auto opened = keys->open(RecordId{record.tenant, record.key}, *record.response);
  if (!opened) {
    e.error = opened.error().message;
    return e;
  }
  record.response = std::move(*opened);
  e.opened = true;
  return e;
}

nlohmann::json record_json(const Record& r, TimePoint now, bool with_body, const std::optional<Encryption>& encryption) {
  nlohmann::json j;
  j["tenant"] = r.tenant;
  j["key"] = r.key;
  j["state"] = to_string(r.state);
  j["request_hash"] = r.request_hash;
  j["fencing_token"] = std::to_string(r.fencing_token);  // a string: 64 bits do not survive a double
  j["created"] = format_time(r.created);
  j["lease_expires"] = r.state == RecordState::in_progress ? nlohmann::json(format_time(r.lease_expires)) : nullptr;
  j["completed"] = r.completed ? nlohmann::json(format_time(*r.completed)) : nullptr;
  j["expires"] = format_time(r.expires);
  j["expired"] = r.expires <= now;
  if (encryption && !encryption->opened) {
    nlohmann::json res;
    res["encrypted"] = true;
    res["key_id"] = encryption->key_id;
    res["error"] = encryption->error.empty() ? nlohmann::json(nullptr) : nlohmann::json(encryption->error);
    j["response"] = std::move(res);
  } else if (r.response) {
    nlohmann::json res;
    if (encryption) {
      res["encrypted"] = true;
      res["key_id"] = encryption->key_id;
    }
    res["status"] = r.response->status;
    res["headers"] = headers_json(r.response->headers);
    res["body_size"] = r.response->body.size();
    if (with_body) res["body_base64"] = base64(r.response->body);
    j["response"] = std::move(res);
  } else {
    j["response"] = nullptr;
  }
  return j;
}

int run_get(Store& store, const RecordId& id, bool body_only, TimePoint now, const Output& o, const KeyRing* keys) {
  auto found = wait_for<std::optional<Record>>([&](auto cb) { store.get(id, std::move(cb)); });
  if (!found) return store_error(o, found.error());
  if (!*found) return error(o, kExitFailure, "no record for " + describe(id));
  Record& r = **found;
  const std::optional<Encryption> encryption = open_for_display(r, keys);
  const bool sealed = encryption && !encryption->opened;
  if (body_only) {
    if (!r.response) {
      return error(o, kExitFailure, describe(id) + " has no stored response (state " + std::string(to_string(r.state)) + ")");
    }
    if (sealed && !encryption->error.empty()) return error(o, kExitFailure, "cannot decrypt: " + encryption->error);
    if (sealed) {
      return error(o, kExitFailure, describe(id) + "'s response is encrypted with key id " +
                                        json_quoted(encryption->key_id) + ": give --key-file to print it");
    }
    o.out.write(r.response->body.data(), static_cast<std::streamsize>(r.response->body.size()));
    return kExitOk;
  }
  const int status = sealed && !encryption->error.empty() ? kExitFailure : kExitOk;
  if (o.json) {
    write_json(o.out, record_json(r, now, /*with_body=*/true, encryption));
    if (status != kExitOk) error(o, status, "cannot decrypt: " + encryption->error);
    return status;
  }
  const auto line = [&](std::string_view name, const std::string& value) {
    o.out << pad(std::string(name), 15) << value << '\n';
  };
  line("tenant", r.tenant.empty() ? "(empty)" : r.tenant);
  line("key", r.key);
  line("state", std::string(to_string(r.state)));
  line("request_hash", r.request_hash);
  line("fencing_token", std::to_string(r.fencing_token));
  line("created", format_time(r.created));
  if (r.state == RecordState::in_progress) {
    line("lease_expires", format_time(r.lease_expires) + (r.lease_expires <= now ? " (lease expired)" : ""));
  }
  if (r.completed) line("completed", format_time(*r.completed));
  line("expires", format_time(r.expires) + (r.expires <= now ? " (expired: as if absent; purge deletes it)" : ""));
  if (sealed) {
    line("response", "encrypted with key id " + json_quoted(encryption->key_id) +
                         (encryption->error.empty() ? " (--key-file shows it)" : "; cannot be decrypted"));
    if (status != kExitOk) return error(o, status, "cannot decrypt: " + encryption->error);
  } else if (r.response) {
    if (encryption) line("encrypted", "key id " + json_quoted(encryption->key_id));
    line("status", std::to_string(r.response->status));
    for (const Header& h : r.response->headers) line("header", h.name + ": " + h.value);
    line("body", std::to_string(r.response->body.size()) + " bytes (--body prints them)");
  } else {
    line("response", "none stored");
  }
  return kExitOk;
}

int run_list(StoreAdmin& admin, const ListArgs& args, TimePoint now, const Output& o, const KeyRing* keys) {
  ListQuery query;
  query.state = args.state;
  query.after = args.after;
  query.tenant = args.tenant;
  query.limit = std::max<std::size_t>(1, args.limit);
  std::vector<Record> shown;
  bool full_page = false;
  for (;;) {
    auto page = wait_for<std::vector<Record>>([&](auto cb) { admin.list(query, std::move(cb)); });
    if (!page) return store_error(o, page.error());
    full_page = page->size() >= query.limit;
    if (!page->empty()) query.after = RecordId{page->back().tenant, page->back().key};
    for (Record& r : *page) shown.push_back(std::move(r));
    if (!args.all || !full_page) break;
  }
  const bool more = full_page && !args.all;
  std::vector<std::optional<Encryption>> encryption;
  std::size_t sealed = 0;
  std::vector<std::string> unreadable;
  for (Record& r : shown) {
    encryption.push_back(open_for_display(r, keys));
    if (encryption.back() && !encryption.back()->opened) ++sealed;
    if (encryption.back() && !encryption.back()->error.empty()) unreadable.push_back(encryption.back()->error);
  }
  const int status = unreadable.empty() ? kExitOk : kExitFailure;
  const auto report = [&] {
    for (const std::string& why : unreadable) error(o, status, "cannot decrypt: " + why);
    if (keys == nullptr && sealed > 0) {
      error(o, kExitOk, std::to_string(sealed) + " response" + (sealed == 1 ? " is" : "s are") +
                            " encrypted (STATUS enc); --key-file shows their statuses");
    }
    return status;
  };
  if (o.json) {
    nlohmann::json records = nlohmann::json::array();
    for (std::size_t i = 0; i < shown.size(); ++i) {
      records.push_back(record_json(shown[i], now, /*with_body=*/false, encryption[i]));
    }
    nlohmann::json j{{"records", std::move(records)}};
    j["next_after"] = more ? nlohmann::json{{"tenant", query.after->tenant}, {"key", query.after->key}} : nullptr;
    write_json(o.out, j);
    for (const std::string& why : unreadable) error(o, status, "cannot decrypt: " + why);
    return status;
  }
  if (shown.empty()) {
    o.out << "no records\n";
    return kExitOk;
  }
  o.out << pad("STATE", 17) << pad("STATUS", 7) << pad("CREATED", 25) << pad("EXPIRES", 25) << "TENANT KEY\n";
  for (std::size_t i = 0; i < shown.size(); ++i) {
    const Record& r = shown[i];
    const std::optional<Encryption>& e = encryption[i];
    const std::string shown_status = e && !e->opened ? (e->error.empty() ? "enc" : "?")
                                     : r.response   ? std::to_string(r.response->status)
                                                    : "-";
    o.out << pad(std::string(to_string(r.state)), 17) << pad(shown_status, 7)
          << pad(format_time(r.created), 25) << pad(format_time(r.expires), 25)
          << (r.tenant.empty() ? "''" : shell_quote(r.tenant)) << ' ' << shell_quote(r.key)
          << (r.expires <= now ? "  (expired)" : "") << '\n';
  }
  if (more) {
    error(o, kExitOk, "more records may follow: add --after " + shell_quote(query.after->tenant) + " " +
                          shell_quote(query.after->key) + " (or use --all)");
  }
  return report();
}

int run_purge(Store& store, TimePoint now, std::size_t batch, const Output& o) {
  batch = std::max<std::size_t>(1, batch);
  std::size_t total = 0;
  for (;;) {
    auto purged = wait_for<std::size_t>([&](auto cb) { store.purge_expired(now, batch, std::move(cb)); });
    if (!purged) {
      if (total > 0) error(o, kExitOk, "purged " + std::to_string(total) + " expired records before the error");
      return store_error(o, purged.error());
    }
    total += *purged;
    if (*purged < batch) break;
  }
  if (o.json) {
    write_json(o.out, {{"purged", total}});
  } else {
    o.out << "purged " << total << " expired record" << (total == 1 ? "" : "s") << '\n';
  }
  return kExitOk;
}

int run_release(StoreAdmin& admin, const RecordId& id, TimePoint now, const Output& o) {
  auto status = wait_for<AdminStatus>([&](auto cb) { admin.mark_retryable(id, now, std::move(cb)); });
  if (!status) return store_error(o, status.error());
  switch (*status) {
    case AdminStatus::done:
      if (o.json) {
        write_json(o.out, {{"tenant", id.tenant}, {"key", id.key}, {"state", "failed_retryable"}});
      } else {
        o.out << "released " << describe(id)
              << ": now failed_retryable; the next request with the same fingerprint executes again\n";
      }
      return kExitOk;
    case AdminStatus::not_found:
      return error(o, kExitFailure, "no record for " + describe(id) + " (absent or expired)");
    case AdminStatus::wrong_state:
      return error(o, kExitFailure, describe(id) +
                                        " is completed: its response is replayed and it cannot be released "
                                        "(it is forgotten when it expires)");
  }
  return kExitFailure;
}

int run_resolve(StoreAdmin& admin, const RecordId& id, StoredResponse response, TimePoint now, Millis retention,
                const Output& o) {
  const int status_code = response.status;
  const std::size_t body_size = response.body.size();
  const TimePoint expires = now + retention;
  auto status = wait_for<AdminStatus>(
      [&](auto cb) { admin.resolve(id, std::move(response), now, expires, std::move(cb)); });
  if (!status) return store_error(o, status.error());
  switch (*status) {
    case AdminStatus::done:
      if (o.json) {
        write_json(o.out, {{"tenant", id.tenant},
                           {"key", id.key},
                           {"state", "completed"},
                           {"status", status_code},
                           {"body_size", body_size},
                           {"expires", format_time(expires)}});
      } else {
        o.out << "resolved " << describe(id) << ": completed with status " << status_code << " (" << body_size
              << " bytes), replayed until " << format_time(expires) << '\n';
      }
      return kExitOk;
    case AdminStatus::not_found:
      return error(o, kExitFailure, "no record for " + describe(id) + " (absent or expired)");
    case AdminStatus::wrong_state:
      return error(o, kExitFailure, describe(id) + " is already completed; its stored response stands");
  }
  return kExitFailure;
}

int run_stats(StoreAdmin& admin, TimePoint now, const Output& o) {
  auto counts = wait_for<StateCounts>([&](auto cb) { admin.count(now, std::move(cb)); });
  if (!counts) return store_error(o, counts.error());
  const std::uint64_t total = counts->in_progress + counts->completed + counts->failed_retryable + counts->expired;
  if (o.json) {
    write_json(o.out, {{"in_progress", counts->in_progress},
                       {"completed", counts->completed},
                       {"failed_retryable", counts->failed_retryable},
                       {"expired", counts->expired},
                       {"total", total}});
    return kExitOk;
  }
  o.out << pad("in_progress", 18) << counts->in_progress << '\n'
        << pad("completed", 18) << counts->completed << '\n'
        << pad("failed_retryable", 18) << counts->failed_retryable << '\n'
        << pad("expired", 18) << counts->expired << "  (not yet purged)\n"
        << pad("total", 18) << total << '\n';
  return kExitOk;
}

// ---- the command line ------------------------------------------------------------------------

namespace {

struct StoreArgs {
  std::string url;
  bool json = false;
  std::string tenant;
  std::string key;
  // get
  bool body = false;
  // list
  std::string state;
  std::size_t limit = 100;
  std::vector<std::string> after;
  std::optional<std::string> only_tenant;
  bool all = false;
  // purge
  std::size_t batch = 1000;
  // resolve
  int status = 0;
  std::string response_body;
  std::vector<std::string> headers;
  std::string retention = "24h";
  // get, list, resolve
  std::string key_file;
};

const CLI::Validator kHeaderLine(
    [](std::string& line) { return parse_header_line(line) ? std::string() : "'" + line + "' is not 'Name: value'"; },
    "", "header");

const CLI::Validator kDuration(
    [](std::string& text) {
      return parse_duration(text) ? std::string() : "'" + text + "' is not a duration like 30s, 15m, 24h, 1h30m";
    },
    "", "duration");

// The --store option and its environment variable, and --json: every store command has them.
CLI::App* add_store_command(CLI::App& app, const std::shared_ptr<StoreArgs>& args, std::string name,
                            std::string description) {
  CLI::App* cmd = app.add_subcommand(std::move(name), std::move(description));
  cmd->add_option("--store", args->url,
                  "store URL: sqlite:PATH, postgres://..., redis://HOST:PORT, redis+cluster://... "
                  "(default: $IDEM_STORE)")
      ->envname("IDEM_STORE")
      ->required();
  cmd->add_flag("--json", args->json, "print JSON (one line) instead of text");
  cmd->group("Store (operators)");
  return cmd;
}

void add_id(CLI::App* cmd, const std::shared_ptr<StoreArgs>& args) {
  cmd->add_option("tenant", args->tenant, "the tenant ('' when the gateway has no [tenant] rule)")->required();
  cmd->add_option("key", args->key, "the idempotency key")->required();
}

// The keys of --key-file (or $IDEM_KEY_FILE); null when neither is given. A key file that does
// not load ends the command (exit 2), as it would stop the gateway.
std::shared_ptr<const KeyRing> keys_or_fail(const std::string& path) {
  if (path.empty()) return nullptr;
  auto keys = KeyRing::load(path);
  if (!keys) fail(kExitUsage, "--key-file: " + keys.error());
  return *keys;
}

void add_key_file(CLI::App* cmd, const std::shared_ptr<StoreArgs>& args, const std::string& what) {
  cmd->add_option("--key-file", args->key_file,
                  "the gateway's [encryption] key file (default: $IDEM_KEY_FILE): " + what)
      ->envname("IDEM_KEY_FILE");
}

// Opens the store or ends the command (exit 1, the reason on stderr). With `keys`, through an
// EncryptedStore: what it writes is encrypted.
OpenedStore open_or_fail(const std::string& url, std::shared_ptr<const KeyRing> keys = nullptr) {
  if (url == "memory:" || url == "memory" || url == "memory://") {
    fail(kExitUsage, "--store memory: is empty in a new process; name the gateway's store (sqlite:PATH, ...)");
  }
  if (auto problem = check_store_url(url)) fail(kExitUsage, "--store: " + *problem);
  // Opening an SQLite path creates the file. For an operator's tool that turns a mistyped path
  // into an empty store that answers "no records" in the middle of an incident: refuse instead.
  if (const auto path = sqlite_path_of(url)) {
    std::error_code ec;
    if (!std::filesystem::exists(*path, ec)) {
      fail(kExitFailure, "cannot open store " + redact_url(url) + ": " + *path +
                             " does not exist (idemctl never creates a store: give the path the gateway uses)");
    }
  }
  OpenStoreOptions options;
  options.encryption = std::move(keys);
  auto opened = open_store(url, options);
  if (!opened) fail(kExitFailure, "cannot open store " + redact_url(url) + ": " + opened.error().message);
  return std::move(*opened);
}

}  // namespace

OpenedStore open_store_or_fail(const std::string& url, std::shared_ptr<const KeyRing> keys) {
  return open_or_fail(url, std::move(keys));
}

void register_store(CLI::App& app) {
  auto args = std::make_shared<StoreArgs>();
  const auto output = [args] { return Output{std::cout, std::cerr, args->json}; };
  const auto now = [] { return SystemClock::instance().now(); };

  CLI::App* get = add_store_command(app, args, "get", "Print one record: state, hash, token, times, response");
  add_id(get, args);
  get->add_flag("--body", args->body, "print only the stored response body, raw");
  add_key_file(get, args, "decrypts an encrypted response (without it: only its key id)");
  get->callback([args, output, now] {
    if (args->body && args->json) fail(kExitUsage, "--body and --json exclude each other (--json has body_base64)");
    const auto keys = keys_or_fail(args->key_file);
    OpenedStore s = open_or_fail(args->url);
    finish(run_get(*s.store, {args->tenant, args->key}, args->body, now(), output(), keys.get()));
  });

  CLI::App* list = add_store_command(app, args, "list", "List records in (tenant, key) order, without bodies");
  list->add_option("--state", args->state, "only records in this state")
      ->check(CLI::IsMember({"in_progress", "completed", "failed_retryable"}));
  list->add_option("--limit", args->limit, "records per page (default 100)")->check(CLI::Range(1, 1000000));
  list->add_option("--after", args->after, "start after this record (the previous page's last)")
      ->expected(2)
      ->type_name("TENANT KEY");
  list->add_option("--tenant", args->only_tenant, "only this tenant's records ('' for no tenant)")
      ->type_name("TENANT");
  list->add_flag("--all", args->all, "every record, page after page");
  add_key_file(list, args, "shows the status of encrypted responses (without it: enc)");
  list->callback([args, output, now] {
    ListArgs l;
    if (!args->state.empty()) l.state = parse_record_state(args->state);
    if (args->after.size() == 2) l.after = RecordId{args->after[0], args->after[1]};
    l.tenant = args->only_tenant;
    l.limit = args->limit;
    l.all = args->all;
    const auto keys = keys_or_fail(args->key_file);
    OpenedStore s = open_or_fail(args->url);
    finish(run_list(*s.admin, l, now(), output(), keys.get()));
  });

  CLI::App* purge = add_store_command(app, args, "purge", "Delete expired records now, in batches; print how many");
  purge->add_option("--batch", args->batch, "records deleted per store call (default 1000)")
      ->check(CLI::Range(1, 1000000));
  purge->callback([args, output, now] {
    OpenedStore s = open_or_fail(args->url);
    finish(run_purge(*s.store, now(), args->batch, output()));
  });

  CLI::App* release = add_store_command(
      app, args, "release",
      "Make an in_progress (stuck or outcome-unknown) record retryable: the next request executes");
  add_id(release, args);
  release->footer(
      "Use it when the operation did NOT take effect (check the upstream first): the next retry\n"
      "with the same key executes it again. If it did take effect, use resolve instead.");
  release->callback([args, output, now] {
    OpenedStore s = open_or_fail(args->url);
    finish(run_release(*s.admin, {args->tenant, args->key}, now(), output()));
  });

  CLI::App* resolve = add_store_command(
      app, args, "resolve", "Record a known outcome for an in_progress or failed_retryable record; retries replay it");
  add_id(resolve, args);
  resolve->add_option("--status", args->status, "the response status to replay")
      ->required()
      ->check(CLI::Range(100, 599));
  resolve->add_option("--body", args->response_body, "the response body: DATA, @FILE, or @- for stdin")
      ->required();
  resolve->add_option("-H,--header", args->headers, "a response header to replay, 'Name: value' (repeatable)")
      ->type_name("'NAME: VALUE'")
      ->allow_extra_args(false)
      ->check(kHeaderLine);
  resolve->add_option("--retention", args->retention, "how long the outcome is replayed (default 24h)")
      ->check(kDuration);
  add_key_file(resolve, args, "encrypts the response as the gateway would (give it when the gateway encrypts)");
  resolve->callback([args, output, now] {
    std::string why;
    auto body = read_data_argument(args->response_body, why);
    if (!body) fail(kExitUsage, "--body: " + why);
    StoredResponse response;
    response.status = args->status;
    response.body = std::move(*body);
    for (const std::string& line : args->headers) response.headers.push_back(*parse_header_line(line));
    const Millis retention = *parse_duration(args->retention);
    if (retention <= Millis{0}) fail(kExitUsage, "--retention must be positive");
    OpenedStore s = open_or_fail(args->url, keys_or_fail(args->key_file));
    finish(run_resolve(*s.admin, {args->tenant, args->key}, std::move(response), now(), retention, output()));
  });

  CLI::App* stats = add_store_command(app, args, "stats", "Count records by state");
  stats->callback([args, output, now] {
    OpenedStore s = open_or_fail(args->url);
    finish(run_stats(*s.admin, now(), output()));
  });
}

}  // namespace idem::cli
