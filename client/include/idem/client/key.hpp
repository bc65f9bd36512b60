#pragma once

#include <expected>
#include <string>
#include <string_view>

namespace idem::client {

/// A fresh idempotency key: a random UUID (RFC 4122 version 4, lowercase, 36 characters) from
/// OpenSSL's CSPRNG. Fails only if the CSPRNG cannot be seeded; the error says why.
std::expected<std::string, std::string> new_key();

/// Whether `s` is a lowercase or uppercase RFC 4122 version-4 UUID in the 8-4-4-4-12 form.
bool is_uuid_v4(std::string_view s);

}  // namespace idem::client
