#include "record_headers.hpp"

namespace idem::kafka_detail {
namespace {

constexpr std::string_view kIdemHeaderPrefix = "x-idem-";

}  // namespace

std::vector<std::pair<std::string_view, std::string_view>> outgoing_headers(const OutgoingMessage& m, std::string_view id_header) {
  std::vector<std::pair<std::string_view, std::string_view>> out;
  out.reserve(m.headers.size() + 3);
  if (!m.message_id.empty()) out.emplace_back(id_header, m.message_id);
  if (!m.content_type.empty()) out.emplace_back(kContentTypeHeader, m.content_type);
  if (!m.ordering_key.empty()) out.emplace_back(kOrderingKeyHeader, m.ordering_key);
  for (const auto& [name, value] : m.headers) {
    if (name == id_header || name == kContentTypeHeader || name == kOrderingKeyHeader) continue;
    out.emplace_back(name, value);
  }
  return out;
}

std::optional<std::string_view> record_key(const OutgoingMessage& m) {
  if (!m.ordering_key.empty()) return std::string_view(m.ordering_key);
  if (!m.message_id.empty()) return std::string_view(m.message_id);
  return std::nullopt;
}

void decode_record(const IncomingRecord& record, std::string_view id_header, KafkaIdFrom id_from, Delivery& out) {
  out.message_id.clear();
  out.has_message_id = false;
  out.content_type.clear();
  out.ordering_key.clear();
  out.headers.clear();
  bool content_type_seen = false;
  std::optional<std::string_view> ordering_key;
  if (id_from == KafkaIdFrom::key && record.key) {
    out.message_id = std::string(*record.key);
    out.has_message_id = true;
  }
  for (const auto& [name, value] : record.headers) {
    if (id_from == KafkaIdFrom::header && name == id_header && !out.has_message_id && value) {
      out.message_id = std::string(*value);
      out.has_message_id = true;
      continue;
    }
    if (name == kOrderingKeyHeader && !ordering_key && value) {
      ordering_key = *value;
      continue;
    }
    if (name == kContentTypeHeader && !content_type_seen) {
      out.content_type = value ? std::string(*value) : std::string();
      content_type_seen = true;
      continue;
    }
    out.headers.emplace_back(std::string(name), value ? std::string(*value) : std::string());
  }
  // The header decides when there is one, even an invalid one: the producer said what the key
  // is. A key that is the message id is what idem's sink writes for a message without an
  // ordering key: it orders nothing (one message's copies), so it is none.
  if (!ordering_key && id_from == KafkaIdFrom::header && record.key && !(out.has_message_id && *record.key == out.message_id)) {
    ordering_key = record.key;
  }
  if (ordering_key && valid_ordering_key(*ordering_key)) out.ordering_key = std::string(*ordering_key);
  out.body = std::string(record.value);
}

std::vector<std::pair<std::string, std::string>> dead_letter_headers(const Delivery& d, const DeadLetterReason& why,
                                                                     std::string_view id_header, const DeadLetterOrigin& origin) {
  std::vector<std::pair<std::string, std::string>> out;
  if (d.has_message_id) out.emplace_back(std::string(id_header), d.message_id);
  if (!d.content_type.empty()) out.emplace_back(std::string(kContentTypeHeader), d.content_type);
  if (!d.ordering_key.empty()) out.emplace_back(std::string(kOrderingKeyHeader), d.ordering_key);
  for (const auto& [name, value] : d.headers) {
    if (std::string_view(name).starts_with(kIdemHeaderPrefix) || name == id_header || name == kContentTypeHeader ||
        name == kOrderingKeyHeader) {
      continue;
    }
    out.emplace_back(name, value);
  }
  out.emplace_back("x-idem-reason", why.reason);
  out.emplace_back("x-idem-detail", why.detail);
  out.emplace_back("x-idem-last-error", why.last_error);
  out.emplace_back("x-idem-attempts", std::to_string(why.attempts));
  out.emplace_back("x-idem-source", origin.topic);
  out.emplace_back("x-idem-partition", std::to_string(origin.partition));
  out.emplace_back("x-idem-offset", std::to_string(origin.offset));
  return out;
}

}  // namespace idem::kafka_detail
