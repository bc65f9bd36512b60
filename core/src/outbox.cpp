#include "idem/outbox.hpp"

#include <cstdint>
#include <unordered_set>
#include <utility>

#include "idem/consume_loop.hpp"  // message_id_problem: the same id rules as consumers apply

namespace idem {
namespace {

// Valid UTF-8 (no overlong forms, surrogates or code points past U+10FFFF) without NUL: what a
// PostgreSQL text or jsonb value and a JSON string can hold.
bool storable_text(std::string_view s) {
  std::size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c == 0) return false;
    if (c < 0x80) {
      ++i;
      continue;
    }
    std::size_t len = 0;
    std::uint32_t cp = 0;
    if ((c & 0xe0) == 0xc0) {
      len = 2;
      cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      len = 3;
      cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + len > s.size()) return false;
    for (std::size_t k = 1; k < len; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3f);
    }
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) || cp > 0x10ffff ||
        (cp >= 0xd800 && cp <= 0xdfff)) {
      return false;
    }
    i += len;
  }
  return true;
}

void append_json_string(std::string& out, std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  out += '"';
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          out += "\\u00";
          out += kHex[c >> 4];
          out += kHex[c & 0xf];
        } else {
          out += ch;
        }
    }
  }
  out += '"';
}

void append_utf8(std::string& out, std::uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xc0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xe0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  }
}

// Reads the one shape a headers column may have: {"name": "value", ...}. Written by hand because
// the core has no general JSON reader to share, and this shape needs none.
class HeadersReader {
 public:
  explicit HeadersReader(std::string_view in) : in_(in) {}

  std::expected<MessageHeaders, std::string> read() {
    // Raw bytes are copied as they are, so the text must be UTF-8 (as JSON text is) up front.
    if (!storable_text(in_)) return fail("it is not valid UTF-8 (or holds a NUL byte)");
    MessageHeaders headers;
    skip_blanks();
    if (!take('{')) return fail("it is not a JSON object");
    skip_blanks();
    if (!take('}')) {
      for (;;) {
        skip_blanks();
        auto name = string("a member name");
        if (!name) return std::unexpected(name.error());
        skip_blanks();
        if (!take(':')) return fail("a ':' is missing after a member name");
        skip_blanks();
        if (pos_ < in_.size() && in_[pos_] != '"') {
          return fail("the value of \"" + *name + "\" is not a string (every header value must be one)");
        }
        auto value = string("a value");
        if (!value) return std::unexpected(value.error());
        headers.emplace_back(std::move(*name), std::move(*value));
        skip_blanks();
        if (take(',')) continue;
        if (take('}')) break;
        return fail("a ',' or '}' is missing");
      }
    }
    skip_blanks();
    if (pos_ != in_.size()) return fail("there is text after the object");
    return headers;
  }

 private:
  std::unexpected<std::string> fail(std::string why) const {
    return std::unexpected("the headers are not a JSON object of strings: " + why + " (at byte " +
                           std::to_string(pos_) + ")");
  }
  void skip_blanks() {
    while (pos_ < in_.size() && (in_[pos_] == ' ' || in_[pos_] == '\t' || in_[pos_] == '\n' || in_[pos_] == '\r')) {
      ++pos_;
    }
  }
  bool take(char c) {
    if (pos_ < in_.size() && in_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  std::optional<std::uint32_t> hex4() {
    if (pos_ + 4 > in_.size()) return std::nullopt;
    std::uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = in_[pos_++];
      v <<= 4;
      if (c >= '0' && c <= '9') {
        v |= static_cast<std::uint32_t>(c - '0');
      } else if (c >= 'a' && c <= 'f') {
        v |= static_cast<std::uint32_t>(c - 'a' + 10);
      } else if (c >= 'A' && c <= 'F') {
        v |= static_cast<std::uint32_t>(c - 'A' + 10);
      } else {
        return std::nullopt;
      }
    }
    return v;
  }
  std::expected<std::string, std::string> string(std::string_view what) {
    if (!take('"')) return fail(std::string(what) + " is not a string");
    std::string out;
    for (;;) {
      if (pos_ >= in_.size()) return fail("a string is not closed");
      const auto c = static_cast<unsigned char>(in_[pos_]);
      if (c == '"') {
        ++pos_;
        break;
      }
      if (c < 0x20) return fail("a string holds a raw control character");
      if (c != '\\') {
        out += static_cast<char>(c);
        ++pos_;
        continue;
      }
      ++pos_;
      if (pos_ >= in_.size()) return fail("a string is not closed");
      const char e = in_[pos_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          auto cp = hex4();
          if (!cp) return fail("a \\u escape is not four hex digits");
          // Nothing downstream can carry a NUL (PostgreSQL's jsonb refuses it, HTTP headers too).
          if (*cp == 0) return fail("a string holds \\u0000 (NUL)");
          if (*cp >= 0xd800 && *cp <= 0xdbff) {  // a surrogate pair: the second half must follow
            if (!take('\\') || !take('u')) return fail("a lone surrogate in a \\u escape");
            auto low = hex4();
            if (!low || *low < 0xdc00 || *low > 0xdfff) return fail("a lone surrogate in a \\u escape");
            *cp = 0x10000 + ((*cp - 0xd800) << 10) + (*low - 0xdc00);
          } else if (*cp >= 0xdc00 && *cp <= 0xdfff) {
            return fail("a lone surrogate in a \\u escape");
          }
          append_utf8(out, *cp);
          break;
        }
        default:
          return fail(std::string("an unknown escape \\") + e);
      }
    }
    return out;
  }

