#include "idem/sidecar/settings.hpp"

#include <toml++/toml.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdint>
#include <fstream>
#include <limits>
#include <sstream>

namespace idem::sidecar {
namespace {

// Appended, not "\"" + std::string(s): GCC 12 at -O3 warns on that (a false -Wrestrict).
std::string quoted(std::string_view s) { return std::string(1, '"').append(s).append(1, '"'); }

std::string type_name(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a float";
    case toml::node_type::boolean: return "a boolean";
    case toml::node_type::table: return "a table";
    case toml::node_type::array: return "an array";
    default: return "a date/time";
  }
}

std::int64_t parse_integer(std::string_view text) {
  std::int64_t value = 0;
  bool any = false;
  bool negative = false;
  std::size_t i = 0;
  if (!text.empty() && text[0] == '-') {
    negative = true;
    i = 1;
  }
  for (; i < text.size(); ++i) {
    if (text[i] < '0' || text[i] > '9' || value > (INT64_MAX - 9) / 10) throw ConfigError("not an integer");
    value = value * 10 + (text[i] - '0');
    any = true;
  }
  if (!any) throw ConfigError("not an integer");
  return negative ? -value : value;
}

}  // namespace

std::string flag_for(std::string_view key) {
  std::string flag = "--" + std::string(key);
  for (char& ch : flag) ch = ch == '_' ? '-' : ch;
  return flag;
}

std::string host_and_pid() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0 || host[0] == '\0') std::snprintf(host, sizeof host, "localhost");
  return std::string(host) + "-" + std::to_string(::getpid());
}

void Settings::add(std::string key, Key k) { keys_[std::move(key)] = std::move(k); }

void Settings::text(std::string key, std::string& target, bool secret) {
  Key k{Key::Kind::text, [&target](const std::string& t) {
          if (t.empty()) throw ConfigError("must not be empty");
          target = t;
        }, {}, {}, secret};
  add(std::move(key), std::move(k));
}

void Settings::duration(std::string key, Millis& target, bool allow_zero) {
  add(std::move(key), Key{Key::Kind::duration, [&target, allow_zero](const std::string& t) {
                            const Millis v = gateway::parse_duration(t);
                            if (!allow_zero && v.count() == 0) throw ConfigError("must be longer than 0");
                            target = v;
                          }, {}, {}, false});
}

void Settings::size(std::string key, std::size_t& target, std::uint64_t min) {
  auto set = [&target, min](std::uint64_t v) {
    if (v < min) throw ConfigError("must be at least " + std::to_string(min) + " bytes");
    if (v > std::numeric_limits<std::size_t>::max() / 2) throw ConfigError("too large");
    target = static_cast<std::size_t>(v);
  };
  add(std::move(key), Key{Key::Kind::size, [set](const std::string& t) { set(gateway::parse_size(t)); },
                          [set](std::int64_t v) {
                            if (v < 0) throw ConfigError("must not be negative");
                            set(static_cast<std::uint64_t>(v));
                          },
                          {}, false});
}

void Settings::integer(std::string key, std::int64_t min, std::int64_t max, std::function<void(std::int64_t)> set) {
  auto checked = [min, max, set](std::int64_t v) {
    if (v < min || v > max) {
      throw ConfigError(std::to_string(v) + " is outside " + std::to_string(min) + ".." + std::to_string(max));
    }
    set(v);
  };
  add(std::move(key), Key{Key::Kind::integer, [checked](const std::string& t) { checked(parse_integer(t)); }, checked,
                          {}, false});
}

void Settings::boolean(std::string key, bool& target) {
  add(std::move(key), Key{Key::Kind::boolean, [&target](const std::string& t) {
                            if (t == "true") {
                              target = true;
                            } else if (t == "false") {
                              target = false;
                            } else {
                              throw ConfigError("expected true or false");
                            }
                          },
                          {}, [&target](bool b) { target = b; }, false});
}

void Settings::choice(std::string key, std::vector<std::string> choices, std::function<void(const std::string&)> set) {
  add(std::move(key), Key{Key::Kind::choice, [choices, set](const std::string& t) {
                            if (std::find(choices.begin(), choices.end(), t) == choices.end()) {
                              std::string list;
                              for (const auto& c : choices) list += (list.empty() ? "" : ", ") + quoted(c);
                              throw ConfigError("expected one of " + list);
                            }
                            set(t);
                          },
                          {}, {}, false});
}

