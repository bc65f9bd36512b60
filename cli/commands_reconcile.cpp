// idemctl reconcile: the keys whose outcome is unknown, resolved by asking the upstream's lookup
// (reconcile_commands.hpp says how, docs/operations.md when to run it).

#include <CLI/CLI.hpp>

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "commands.hpp"
#include "idem/client/curl_transport.hpp"
#include "idem/engine.hpp"
#include "idem/error_envelope.hpp"
#include "idem/open_store.hpp"
#include "idem/problem.hpp"
#include "reconcile_commands.hpp"

namespace idem::cli {
namespace {

// One key's line.
struct KeyReport {
  RecordId id;
  std::uint32_t attempt = 0;
  Reconciled how = Reconciled::unknown;
  std::string detail;
};

class Reconciler {
 public:
  Reconciler(Store& store, client::Transport& transport, const ReconcileArgs& args, const Clock& clock)
      : store_(store), engine_(store, clock), transport_(transport), args_(args), clock_(clock) {}

  KeyReport reconcile(const Record& record) {
    KeyReport report{RecordId{record.tenant, record.key}, record.attempt, Reconciled::unknown, ""};
    if (record.lookup.empty()) {
      report.how = Reconciled::no_lookup;
      report.detail = "no lookup stored (its route's on_lease_expiry is not \"ask\"): check the upstream, then "
                      "idemctl resolve or release";
      return report;
    }
    auto lookup = http::parse_lookup(record.lookup);
    if (!lookup) {
      report.detail = "the stored lookup \"" + record.lookup + "\" is not valid: " + lookup.error();
      return report;
    }
    const std::string target = http::lookup_target(*lookup, record.tenant, record.key);
    if (args_.dry_run) {
      report.how = Reconciled::would_ask;
      report.detail = "would ask GET " + target;
      return report;
    }
    auto ticket = take_over(record, report);
    if (!ticket) return report;
    report.attempt = ticket->attempt;
    return ask(*ticket, target, std::move(report));
  }

  bool store_failed() const { return store_failed_; }

 private:
  // The takeover a gateway's retry makes: fences the vanished holder out with a new token and a
  // higher attempt, and holds the key while asking. nullopt (with `report` saying why) when the
  // key is not, or no longer, one to ask about.
  std::optional<Ticket> take_over(const Record& record, KeyReport& report) {
    const TimePoint now = clock_.now();
    ClaimRequest claim;
    claim.id = report.id;
    claim.request_hash = record.request_hash;
    claim.token = new_fencing_token();
    claim.now = now;
    claim.lease_expires = now + args_.lease;
    claim.expires = now + std::max(args_.retention, args_.lease);
    claim.take_over_expired_lease = true;
    claim.lookup = record.lookup;
    const Fence fence{claim.id, claim.token};
    const TimePoint lease_expires = claim.lease_expires;
    auto claimed = BlockingStore(store_).claim(std::move(claim));
    if (!claimed) {
      store_failed_ = true;
      report.detail = "store: " + claimed.error().message;
      return std::nullopt;
    }
    if (claimed->status != ClaimStatus::claimed) {
      report.how = Reconciled::skipped;
      report.detail = claimed->status == ClaimStatus::in_progress ? "held by a request meanwhile"
                                                                  : "no longer in progress";
      return std::nullopt;
    }
    Ticket ticket{fence,      record.request_hash, claimed->kind, claimed->record.attempt, lease_expires,
                  args_.retention, args_.store_server_errors};
    if (claimed->kind != ClaimKind::after_lease_expiry) {
      // The record changed between the listing and the claim (it expired, or was marked
      // retryable): nothing to ask about; give it back as it was.
      (void)engine_.unclaim_and_wait(ticket);
      report.how = Reconciled::skipped;
      report.detail = "changed meanwhile";
      return std::nullopt;
    }
    return ticket;
  }