  std::string_view in_;
  std::size_t pos_ = 0;
};

}  // namespace

std::string_view to_string(OutboxState state) {
  switch (state) {
    case OutboxState::pending: return "pending";
    case OutboxState::sent: return "sent";
    case OutboxState::dead: return "dead";
  }
  return "unknown";
}

std::optional<std::string> outbox_message_problem(const OutboxMessage& message) {
  // The consumers dead-letter a message whose id they cannot use: refuse it at the source.
  if (auto problem = message_id_problem(message.message_id)) return problem;
  if (message.destination.size() > 256) return "the destination is longer than 256 characters";
  if (!message.ordering_key.empty() && !valid_ordering_key(message.ordering_key)) {
    return "the ordering key must be 1-128 visible ASCII characters (no spaces)";
  }
  // What follows would be refused by the database (PostgreSQL text holds no NUL nor invalid
  // UTF-8) or could not be written as the JSON the headers column holds, in the middle of the
  // business transaction: say so before the INSERT, with the reason.
  if (!storable_text(message.destination)) return "the destination is not valid UTF-8 or holds a NUL byte";
  if (!storable_text(message.content_type)) return "the content type is not valid UTF-8 or holds a NUL byte";
  std::unordered_set<std::string_view> names;
  for (const auto& [name, value] : message.headers) {
    if (name.empty()) return "a header has an empty name";
    if (!storable_text(name)) return "a header name is not valid UTF-8 or holds a NUL byte";
    if (!storable_text(value)) return "the value of header \"" + name + "\" is not valid UTF-8 or holds a NUL byte";
    // A JSON object keeps one value per name (PostgreSQL's jsonb keeps the last): refuse rather
    // than lose one.
    if (!names.insert(name).second) return "header \"" + name + "\" appears twice";
  }
  return std::nullopt;
}

std::string outbox_headers_to_json(const MessageHeaders& headers) {
  std::string out = "{";
  for (const auto& [name, value] : headers) {
    if (out.size() > 1) out += ',';
    append_json_string(out, name);
    out += ':';
    append_json_string(out, value);
  }
  out += '}';
  return out;
}

std::expected<CheckedOutboxMessage, std::string> CheckedOutboxMessage::check(OutboxMessage message) {
  if (auto problem = outbox_message_problem(message)) return std::unexpected(std::move(*problem));
  std::string headers = outbox_headers_to_json(message.headers);
  return CheckedOutboxMessage(std::move(message), std::move(headers));
}

std::expected<MessageHeaders, std::string> outbox_headers_from_json(std::string_view json) {
  return HeadersReader(json).read();
}

void read_outbox_headers(OutboxRow& row, std::string_view headers_json) {
  if (auto headers = outbox_headers_from_json(headers_json)) {
    row.message.headers = std::move(*headers);
  } else {
    row.unreadable = std::move(headers.error());
  }
  if (auto problem = message_id_problem(row.message.message_id)) row.unreadable = std::move(*problem);
}

}  // namespace idem
