// idemctl keys add, list, usage: making and rotating the keys that encrypt stored responses at rest
// (docs/security.md), without ever printing one.

#include <CLI/CLI.hpp>

#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <string>

#include "commands.hpp"
#include "idem/open_store.hpp"
#include "key_commands.hpp"

namespace idem::cli {
namespace {

constexpr std::string_view kPlaintext = "(plaintext)";
constexpr std::string_view kUnreadableMarker = "(unreadable marker)";

std::string role_of(const KeyRing& keys, const KeyInfo& key) {
  if (key.decrypt_only) return "decrypt-only";
  const std::string* sealing = keys.sealing_key_id();
  return sealing != nullptr && *sealing == key.id ? "encrypts" : "decrypts";
}

struct Usage {
  std::uint64_t live = 0;
  std::uint64_t expired = 0;
};

}  // namespace

int run_keys_list(const KeyRing& keys, const std::string& path, const Output& o) {
  if (o.json) {
    nlohmann::json list = nlohmann::json::array();
    for (const KeyInfo& k : keys.keys()) list.push_back({{"key_id", k.id}, {"role", role_of(keys, k)}, {"check", k.check}});
    const std::string* sealing = keys.sealing_key_id();
    write_json(o.out, {{"key_file", path},
                       {"keys", std::move(list)},
                       {"encrypts_with", sealing != nullptr ? nlohmann::json(*sealing) : nlohmann::json(nullptr)}});
    return kExitOk;
  }
  o.out << pad("KEY ID", 24) << pad("ROLE", 14) << "CHECK\n";
  for (const KeyInfo& k : keys.keys()) o.out << pad(k.id, 24) << pad(role_of(keys, k), 14) << k.check << '\n';
  if (keys.sealing_key_id() == nullptr) {
    error(o, kExitOk, "every key is decrypt-only: new records are stored unencrypted");
  }
  return kExitOk;
}

int run_keys_usage(StoreAdmin& admin, const KeyRing* keys, TimePoint now, const Output& o) {
  std::map<std::string, Usage> by_key;  // key id -> records (ordered: stable output)
  Usage plaintext;
  std::uint64_t scanned = 0;
  ListQuery query;
  query.limit = 1000;
  for (;;) {
    auto page = wait_for<std::vector<Record>>([&](auto cb) { admin.list(query, std::move(cb)); });
    if (!page) {
      return error(o, kExitFailure,
                   "store error (" + std::string(to_string(page.error().code)) + "): " + page.error().message);
    }
    for (const Record& r : *page) {
      ++scanned;
      if (!r.response) continue;
      Usage& u = !is_sealed(*r.response) ? plaintext
                                         : by_key[std::string(sealed_key_id(*r.response).value_or(kUnreadableMarker))];
      ++(r.expires <= now ? u.expired : u.live);
    }
    if (page->size() < query.limit) break;
    query.after = RecordId{page->back().tenant, page->back().key};
  }
  if (keys != nullptr) {
    for (const KeyInfo& k : keys->keys()) by_key.try_emplace(k.id);  // listed keys no record uses: 0
  }

  // What an operator should know: keys missing for live records, keys no live record needs.
  // Only keys listed before the one that encrypts are old: a decrypt-only key after it is the
  // next one, being rolled out, and holds no record yet for that reason.
  std::vector<std::string> missing, removable;
  if (keys != nullptr) {
    for (const auto& [id, u] : by_key) {
      if (u.live > 0 && !keys->contains(id)) missing.push_back(id);
    }
    const std::string* sealing = keys->sealing_key_id();
    for (const KeyInfo& k : keys->keys()) {
      if (sealing != nullptr && k.id == *sealing) break;
      if (by_key[k.id].live == 0) removable.push_back(k.id);
    }
  }
  if (o.json) {
    nlohmann::json list = nlohmann::json::array();
    for (const auto& [id, u] : by_key) {
      nlohmann::json k{{"key_id", id}, {"live", u.live}, {"expired", u.expired}};
      if (keys != nullptr) {
        k["in_key_file"] = keys->contains(id);
        k["role"] = nullptr;
        for (const KeyInfo& info : keys->keys()) {
          if (info.id == id) k["role"] = role_of(*keys, info);
        }
      }
      list.push_back(std::move(k));
    }
    write_json(o.out, {{"records_scanned", scanned},
                       {"plaintext", {{"live", plaintext.live}, {"expired", plaintext.expired}}},
                       {"keys", std::move(list)},
                       {"removable", removable},
                       {"missing", missing}});
  } else {
    o.out << pad("KEY ID", 24) << pad("LIVE", 10) << pad("EXPIRED", 10) << (keys != nullptr ? "KEY FILE" : "") << '\n';
    o.out << pad(std::string(kPlaintext), 24) << pad(std::to_string(plaintext.live), 10)
          << pad(std::to_string(plaintext.expired), 10) << (keys != nullptr ? "-" : "") << '\n';
    for (const auto& [id, u] : by_key) {
      std::string file;
      if (keys != nullptr) {
        file = "MISSING";
        for (const KeyInfo& info : keys->keys()) {
          if (info.id == id) file = role_of(*keys, info);
        }
      }
      o.out << pad(id, 24) << pad(std::to_string(u.live), 10) << pad(std::to_string(u.expired), 10) << file << '\n';
    }
    o.out << scanned << " record" << (scanned == 1 ? "" : "s") << " scanned\n";
    for (const std::string& id : removable) {
      error(o, kExitOk, "key " + json_quoted(id) + " holds no live record: it may be removed from the key file "
                            "once every replica encrypts with another key");
    }
  }
  for (const std::string& id : missing) {
    error(o, kExitOk, std::to_string(by_key[id].live) + " live record(s) use key id " + json_quoted(id) +
                          ", which the key file does not list: they are answered 500 idempotency_record_unreadable");
  }
  return kExitOk;
}

namespace {

struct KeysArgs {
  std::string key_file;
  std::string id;
  bool decrypt_only = false;
  std::string url;
  bool json = false;
};

std::shared_ptr<const KeyRing> load_or_fail(const std::string& path) {
  auto keys = KeyRing::load(path);
  if (!keys) fail(kExitUsage, "--key-file: " + keys.error());
  return *keys;
}

}  // namespace

void register_keys(CLI::App& app) {
  auto args = std::make_shared<KeysArgs>();
  const auto output = [args] { return Output{std::cout, std::cerr, args->json}; };
  CLI::App* keys = app.add_subcommand("keys", "Encryption keys of stored responses: add, list, usage");
  keys->group("Encryption (operators)");
  keys->require_subcommand(1);
  keys->footer(
      "Rotation (docs/security.md): keys add --decrypt-only, restart every replica; drop\n"
      "decrypt-only from the new line, restart every replica; keys usage until the old key holds no\n"
      "live record, then remove its line.");

  CLI::App* add = keys->add_subcommand("add", "Append a new random key to the key file (created 0600 if missing)");
  add->add_option("--key-file", args->key_file, "the key file (default: $IDEM_KEY_FILE)")
      ->envname("IDEM_KEY_FILE")
      ->required();
  add->add_option("--id", args->id, "the new key's id (default: today's UTC date, e.g. 2025-01-31)");
  add->add_flag("--decrypt-only", args->decrypt_only,
                "only decrypt with it for now: the first step of a rotation across several replicas");
  add->add_flag("--json", args->json, "print JSON (one line) instead of text");
  add->callback([args, output] {
    auto added = add_key_to_file(args->key_file, args->id, args->decrypt_only);
    if (!added) fail(kExitFailure, added.error());
    const Output o = output();
    if (o.json) {
      write_json(o.out, {{"key_file", args->key_file},
                         {"key_id", added->id},
                         {"decrypt_only", added->decrypt_only},
                         {"check", added->check}});
    } else {
      o.out << "added key " << json_quoted(added->id) << " (check " << added->check << ") to " << args->key_file
            << (added->decrypt_only
                    ? ": it decrypts only; remove \"decrypt-only\" from its line once every replica has it"
                    : ": it encrypts new records once the gateways restart")
            << '\n';
    }
    finish(kExitOk);
  });

  CLI::App* list = keys->add_subcommand("list", "List the key file's keys: id, role, check value (never the key)");
  list->add_option("--key-file", args->key_file, "the key file (default: $IDEM_KEY_FILE)")
      ->envname("IDEM_KEY_FILE")
      ->required();
  list->add_flag("--json", args->json, "print JSON (one line) instead of text");
  list->callback([args, output] { finish(run_keys_list(*load_or_fail(args->key_file), args->key_file, output())); });

  CLI::App* usage = keys->add_subcommand("usage", "Count a store's records by the key id that encrypted them");
  usage->add_option("--store", args->url, "store URL (default: $IDEM_STORE)")->envname("IDEM_STORE")->required();
  usage->add_option("--key-file", args->key_file,
                    "the key file (default: $IDEM_KEY_FILE): marks which ids it lists and which may go")
      ->envname("IDEM_KEY_FILE");
  usage->add_flag("--json", args->json, "print JSON (one line) instead of text");
  usage->callback([args, output] {
    const auto keys = args->key_file.empty() ? nullptr : load_or_fail(args->key_file);
    if (auto problem = check_store_url(args->url)) fail(kExitUsage, "--store: " + *problem);
    if (const auto path = sqlite_path_of(args->url); path && !std::filesystem::exists(*path)) {
      fail(kExitFailure, "cannot open store " + redact_url(args->url) + ": " + *path + " does not exist");
    }
    auto opened = open_store(args->url);
    if (!opened) fail(kExitFailure, "cannot open store " + redact_url(args->url) + ": " + opened.error().message);
    finish(run_keys_usage(*opened->admin, keys.get(), SystemClock::instance().now(), output()));
  });
}

}  // namespace idem::cli
