// parse_sqs_url: sqs+https://[KEY_ID:SECRET@]HOST[:PORT]/ACCOUNT/QUEUE[?PARAMETERS]. No message
// here quotes the userinfo or the token: a mistyped URL's secret must not reach a log, so errors
// name the part that is wrong, and the URL they are prefixed with went through redact_url (which
// hides the userinfo's password and every `token=`).

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdlib>
#include <optional>
#include <set>

#include "idem/redact.hpp"
#include "idem/sqs_broker.hpp"
#include "idem/url_decode.hpp"
#include "protocol.hpp"

namespace idem {
namespace {

using sqs_detail::kMaxQueueName;
using sqs_detail::queue_name_problem;

bool visible_ascii(std::string_view text) {
  return std::all_of(text.begin(), text.end(), [](char c) { return c > ' ' && c < 127; });
}

std::string env(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? std::string() : std::string(value);
}

std::optional<std::string> account_problem(std::string_view account) {
  if (account.empty()) return std::string("the account (the path's first segment) is empty");
  const bool legal = std::all_of(account.begin(), account.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_';
  });
  if (!legal) return "the account \"" + std::string(account) + "\" is not an account id (AWS: 12 digits)";
  return std::nullopt;
}

struct Authority {
  std::string host;
  int port = 0;
};

std::expected<Authority, std::string> parse_host_port(std::string_view text) {
  Authority out;
  std::string_view host = text, port;
  if (text.starts_with('[')) {  // [IPv6]:port
    const auto close = text.find(']');
    if (close == std::string_view::npos) return std::unexpected("unclosed '[' in the host");
    host = text.substr(0, close + 1);
    const std::string_view rest = text.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') return std::unexpected("junk after the IPv6 address " + std::string(host));
      port = rest.substr(1);
      if (port.empty()) return std::unexpected("empty port after ':'");
    }
    if (host.size() <= 2) return std::unexpected("an empty IPv6 address");
  } else if (const auto colon = text.rfind(':'); colon != std::string_view::npos) {
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
    if (port.empty()) return std::unexpected("empty port after ':'");
  }
  if (host.empty()) return std::unexpected("no host: give sqs+https://HOST[:PORT]/ACCOUNT_ID/QUEUE_NAME");
  if (!visible_ascii(host) || host.find_first_of("/?#@,%") != std::string_view::npos) {
    return std::unexpected("bad host \"" + std::string(host) + "\"");
  }
  out.host = std::string(host);
  if (!port.empty()) {
    int value = 0;
    auto [ptr, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
    if (ec != std::errc{} || ptr != port.data() + port.size() || value <= 0 || value > 65535) {
      return std::unexpected("bad port \"" + std::string(port) + "\": give a number 1-65535");
    }
    out.port = value;
  }
  return out;
}

std::expected<std::chrono::seconds, std::string> parse_seconds(std::string_view name, std::string_view value, std::int64_t min,
                                                               std::int64_t max) {
  std::int64_t s = 0;
  auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), s);
  if (value.empty() || ec != std::errc{} || ptr != value.data() + value.size() || s < min || s > max) {
    return std::unexpected(std::string(name) + "=" + std::string(value) + ": give whole seconds, " + std::to_string(min) + "-" +
                           std::to_string(max));
  }
  return std::chrono::seconds(s);
}

