// idemctl holds list, show, drop, forget: the keys a consumer holds behind a dead letter
// (ConsumeLoop with ordering = key and holds; idem-consume's `dead_letters = "hold"`).

#include <CLI/CLI.hpp>

#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "commands.hpp"
#include "holds_commands.hpp"
#include "store_commands.hpp"

namespace idem::cli {
namespace {

int store_error(const Output& o, const StoreError& e) {
  return error(o, kExitFailure, "store error (" + std::string(to_string(e.code)) + "): " + e.message);
}

std::string not_held(const std::string& key) { return "ordering key " + json_quoted(key) + " is not held"; }

}  // namespace

int run_holds_list(StoreAdmin& admin, const std::string& consumer, const Output& o) {
  ListQuery query;
  query.tenant = StoreKeyHolds::tenant_of(consumer);
  query.state = RecordState::in_progress;
  query.limit = 1000;
  std::vector<Record> held;
  for (;;) {
    auto page = wait_for<std::vector<Record>>([&](auto cb) { admin.list(query, std::move(cb)); });
    if (!page) return store_error(o, page.error());
    const bool full = page->size() >= query.limit;
    if (!page->empty()) query.after = RecordId{page->back().tenant, page->back().key};
    for (Record& r : *page) held.push_back(std::move(r));
    if (!full) break;
  }
  if (o.json) {
    nlohmann::json keys = nlohmann::json::array();
    for (const Record& r : held) {
      const auto ids = StoreKeyHolds::parked_ids(r);
      keys.push_back({{"key", r.key},
                      {"parked", ids.size()},
                      {"first", ids.empty() ? nlohmann::json(nullptr) : nlohmann::json(ids.front())},
                      {"since", format_time(r.created)}});
    }
    write_json(o.out, nlohmann::json{{"consumer", consumer}, {"held_keys", std::move(keys)}});
    return kExitOk;
  }
  if (held.empty()) {
    o.out << "no keys held by consumer " << json_quoted(consumer) << '\n';
    return kExitOk;
  }
  o.out << pad("SINCE", 25) << pad("PARKED", 8) << pad("FIRST", 40) << "KEY\n";
  for (const Record& r : held) {
    const auto ids = StoreKeyHolds::parked_ids(r);
    o.out << pad(format_time(r.created), 25) << pad(std::to_string(ids.size()), 8)
          << pad(ids.empty() ? "-" : shell_quote(ids.front()), 40) << shell_quote(r.key) << '\n';
  }
  return kExitOk;
}

int run_holds_show(StoreKeyHolds& holds, const std::string& key, const Output& o) {
  auto ids = holds.parked(key);
  if (!ids) return store_error(o, ids.error());
  if (ids->empty()) return error(o, kExitFailure, not_held(key));
  if (o.json) {
    write_json(o.out, nlohmann::json{{"key", key}, {"parked", *ids}});
    return kExitOk;
  }
  o.out << "ordering key " << shell_quote(key) << " is held; parked, in the order to replay them:\n";
  for (const std::string& id : *ids) o.out << "  " << id << '\n';
  return kExitOk;
}

int run_holds_drop(StoreKeyHolds& holds, const std::string& key, const std::string& message_id, const Output& o) {
  auto ids = holds.parked(key);
  if (!ids) return store_error(o, ids.error());
  if (ids->empty()) return error(o, kExitFailure, not_held(key));
  if (ids->front() != message_id) {
    return error(o, kExitFailure, "the first parked message of ordering key " + json_quoted(key) + " is " +
                                      json_quoted(ids->front()) + ", not " + json_quoted(message_id) +
                                      ": only the first can be dropped");
  }
  if (auto dropped = holds.unpark_first(key, message_id); !dropped) return store_error(o, dropped.error());
  auto left = holds.parked(key);
  if (!left) return store_error(o, left.error());
  if (left->empty()) {
    o.out << "dropped " << message_id << "; ordering key " << shell_quote(key) << " is no longer held\n";
  } else {
    o.out << "dropped " << message_id << "; replay the key's dead letters from " << left->front() << " on ("
          << left->size() << " parked)\n";
  }
  return kExitOk;
}

int run_holds_forget(StoreKeyHolds& holds, const std::string& key, const Output& o) {
  auto forgot = holds.forget(key);
  if (!forgot) return store_error(o, forgot.error());
  if (!*forgot) return error(o, kExitFailure, not_held(key));
  o.out << "ordering key " << shell_quote(key)
        << " is no longer held; its parked messages, if replayed, run as they come\n";
  return kExitOk;
}

void register_holds(CLI::App& app) {
  struct Args {
    std::string url;
    std::string consumer;
    std::string key;
    std::string message_id;
    bool json = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* holds = app.add_subcommand(
      "holds", "Keys a consumer (ordering = key) holds behind a dead letter: list, show, drop, forget");
  holds->group("Store (operators)");
  holds->require_subcommand(1);
  const auto output = [args] { return Output{std::cout, std::cerr, args->json}; };
  const auto command = [&](std::string name, std::string description) {
    CLI::App* cmd = holds->add_subcommand(std::move(name), std::move(description));
    cmd->add_option("--store", args->url, "the consumer's store URL (default: $IDEM_STORE)")
        ->envname("IDEM_STORE")
        ->required();
    cmd->add_option("--consumer", args->consumer, "the consumer's name (idem-consume: its name setting)")
        ->required();
    cmd->add_flag("--json", args->json, "print JSON (one line) instead of text");
    return cmd;
  };

  command("list", "The held keys: how many messages each has parked, and the first")->callback([args, output] {
    OpenedStore s = open_store_or_fail(args->url);
    finish(run_holds_list(*s.admin, args->consumer, output()));
  });
  CLI::App* show = command("show", "One held key's parked message ids, in the order to replay them");
  show->add_option("key", args->key, "the ordering key")->required();
  show->callback([args, output] {
    OpenedStore s = open_store_or_fail(args->url);
    StoreKeyHolds h(*s.store, args->consumer);
    finish(run_holds_show(h, args->key, output()));
  });
  CLI::App* drop = command("drop", "Drop a held key's first parked message (it will not run); the next may");
  drop->add_option("key", args->key, "the ordering key")->required();
  drop->add_option("message_id", args->message_id, "the first parked message's id (holds show)")->required();
  drop->callback([args, output] {
    OpenedStore s = open_store_or_fail(args->url);
    StoreKeyHolds h(*s.store, args->consumer);
    finish(run_holds_drop(h, args->key, args->message_id, output()));
  });
  CLI::App* forget = command("forget", "Stop holding a key: its parked messages run as they come when replayed");
  forget->add_option("key", args->key, "the ordering key")->required();
  forget->callback([args, output] {
    OpenedStore s = open_store_or_fail(args->url);
    StoreKeyHolds h(*s.store, args->consumer);
    finish(run_holds_forget(h, args->key, output()));
  });
}

}  // namespace idem::cli