  KeyReport ask(const Ticket& ticket, const std::string& target, KeyReport report) {
    client::HttpRequest request;
    request.method = "GET";
    request.url = args_.upstream + target;
    request.headers = http::lookup_request_headers(args_.headers, ticket.fence.id.tenant, ticket.fence.id.key,
                                                   ticket.attempt);
    auto answered = transport_.perform(request, args_.timeout);
    if (!answered) return give_back(ticket, std::move(report), "the lookup failed: " + answered.error().message);

    http::LookupReply reply;
    reply.status = answered->status;
    reply.headers = std::move(answered->headers);
    reply.truncated = answered->body.size() > args_.max_stored_response;
    if (!reply.truncated) reply.body = std::move(answered->body);
    http::LookupRules rules;
    rules.key_header = args_.headers.key;
    rules.store_server_errors = args_.store_server_errors;
    http::LookupResult result = http::interpret_lookup(reply, ticket.fence.id.key, rules);

    switch (result.answer) {
      case http::LookupAnswer::happened: {
        StoredResponse outcome =
            result.oversized ? not_stored_response(result.response.status, args_.max_stored_response,
                                                *ErrorEnvelope::problem_json()) : std::move(result.response);
        const int status = outcome.status;
        auto stored = engine_.resolve_and_wait(ticket, std::move(outcome));
        if (!stored) return failed(std::move(report), stored.error());
        if (*stored == FinishStatus::fenced_out) return taken(std::move(report));
        report.how = Reconciled::resolved;
        report.detail = "happened: " + std::to_string(status) + ", replayed from now on";
        return report;
      }
      case http::LookupAnswer::not_found: {
        // Never happened: the next retry executes, as the attempt after this one (which the
        // upstream has now seen, so the vanished holder's lower attempt cannot write).
        auto marked = engine_.release_and_wait(ticket);
        if (!marked) return failed(std::move(report), marked.error());
        if (*marked == FinishStatus::fenced_out) return taken(std::move(report));
        report.how = Reconciled::retryable;
        report.detail = "never happened: the next retry executes it";
        return report;
      }
      case http::LookupAnswer::unknown:
      case http::LookupAnswer::malformed:
      case http::LookupAnswer::mismatch:
        break;
    }
    return give_back(ticket, std::move(report),
                     std::string(http::to_string(result.answer)) + ": " + result.detail);
  }

  KeyReport give_back(const Ticket& ticket, KeyReport report, std::string why) {
    auto back = engine_.unclaim_and_wait(ticket);
    report.how = Reconciled::unknown;
    report.detail = std::move(why);
    if (!back) {
      store_failed_ = true;
      report.detail += " (giving the key back failed: " + back.error().message + "; its lease runs out instead)";
    }
    return report;
  }

  KeyReport failed(KeyReport report, const StoreError& error) {
    store_failed_ = true;
    report.how = Reconciled::unknown;
    report.detail = "store: " + error.message + (error.in_doubt ? " (the change may have been applied)" : "");
    return report;
  }

  static KeyReport taken(KeyReport report) {
    report.how = Reconciled::skipped;
    report.detail = "taken over while it was asked (an operator's action?)";
    return report;
  }