std::string lower(std::string_view text) {
  std::string out(text);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

// The region an AWS SQS host names: sqs.REGION.amazonaws.com[.cn], sqs-fips.REGION.amazonaws.com,
// sqs.REGION.api.aws, REGION.queue.amazonaws.com, and queue.amazonaws.com (us-east-1).
std::optional<std::string> region_of_host(std::string_view host_in) {
  const std::string host = lower(host_in);
  auto between = [&](std::string_view prefix, std::string_view suffix) -> std::optional<std::string> {
    if (host.size() <= prefix.size() + suffix.size() || !host.starts_with(prefix) || !host.ends_with(suffix)) return std::nullopt;
    std::string region = host.substr(prefix.size(), host.size() - prefix.size() - suffix.size());
    if (region.empty() || region.find('.') != std::string::npos) return std::nullopt;
    return region;
  };
  if (host == "queue.amazonaws.com") return std::string("us-east-1");
  for (std::string_view suffix : {".amazonaws.com", ".amazonaws.com.cn", ".api.aws"}) {
    for (std::string_view prefix : {"sqs.", "sqs-fips."}) {
      if (auto r = between(prefix, suffix)) return r;
    }
  }
  if (auto r = between("", ".queue.amazonaws.com")) return r;
  return std::nullopt;
}

bool valid_region(std::string_view region) {
  return !region.empty() && region.size() <= 64 && std::all_of(region.begin(), region.end(), [](char c) {
    return std::islower(static_cast<unsigned char>(c)) || std::isdigit(static_cast<unsigned char>(c)) || c == '-';
  });
}

// A dead-letter queue given as a URL: http(s)://HOST[:PORT]/ACCOUNT/NAME.
std::expected<std::pair<std::string, std::string>, std::string> parse_queue_url(std::string_view url) {
  std::string_view rest;
  if (url.starts_with("https://")) {
    rest = url.substr(8);
  } else if (url.starts_with("http://")) {
    rest = url.substr(7);
  } else {
    return std::unexpected("dead_letter: give a queue name or a queue URL http(s)://HOST/ACCOUNT_ID/NAME");
  }
  if (rest.find_first_of("?#@") != std::string_view::npos) {
    return std::unexpected("dead_letter: a queue URL has no user, query or fragment");
  }
  const auto slash = rest.find('/');
  if (slash == std::string_view::npos) return std::unexpected("dead_letter: the queue URL has no path /ACCOUNT_ID/NAME");
  if (auto hp = parse_host_port(rest.substr(0, slash)); !hp) return std::unexpected("dead_letter: " + hp.error());
  const std::string_view path = rest.substr(slash + 1);
  const auto second = path.find('/');
  if (second == std::string_view::npos || path.find('/', second + 1) != std::string_view::npos) {
    return std::unexpected("dead_letter: the queue URL's path must be /ACCOUNT_ID/NAME");
  }
  if (auto problem = account_problem(path.substr(0, second))) return std::unexpected("dead_letter: " + *problem);
  const std::string_view name = path.substr(second + 1);
  if (auto problem = queue_name_problem(name, "the dead-letter queue's name")) return std::unexpected(*problem);
  return std::pair<std::string, std::string>{std::string(url), std::string(name)};
}

const std::set<std::string, std::less<>>& source_only() {
  static const std::set<std::string, std::less<>> names = {"dead_letter", "visibility_timeout", "wait_seconds"};
  return names;
}

std::expected<SqsUrl, std::string> parse(std::string_view url, SqsUrlRole role) {
  SqsUrl out;
  std::string_view rest;
  if (url.starts_with("sqs+https://")) {
    rest = url.substr(12);
  } else if (url.starts_with("sqs+http://")) {
    out.https = false;
    rest = url.substr(11);
  } else {
    return std::unexpected("the URL must start with sqs+https:// (or sqs+http:// for a local emulator)");
  }
  if (rest.find('#') != std::string_view::npos) {
    return std::unexpected("a fragment ('#') has no meaning here; percent-encode '#' as %23");
  }
  std::string_view query;
  if (const auto q = rest.find('?'); q != std::string_view::npos) {
    query = rest.substr(q + 1);
    rest = rest.substr(0, q);
  }
  const auto slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  const std::string_view path = slash == std::string_view::npos ? std::string_view{} : rest.substr(slash + 1);
  // An '@' after the host means a secret with a raw '/' or '?' in it: say so rather than parse
  // half of it as the path (and quote it in the error).
  if (path.find('@') != std::string_view::npos && authority.find('@') == std::string_view::npos) {
    return std::unexpected("'@' after the host: percent-encode '/', '?' and '@' in the key id and secret (%2F, %3F, %40)");
  }

  bool userinfo_given = false;
  if (const auto at = authority.rfind('@'); at != std::string_view::npos) {
    const std::string_view userinfo = authority.substr(0, at);
    authority = authority.substr(at + 1);
    const auto colon = userinfo.find(':');
    if (colon == std::string_view::npos) {
      return std::unexpected("credentials in the URL need both parts: ACCESS_KEY_ID:SECRET_ACCESS_KEY@");
    }
    auto user = percent_decode(userinfo.substr(0, colon), "access key id");
    if (!user) return std::unexpected(user.error());
    auto password = percent_decode(userinfo.substr(colon + 1), "secret access key");
    if (!password) return std::unexpected(password.error());
    if (user->empty() || password->empty()) {
      return std::unexpected("credentials in the URL need both parts: ACCESS_KEY_ID:SECRET_ACCESS_KEY@");
    }
    if (!visible_ascii(*user)) return std::unexpected("the access key id has characters no key id has");
    // Never quoted: the secret goes into curl's user:password only.
    if (password->find_first_of(std::string_view("\0\r\n", 3)) != std::string::npos) {
      return std::unexpected("the secret access key cannot contain NUL, CR or LF");
    }
    out.access_key_id = std::move(*user);
    out.secret_access_key = std::move(*password);
    userinfo_given = true;
  }

  auto hp = parse_host_port(authority);
  if (!hp) return std::unexpected(hp.error());
  out.host = std::move(hp->host);
  out.port = hp->port;

  const auto second = path.find('/');
  if (path.empty() || second == std::string_view::npos || path.find('/', second + 1) != std::string_view::npos) {
    return std::unexpected("the path must be the queue's: /ACCOUNT_ID/QUEUE_NAME");
  }
  if (auto problem = account_problem(path.substr(0, second))) return std::unexpected(*problem);
  out.account = std::string(path.substr(0, second));
  if (auto problem = queue_name_problem(path.substr(second + 1), "the queue name")) return std::unexpected(*problem);
  out.queue = std::string(path.substr(second + 1));

  bool token_given = false;
  std::string dead_letter;
  auto parameters = query_parameters(query);
  if (!parameters) return std::unexpected(parameters.error());
  for (auto& [name, value] : *parameters) {
    if (!visible_ascii(name)) return std::unexpected("a parameter name with spaces or control characters");
    if (role == SqsUrlRole::sink && source_only().contains(name)) {
      return std::unexpected("parameter " + name + " is for source URLs; a sink takes region, token and id_attribute");
    }
    if (name == "region") {
      if (!valid_region(value)) return std::unexpected("region=" + value + ": give an AWS region such as eu-west-1");
      out.region = std::move(value);
    } else if (name == "token") {
      if (value.empty()) return std::unexpected("parameter token is empty");
      if (!visible_ascii(value)) return std::unexpected("the token has characters no session token has");
      out.session_token = std::move(value);
      token_given = true;
    } else if (name == "id_attribute") {
      if (value.empty() || value.size() > 256 || !visible_ascii(value)) {
        return std::unexpected("id_attribute=" + value + ": give a message attribute name");
      }
      out.id_attribute = std::move(value);
    } else if (name == "dead_letter") {
      if (value.empty()) return std::unexpected("parameter dead_letter is empty");
      dead_letter = std::move(value);
    } else if (name == "visibility_timeout") {
      auto s = parse_seconds(name, value, 2, 43200);
      if (!s) return std::unexpected(s.error());
      out.visibility_timeout = *s;
    } else if (name == "wait_seconds") {
      auto s = parse_seconds(name, value, 1, 20);
      if (!s) return std::unexpected(s.error());
      out.wait_seconds = *s;
    } else {
      return std::unexpected("unknown parameter " + name);
    }
  }

  // Region: the parameter, else an AWS host's, else the environment's. What the environment
  // lacks is not the URL's fault: missing() tells, and opening fails with it.
  const auto host_region = region_of_host(out.host);
  if (!out.region.empty() && host_region && *host_region != out.region) {
    return std::unexpected("region=" + out.region + " but the host " + out.host + " is in " + *host_region +
                           " (SQS would refuse the signature)");
  }
  if (out.region.empty() && host_region) out.region = *host_region;
  if (out.region.empty()) out.region = env("AWS_REGION");
  if (out.region.empty()) out.region = env("AWS_DEFAULT_REGION");

  // Credentials: the URL's, else the environment's (with its session token).
  if (!userinfo_given) {
    out.access_key_id = env("AWS_ACCESS_KEY_ID");
    out.secret_access_key = env("AWS_SECRET_ACCESS_KEY");
    if (!token_given) out.session_token = env("AWS_SESSION_TOKEN");
  }

  if (role == SqsUrlRole::source) {
    if (dead_letter.empty()) {
      std::string base = out.queue;
      const bool fifo = base.ends_with(".fifo");
      if (fifo) base.resize(base.size() - 5);
      out.dead_letter_queue = base + "-dead-letter" + (fifo ? ".fifo" : "");
      if (out.dead_letter_queue.size() > kMaxQueueName) {
        return std::unexpected("the default dead-letter queue (QUEUE-dead-letter) is longer than 80 characters: name one "
                               "with dead_letter=");
      }
      out.dead_letter_url = out.endpoint() + out.account + "/" + out.dead_letter_queue;
    } else if (dead_letter.find("://") != std::string::npos) {
      auto parsed = parse_queue_url(dead_letter);
      if (!parsed) return std::unexpected(parsed.error());
      out.dead_letter_url = std::move(parsed->first);
      out.dead_letter_queue = std::move(parsed->second);
    } else {
      if (auto problem = queue_name_problem(dead_letter, "dead_letter")) return std::unexpected(*problem);
      out.dead_letter_queue = dead_letter;
      out.dead_letter_url = out.endpoint() + out.account + "/" + dead_letter;
    }
    if (out.dead_letter_url == out.queue_url()) return std::unexpected("dead_letter cannot be the queue consumed");
  }
  return out;
}

}  // namespace

