// Secret files: checked and read on the opened descriptor, so a file swapped in between the
// check and the read cannot slip through (as core/src/encryption.cpp reads the key file).
#include "idem/webhook/secret_file.hpp"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string_view>

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
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::unexpected(path + ": cannot read the secret file: " + std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) return std::unexpected(path + ": cannot read the secret file: " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return std::unexpected(path + ": the secret file is not a regular file");
  if ((st.st_mode & (S_IROTH | S_IWOTH | S_IWGRP)) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return std::unexpected(path + ": the secret file's mode " + mode +
                           " lets other users read or change it; chmod 600 (or 640 for the service's group)");
  }
  if (static_cast<std::uint64_t>(st.st_size) > kMaxSecretFile) {
    return std::unexpected(path + ": the secret file is larger than 64 KiB; is it the right file?");
  }
  std::string text(static_cast<std::size_t>(st.st_size), '\0');
  std::size_t got = 0;
  while (got < text.size()) {
    const ssize_t n = ::read(fd, text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      OPENSSL_cleanse(text.data(), text.size());
      return std::unexpected(path + ": cannot read the secret file: " + std::strerror(errno));
    }
    if (n == 0) break;
    got += static_cast<std::size_t>(n);
  }
  text.resize(got);
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
