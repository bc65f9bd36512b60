#pragma once

// The sidecars' command lines: one `--key` flag per setting, given as text, over the file's values.

#include <CLI/CLI.hpp>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "idem/sidecar/settings.hpp"

namespace idem::sidecar {

/// Adds `--config` and a `--KEY` flag (flag_for) for each (key, help); after app.parse,
/// flags() returns what was given.
class FlagOptions {
 public:
  FlagOptions(CLI::App& app, const std::vector<std::pair<std::string, std::string>>& keys_and_help) : app_(app) {
    app.add_option("--config", config_, "TOML configuration file (flags override it)");
    for (const auto& [key, help] : keys_and_help) app.add_option(flag_for(key), values_[key], help);
  }

  Flags flags() const {
    Flags out;
    if (app_.count("--config")) out.config = config_;
    for (const auto& [key, value] : values_) {
      if (app_.count(flag_for(key))) out.settings.emplace_back(key, value);
    }
    return out;
  }

 private:
  CLI::App& app_;
  std::string config_;
  std::map<std::string, std::string> values_;
};

}  // namespace idem::sidecar