void Settings::listen(std::string key, std::optional<ListenAddress>& target) {
  add(std::move(key), Key{Key::Kind::listen, [&target](const std::string& t) {
                            if (t == "off") {
                              target.reset();
                            } else {
                              target = gateway::parse_listen_address(t);
                            }
                          },
                          {}, {}, false});
}

void Settings::paths(std::string key, std::vector<std::string>& target) {
  auto set = [&target](const std::vector<std::string>& list) {
    if (list.empty()) throw ConfigError("expected at least one path");
    for (const auto& p : list) {
      if (p.empty()) throw ConfigError("a path must not be empty");
    }
    target = list;
  };
  Key k{Key::Kind::paths, [set](const std::string& t) {
          std::vector<std::string> list;
          for (std::string_view rest = t;;) {
            const auto comma = rest.find(',');
            list.emplace_back(rest.substr(0, comma));
            if (comma == std::string_view::npos) break;
            rest.remove_prefix(comma + 1);
          }
          set(list);
        }, {}, {}, false, set};
  add(std::move(key), std::move(k));
}

void Settings::read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(path + ": cannot read the file");
  std::ostringstream buffer;
  buffer << in.rdbuf();
  read_text(buffer.str(), path);
}

void Settings::read_text(std::string_view text, std::string_view source) {
  toml::table root;
  try {
    root = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    throw ConfigError(std::string(source) + ": " + std::string(e.description()) + " (line " +
                      std::to_string(e.source().begin.line) + ")");
  }
  for (const auto& [name, node] : root) {
    const std::string key(name.str());
    auto fail = [&](const std::string& message) -> ConfigError {
      std::string text = std::string(source) + ": " + key + ": " + message;
      if (node.source().begin.line > 0) text += " (line " + std::to_string(node.source().begin.line) + ")";
      return ConfigError(text);
    };
    const auto it = keys_.find(key);
    if (it == keys_.end()) throw fail("unknown key");
    const Key& k = it->second;
    try {
      if (const auto* s = node.as_string(); s && k.kind == Key::Kind::paths) {
        k.from_list({s->get()});  // a path as written, commas and all
      } else if (const auto* s = node.as_string()) {
        k.from_text(s->get());
      } else if (const auto* a = node.as_array(); a && k.from_list) {
        std::vector<std::string> list;
        for (const auto& item : *a) {
          const auto* one = item.as_string();
          if (!one) throw ConfigError("expected an array of strings, got " + type_name(item) + " in it");
          list.push_back(one->get());
        }
        k.from_list(list);
      } else if (const auto* i = node.as_integer(); i && k.from_integer) {
        k.from_integer(i->get());
      } else if (const auto* b = node.as_boolean(); b && k.from_bool) {
        k.from_bool(b->get());
      } else if (node.is_integer() && k.kind == Key::Kind::duration) {
        throw ConfigError("a duration needs a unit, e.g. \"30s\" (units ms, s, m, h, d)");
      } else {
        throw ConfigError("expected " + std::string(k.kind == Key::Kind::boolean ? "true or false"
                                                     : k.kind == Key::Kind::integer ? "an integer"
                                                     : k.kind == Key::Kind::size    ? "a size, e.g. \"1MiB\""
                                                     : k.kind == Key::Kind::paths   ? "a path or an array of paths"
                                                                                    : "a string") +
                          ", got " + type_name(node));
      }
    } catch (const ConfigError& e) {
      const auto* s = node.as_string();
      const std::string shown = s && !k.secret ? quoted(s->get()) + ": " : "";
      throw fail(shown + e.what());
    }
    given_[key] = true;
  }
}

void Settings::set_from_flag(const std::string& key, std::string_view flag, std::string_view value) {
  const auto it = keys_.find(key);
  if (it == keys_.end()) throw ConfigError(std::string(flag) + ": not a setting");
  try {
    it->second.from_text(std::string(value));
  } catch (const ConfigError& e) {
    const std::string shown = it->second.secret ? "" : quoted(value) + ": ";
    throw ConfigError(std::string(flag) + ": " + shown + e.what());
  }
  given_[key] = true;
}

}  // namespace idem::sidecar
