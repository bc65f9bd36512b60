#pragma once

// The one place that makes a URL safe to print (SPEC §12: secrets never appear in any output).
// Every URL that can carry a secret (store URLs, broker sources and sinks, outboxes, webhooks)
// goes through redact_url before it reaches a log line, an error message, a metric label or a
// health body.

#include <string>
#include <string_view>

namespace idem {

/// The URL with every secret it may carry replaced by "***":
///  - the password of the userinfo: `scheme://user:PASS@host` and `scheme://:PASS@host`; for
///    redis schemes a lone userinfo is the password (`redis://PASS@host`, as redis-cli reads it);
///    the userinfo is taken up to the last '@', so a password with a raw '@', '/' or '?' is
///    hidden whole;
///  - query parameters that name a secret, whatever their case: password, sslpassword, pass,
///    passwd, pwd, secret, token, access_token, auth, api_key, apikey (`?password=` is libpq's
///    keyword form), also in `key=value` lists separated by spaces or ';'.
/// Anything else (scheme, user name, hosts, ports, paths, other parameters) is kept, so the
/// line still says which server it was. Text without a scheme is checked for parameters only.
std::string redact_url(std::string_view url);

/// Free text (an error message, a command line) with every URL in it redacted as redact_url
/// does: each whitespace- or quote-delimited word holding "://" is one URL.
std::string redact_text(std::string_view text);

/// `text` (a library's error message about `url`) with every secret of `url` replaced by "***",
/// in the forms a library may echo: as written and percent-decoded. A second line of defence
/// for messages redact_url cannot see into (libpq quotes a malformed part of its URI, password
/// included). Secrets shorter than 3 bytes are left: replacing them would garble the message.
std::string scrub_secrets(std::string_view text, std::string_view url);

/// Whether a parameter of that name carries a secret (the names listed above, any case).
bool is_secret_parameter(std::string_view name);

}  // namespace idem
