#include "entry_codec.hpp"

#include <charconv>
#include <limits>

namespace idem::redis_streams {
namespace {

using redis_detail::Reply;

void append_common(std::string_view content_type, std::string_view ordering_key, const MessageHeaders& headers,
                   std::string_view body, std::vector<std::string>& args) {
  if (!content_type.empty()) {
    args.emplace_back(kContentTypeField);
    args.emplace_back(content_type);
  }
  if (!ordering_key.empty()) {
    args.emplace_back(kOrderingKeyField);
    args.emplace_back(ordering_key);
  }
  for (const auto& [name, value] : headers) {
    // The message's ordering key is the one: a header of that name (h:ordering_key) would come
    // back beside it as a second value, or pose as one when the message has none.
    if (name == kOrderingKeyField) continue;
    std::string field;
    field.reserve(kHeaderPrefix.size() + name.size());
    field.append(kHeaderPrefix).append(name);
    args.push_back(std::move(field));
    args.push_back(value);
  }
  args.emplace_back(kBodyField);
  args.emplace_back(body);
}

bool parse_u64(std::string_view text, std::uint64_t& out) {
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return !text.empty() && ec == std::errc{} && ptr == text.data() + text.size();
}

}  // namespace

void append_fields(const OutgoingMessage& message, std::vector<std::string>& args) {
  // An empty id is no id: OutgoingMessage cannot say "none" otherwise, and a consumer must see
  // the difference (it dead-letters a message without an id as missing_id).
  if (!message.message_id.empty()) {
    args.emplace_back(kMessageIdField);
    args.push_back(message.message_id);
  }
  append_common(message.content_type, message.ordering_key, message.headers, message.body, args);
}

void append_fields(const Delivery& delivery, std::vector<std::string>& args) {
  if (delivery.has_message_id) {
    args.emplace_back(kMessageIdField);
    args.push_back(delivery.message_id);
  }
  append_common(delivery.content_type, delivery.ordering_key, delivery.headers, delivery.body, args);
}

std::expected<void, std::string> decode_fields(const std::vector<Reply>& fields, Delivery& out) {
  if (fields.size() % 2 != 0) return std::unexpected("an entry with an odd number of field names and values");
  bool have_content_type = false;
  bool have_ordering_key = false;
  bool have_body = false;
  out.message_id.clear();
  out.has_message_id = false;
  out.content_type.clear();
  out.ordering_key.clear();
  out.headers.clear();
  out.body.clear();
  for (std::size_t i = 0; i < fields.size(); i += 2) {
    const Reply& name = fields[i];
    const Reply& value = fields[i + 1];
    if (name.type != Reply::Type::string || value.type != Reply::Type::string) {
      return std::unexpected("an entry field that is not a string");
    }
    // The first of each named field counts; later repeats of one are kept as headers, so a
    // producer's extra "body" is visible rather than silently dropped.
    if (name.str == kMessageIdField && !out.has_message_id) {
      out.message_id = value.str;
      out.has_message_id = true;
    } else if (name.str == kContentTypeField && !have_content_type) {
      out.content_type = value.str;
      have_content_type = true;
    } else if (name.str == kOrderingKeyField && !have_ordering_key) {
      if (valid_ordering_key(value.str)) out.ordering_key = value.str;
      have_ordering_key = true;
    } else if (name.str == kBodyField && !have_body) {
      out.body = value.str;
      have_body = true;
    } else if (name.str.starts_with(kHeaderPrefix)) {
      out.headers.emplace_back(name.str.substr(kHeaderPrefix.size()), value.str);
    } else {
      out.headers.emplace_back(name.str, value.str);
    }
  }
  return {};
}

std::optional<EntryId> parse_entry_id(std::string_view text) {
  const auto dash = text.find('-');
  if (dash == std::string_view::npos) return std::nullopt;
  EntryId id;
  if (!parse_u64(text.substr(0, dash), id.ms) || !parse_u64(text.substr(dash + 1), id.seq)) return std::nullopt;
  return id;
}

std::optional<std::string> previous_id(std::string_view text) {
  auto id = parse_entry_id(text);
  if (!id || (id->ms == 0 && id->seq == 0)) return std::nullopt;
  if (id->seq > 0) return std::to_string(id->ms) + "-" + std::to_string(id->seq - 1);
  return std::to_string(id->ms - 1) + "-" + std::to_string(std::numeric_limits<std::uint64_t>::max());
}

std::expected<std::vector<RawEntry>, std::string> parse_entries(const Reply& reply) {
  if (!reply.is_array()) return std::unexpected("entries are not an array");
  std::vector<RawEntry> out;
  out.reserve(reply.elements.size());
  for (const Reply& entry : reply.elements) {
    if (!entry.is_array() || entry.elements.size() != 2 || entry.elements[0].type != Reply::Type::string ||
        !parse_entry_id(entry.elements[0].str)) {
      return std::unexpected("an entry that is not [id, fields]");
    }
    RawEntry raw{entry.elements[0].str, std::nullopt};
    const Reply& fields = entry.elements[1];
    // Deleted while pending: nil (Redis 7), or an empty array (older servers).
    if (fields.is_array() && !fields.elements.empty()) {
      raw.fields = fields.elements;
    } else if (!fields.is_array() && fields.type != Reply::Type::nil) {
      return std::unexpected("entry fields that are not an array");
    }
    out.push_back(std::move(raw));
  }
  return out;
}

std::expected<std::vector<RawEntry>, std::string> parse_read_reply(const Reply& reply) {
  if (reply.type == Reply::Type::nil) return std::vector<RawEntry>{};
  if (!reply.is_array()) return std::unexpected("XREADGROUP's reply is not an array");
  if (reply.elements.empty()) return std::vector<RawEntry>{};
  const Reply& stream = reply.elements[0];
  if (reply.elements.size() != 1 || !stream.is_array() || stream.elements.size() != 2) {
    return std::unexpected("XREADGROUP's reply is not [[stream, entries]]");
  }
  return parse_entries(stream.elements[1]);
}

std::expected<ClaimReply, std::string> parse_claim_reply(const Reply& reply) {
  if (!reply.is_array() || reply.elements.size() < 2 || reply.elements[0].type != Reply::Type::string) {
    return std::unexpected("XAUTOCLAIM's reply is not [cursor, entries, deleted]");
  }
  ClaimReply out;
  out.cursor = reply.elements[0].str;
  if (!parse_entry_id(out.cursor)) return std::unexpected("XAUTOCLAIM's cursor is not an entry id");
  auto entries = parse_entries(reply.elements[1]);
  if (!entries) return std::unexpected(entries.error());
  out.entries = std::move(*entries);
  if (reply.elements.size() > 2) {
    const Reply& deleted = reply.elements[2];
    if (!deleted.is_array()) return std::unexpected("XAUTOCLAIM's deleted ids are not an array");
    for (const Reply& id : deleted.elements) {
      if (id.type != Reply::Type::string) return std::unexpected("XAUTOCLAIM's deleted ids are not strings");
      out.deleted.push_back(id.str);
    }
  }
  return out;
}

std::expected<std::vector<std::pair<std::string, std::uint32_t>>, std::string> parse_pending_counts(
    const Reply& reply) {
  if (!reply.is_array()) return std::unexpected("XPENDING's reply is not an array");
  std::vector<std::pair<std::string, std::uint32_t>> out;
  for (const Reply& row : reply.elements) {
    if (!row.is_array() || row.elements.size() != 4 || row.elements[0].type != Reply::Type::string ||
        row.elements[3].type != Reply::Type::integer || row.elements[3].integer < 0) {
      return std::unexpected("an XPENDING row that is not [id, consumer, idle, count]");
    }
    const auto count = row.elements[3].integer;
    const auto capped = count > std::numeric_limits<std::uint32_t>::max() ? std::numeric_limits<std::uint32_t>::max()
                                                                          : static_cast<std::uint32_t>(count);
    out.emplace_back(row.elements[0].str, capped);
  }
  return out;
}

}  // namespace idem::redis_streams