  Store& store_;
  Engine engine_;
  client::Transport& transport_;
  const ReconcileArgs& args_;
  const Clock& clock_;
  bool store_failed_ = false;
};

}  // namespace

std::string_view to_string(Reconciled r) {
  switch (r) {
    case Reconciled::resolved: return "resolved";
    case Reconciled::retryable: return "retryable";
    case Reconciled::unknown: return "unknown";
    case Reconciled::no_lookup: return "no_lookup";
    case Reconciled::skipped: return "skipped";
    case Reconciled::would_ask: return "would_ask";
  }
  return "unknown";
}

int run_reconcile(Store& store, StoreAdmin& admin, client::Transport& transport, const ReconcileArgs& args,
                  const Clock& clock, const Output& o) {
  Reconciler reconciler(store, transport, args, clock);
  std::vector<KeyReport> reports;
  ListQuery query;
  query.state = RecordState::in_progress;
  query.tenant = args.tenant;
  query.limit = 500;
  for (;;) {
    auto page = wait_for<std::vector<Record>>([&](auto cb) { admin.list(query, std::move(cb)); });
    if (!page) {
      return error(o, kExitFailure, "store error (" + std::string(to_string(page.error().code)) +
                                        "): " + page.error().message);
    }
    for (const Record& r : *page) {
      const TimePoint now = clock.now();
      // Only keys whose holder is gone: a valid lease is a request still running, and an expired
      // record is as if absent.
      if (r.lease_expires > now || r.expires <= now) continue;
      reports.push_back(reconciler.reconcile(r));
      if (!o.json) {
        const KeyReport& k = reports.back();
        o.out << pad(std::string(to_string(k.how)), 11) << (k.id.tenant.empty() ? "''" : shell_quote(k.id.tenant))
              << ' ' << shell_quote(k.id.key) << "  attempt " << k.attempt << ": " << k.detail << '\n';
      }
    }
    if (page->size() < query.limit) break;
    query.after = RecordId{page->back().tenant, page->back().key};
  }
  std::map<Reconciled, std::size_t> counts;
  for (const KeyReport& k : reports) ++counts[k.how];
  const bool undecided = counts[Reconciled::unknown] > 0 || reconciler.store_failed();
  if (o.json) {
    nlohmann::json keys = nlohmann::json::array();
    for (const KeyReport& k : reports) {
      keys.push_back({{"tenant", k.id.tenant},
                      {"key", k.id.key},
                      {"attempt", k.attempt},
                      {"result", to_string(k.how)},
                      {"detail", k.detail}});
    }
    nlohmann::json totals = nlohmann::json::object();
    for (auto r : {Reconciled::resolved, Reconciled::retryable, Reconciled::unknown, Reconciled::no_lookup,
                   Reconciled::skipped, Reconciled::would_ask}) {
      totals[std::string(to_string(r))] = counts[r];
    }
    write_json(o.out, {{"keys", std::move(keys)}, {"counts", std::move(totals)}});
  } else {
    o.out << reports.size() << " key" << (reports.size() == 1 ? "" : "s") << " with an unknown outcome: "
          << counts[Reconciled::resolved] << " resolved, " << counts[Reconciled::retryable] << " retryable, "
          << counts[Reconciled::unknown] << " still unknown, " << counts[Reconciled::no_lookup]
          << " without a lookup, " << counts[Reconciled::skipped] << " skipped";
    if (args.dry_run) o.out << ", " << counts[Reconciled::would_ask] << " would be asked (--dry-run)";
    o.out << '\n';
  }
  if (undecided) return error(o, kExitFailure, "some keys are still unknown: run reconcile again later");
  return kExitOk;
}

void register_reconcile(CLI::App& app) {
  struct Args {
    std::string url, upstream, tenant, timeout = "5s", lease = "30s", retention = "24h", key_file;
    std::string max_response = "1048576";
    bool json = false, dry_run = false, store_server_errors = false;
    http::LookupHeaders headers;
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "reconcile",
      "Resolve keys whose outcome is unknown by asking the upstream's lookup (routes with on_lease_expiry = \"ask\")");
  cmd->group("Store (operators)");
  cmd->add_option("--store", a->url, "store URL (default: $IDEM_STORE)")->envname("IDEM_STORE")->required();
  cmd->add_option("--upstream", a->upstream, "the gateway's upstream, http://HOST[:PORT]")->required();
  cmd->add_option("--tenant", a->tenant, "only this tenant's keys");
  cmd->add_option("--timeout", a->timeout, "each lookup (default 5s)");
  cmd->add_option("--lease", a->lease, "how long a key is held while it is asked about (default 30s, > --timeout)");
  cmd->add_option("--retention", a->retention, "how long a resolved outcome is replayed (default 24h)");
  cmd->add_option("--max-response", a->max_response,
                  "the gateway's max_stored_response in bytes (default 1048576): a larger answer is stored as 410");
  cmd->add_option("--key-header", a->headers.key, "the routes' key header (default Idempotency-Key)");
  cmd->add_option("--tenant-header", a->headers.tenant, "the gateway's upstream_tenant_header");
  cmd->add_option("--attempt-header", a->headers.attempt, "the gateway's upstream_attempt_header");
  cmd->add_flag("--store-server-errors", a->store_server_errors, "the routes store 5xx responses");
  cmd->add_option("--key-file", a->key_file, "the gateway's [encryption] key file (default: $IDEM_KEY_FILE)")
      ->envname("IDEM_KEY_FILE");
  cmd->add_flag("--dry-run", a->dry_run, "only list the keys and the lookups that would be sent");
  cmd->add_flag("--json", a->json, "print JSON (one line) instead of text");
  cmd->footer(
      "Asks about every key in progress whose lease ran out (its holder died, or its upstream timed out, or\n"
      "a gateway's lookup could not answer), with the lookup its route stored. A 2xx completes the key with\n"
      "the upstream's answer; a 404 marked \"not_found\" makes it retryable; anything else leaves it. Safe\n"
      "while gateways serve. Exit 1 while some keys stay unknown.");
  cmd->callback([a] {
    ReconcileArgs args;
    if (!a->upstream.starts_with("http://")) fail(kExitUsage, "--upstream: expected http://HOST[:PORT]");
    args.upstream = a->upstream;
    while (args.upstream.ends_with('/')) args.upstream.pop_back();
    if (!a->tenant.empty()) args.tenant = a->tenant;
    const auto duration = [](const char* name, const std::string& text) {
      auto d = parse_duration(text);
      if (!d || *d <= Millis{0}) fail(kExitUsage, std::string(name) + ": expected a positive duration like 5s");
      return *d;
    };
    args.timeout = duration("--timeout", a->timeout);
    args.lease = duration("--lease", a->lease);
    args.retention = duration("--retention", a->retention);
    if (args.lease <= args.timeout) fail(kExitUsage, "--lease must be longer than --timeout");
    try {
      args.max_stored_response = static_cast<std::size_t>(std::stoull(a->max_response));
    } catch (const std::exception&) {
      fail(kExitUsage, "--max-response: expected a number of bytes");
    }
    args.headers = a->headers;
    args.store_server_errors = a->store_server_errors;
    args.dry_run = a->dry_run;
    std::shared_ptr<const KeyRing> keys;
    if (!a->key_file.empty()) {
      auto loaded = KeyRing::load(a->key_file);
      if (!loaded) fail(kExitUsage, "--key-file: " + loaded.error());
      keys = *loaded;
    }
    if (auto problem = check_store_url(a->url)) fail(kExitUsage, "--store: " + *problem);
    if (a->url.starts_with("memory")) fail(kExitUsage, "--store memory: is empty in a new process; name the gateway's store");
    if (const auto path = sqlite_path_of(a->url)) {
      std::error_code ec;
      // Opening a mistyped path would create an empty store that "has no unknown keys".
      if (!std::filesystem::exists(*path, ec)) fail(kExitFailure, "cannot open store: " + *path + " does not exist");
    }
    OpenStoreOptions options;
    options.encryption = std::move(keys);  // an outcome it records is encrypted like the gateway's
    auto opened = open_store(a->url, options);
    if (!opened) fail(kExitFailure, "cannot open store " + redact_url(a->url) + ": " + opened.error().message);
    client::CurlOptions curl;
    curl.max_response_bytes = std::max<std::size_t>(args.max_stored_response + 1, std::size_t{64} << 20);
    client::CurlTransport transport(curl);
    const Output o{std::cout, std::cerr, a->json};
    finish(run_reconcile(*opened->store, *opened->admin, transport, args, SystemClock::instance(), o));
  });
}

}  // namespace idem::cli
