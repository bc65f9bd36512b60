// Secret files: read by read_private_file (as the [encryption] key file is), one secret a line.
#include "idem/webhook/secret_file.hpp"

#include <openssl/crypto.h>

#include <string_view>

#include "idem/private_file.hpp"

namespace idem::webhook {
namespace {

constexpr std::size_t kMaxSecretFile = 64 * 1024;

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

}  // namespace

std::expected<std::vector<std::string>, std::string> read_secret_file(const std::string& path) {
  auto read = read_private_file(path, "secret file", kMaxSecretFile, "64 KiB");
  if (!read) return std::unexpected(std::move(read.error()));
  std::string& text = *read;
  std::vector<std::string> secrets;
  std::string_view rest = text;
  while (!rest.empty()) {
    const std::size_t eol = rest.find('\n');
    std::string_view line = rest.substr(0, eol);
    rest = eol == std::string_view::npos ? std::string_view() : rest.substr(eol + 1);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    line = trim(line);
    if (!line.empty()) secrets.emplace_back(line);
  }
  OPENSSL_cleanse(text.data(), text.size());
  if (secrets.empty()) return std::unexpected(path + ": the secret file holds no secret");
  return secrets;
}

std::expected<std::vector<std::string>, std::string> read_secret_files(const std::vector<std::string>& paths) {
  std::vector<std::string> all;
  for (const auto& path : paths) {
    auto read = read_secret_file(path);
    if (!read) {
      wipe(all);
      return std::unexpected(read.error());
    }
    // Moved, not copied: a copy would leave the bytes in a buffer nobody wipes.
    for (auto& s : *read) all.push_back(std::move(s));
  }
  return all;
}

void wipe(std::vector<std::string>& secrets) {
  for (auto& s : secrets) OPENSSL_cleanse(s.data(), s.size());
  secrets.clear();
}

}  // namespace idem::webhook
