#include "idem/private_file.hpp"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>

namespace idem {

std::expected<std::string, std::string> read_private_file(const std::string& path, std::string_view what,
                                                          std::size_t max_size, std::string_view size_text) {
  const std::string the = "the " + std::string(what);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::unexpected(path + ": cannot read " + the + ": " + std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) return std::unexpected(path + ": cannot read " + the + ": " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return std::unexpected(path + ": " + the + " is not a regular file");
  // Checked on the opened file (not the name), so a file swapped in between cannot slip through.
  if ((st.st_mode & (S_IROTH | S_IWOTH | S_IWGRP)) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return std::unexpected(path + ": " + the + "'s mode " + mode +
                           " lets other users read or change it; chmod 600 (or 640 for the service's group)");
  }
  if (static_cast<std::uint64_t>(st.st_size) > max_size) {
    return std::unexpected(path + ": " + the + " is larger than " + std::string(size_text) +
                           "; is it the right file?");
  }
  std::string text(static_cast<std::size_t>(st.st_size), '\0');
  std::size_t got = 0;
  while (got < text.size()) {
    const ssize_t n = ::read(fd, text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      OPENSSL_cleanse(text.data(), text.size());
      return std::unexpected(path + ": cannot read " + the + ": " + std::strerror(errno));
    }
    if (n == 0) break;
    got += static_cast<std::size_t>(n);
  }
  text.resize(got);
  return text;
}

}  // namespace idem