std::string SqsUrl::endpoint() const {
  std::string out = https ? "https://" : "http://";
  out += host;
  if (port != 0) out.append(1, ':').append(std::to_string(port));
  return out + "/";
}

std::string SqsUrl::queue_url() const { return endpoint() + account + "/" + queue; }

bool SqsUrl::fifo() const { return queue.ends_with(".fifo"); }

std::optional<std::string> SqsUrl::missing() const {
  if (region.empty()) {
    return "no region: give ?region=REGION, or set AWS_REGION (the host " + host + " is not an sqs.REGION.amazonaws.com one)";
  }
  if (!valid_region(region)) return std::string("AWS_REGION / AWS_DEFAULT_REGION is not a region name");
  if (access_key_id.empty() || secret_access_key.empty()) {
    return std::string("no AWS credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or give "
                       "ACCESS_KEY_ID:SECRET_ACCESS_KEY@ in the URL");
  }
  if (!visible_ascii(access_key_id)) return std::string("AWS_ACCESS_KEY_ID has characters no key id has");
  if (secret_access_key.find_first_of(std::string_view("\0\r\n", 3)) != std::string::npos) {
    return std::string("AWS_SECRET_ACCESS_KEY cannot contain NUL, CR or LF");
  }
  if (!visible_ascii(session_token)) return std::string("AWS_SESSION_TOKEN has characters no session token has");
  return std::nullopt;
}

BrokerResult<SqsUrl> parse_complete_sqs_url(std::string_view url, SqsUrlRole role) {
  auto parsed = parse_sqs_url(url, role);
  if (!parsed) return parsed;
  if (auto problem = parsed->missing()) {
    return std::unexpected(BrokerError{BrokerErrc::invalid, redact_url(url) + ": " + *problem, false});
  }
  return parsed;
}

BrokerResult<SqsUrl> parse_sqs_url(std::string_view url, SqsUrlRole role) {
  auto parsed = parse(url, role);
  if (!parsed) return std::unexpected(BrokerError{BrokerErrc::invalid, redact_url(url) + ": " + parsed.error(), false});
  return std::move(*parsed);
}

}  // namespace idem
