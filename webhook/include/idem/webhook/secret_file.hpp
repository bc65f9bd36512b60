#pragma once

// Webhook secrets live in files only their service's user can read (docs/webhooks.md): one
// secret per line. Read by idem-gateway (verifying) and by idem-relay and idem-consume (signing).

#include <expected>
#include <string>
#include <vector>

namespace idem::webhook {

/// The secrets of one file: one per line, trimmed, blank lines skipped. The file must be a
/// regular file that other users can neither read nor write, nor its group write (0600, or 0640
/// for the service's group), checked on the opened descriptor like the [encryption] key file; at
/// most 64 KiB; at least one secret. The error names the file and what is wrong with it, never
/// its contents. The read buffer is wiped; the caller should wipe the secrets when done.
std::expected<std::vector<std::string>, std::string> read_secret_file(const std::string& path);

/// Every secret of every file, in order (the first error stops).
std::expected<std::vector<std::string>, std::string> read_secret_files(const std::vector<std::string>& paths);

/// Overwrites each secret's bytes (OPENSSL_cleanse, which the compiler cannot drop) and clears.
void wipe(std::vector<std::string>& secrets);

}  // namespace idem::webhook
