#include "protocol.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>

#include "idem/fingerprint.hpp"  // sha256_hex

namespace idem::sqs_detail {
namespace {

using nlohmann::json;

constexpr std::string_view kIdemPrefix = "x-idem-";
constexpr std::string_view kNoIdGroup = "idem-no-message-id";
constexpr std::string_view kBase64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

// Every string this module builds was checked or made valid UTF-8; replacing is the safety net
// that keeps a stray byte from throwing.
std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string base64_encode(std::string_view in) {
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  std::size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    const auto n = (static_cast<std::uint32_t>(static_cast<unsigned char>(in[i])) << 16) |
                   (static_cast<std::uint32_t>(static_cast<unsigned char>(in[i + 1])) << 8) |
                   static_cast<unsigned char>(in[i + 2]);
    for (int shift : {18, 12, 6, 0}) out.push_back(kBase64[(n >> shift) & 63]);
  }
  if (i < in.size()) {
    std::uint32_t n = static_cast<std::uint32_t>(static_cast<unsigned char>(in[i])) << 16;
    if (i + 1 < in.size()) n |= static_cast<std::uint32_t>(static_cast<unsigned char>(in[i + 1])) << 8;
    out.push_back(kBase64[(n >> 18) & 63]);
    out.push_back(kBase64[(n >> 12) & 63]);
    out.push_back(i + 1 < in.size() ? kBase64[(n >> 6) & 63] : '=');
    out.push_back('=');
  }
  return out;
}

std::optional<std::string> base64_decode(std::string_view in) {
  std::string out;
  std::uint32_t buffer = 0;
  int bits = 0;
  std::size_t padding = 0;
  for (char c : in) {
    if (c == '=') {
      ++padding;
      continue;
    }
    if (padding > 0) return std::nullopt;  // data after padding
    const auto pos = kBase64.find(c);
    if (pos == std::string_view::npos) return std::nullopt;
    buffer = (buffer << 6) | static_cast<std::uint32_t>(pos);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((buffer >> bits) & 0xff));
    }
  }
  if (padding > 2) return std::nullopt;
  return out;
}

std::string hex(const unsigned char* data, std::size_t size) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(size * 2);
  for (std::size_t i = 0; i < size; ++i) {
    out.push_back(kHex[data[i] >> 4]);
    out.push_back(kHex[data[i] & 15]);
  }
  return out;
}

std::string random_token() {
  thread_local std::mt19937_64 random{std::random_device{}()};
  std::array<unsigned char, 16> bytes{};
  for (auto& b : bytes) b = static_cast<unsigned char>(random());
  return hex(bytes.data(), bytes.size());
}

// One UTF-8 code point at text[i]: its value and length, or nullopt when malformed (overlong,
// surrogate, beyond U+10FFFF, truncated).
std::optional<std::pair<char32_t, std::size_t>> decode_utf8(std::string_view text, std::size_t i) {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char lead = byte(i);
  if (lead < 0x80) return std::pair<char32_t, std::size_t>{lead, 1};
  std::size_t length = 0;
  char32_t cp = 0;
  if ((lead & 0xe0) == 0xc0) {
    length = 2;
    cp = lead & 0x1f;
  } else if ((lead & 0xf0) == 0xe0) {
    length = 3;
    cp = lead & 0x0f;
  } else if ((lead & 0xf8) == 0xf0) {
    length = 4;
    cp = lead & 0x07;
  } else {
    return std::nullopt;
  }
  if (i + length > text.size()) return std::nullopt;
  for (std::size_t k = 1; k < length; ++k) {
    if ((byte(i + k) & 0xc0) != 0x80) return std::nullopt;
    cp = (cp << 6) | (byte(i + k) & 0x3f);
  }
  static constexpr char32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kMin[length] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return std::nullopt;
  return std::pair<char32_t, std::size_t>{cp, length};
}

bool allowed(char32_t cp) {
  return cp == 0x9 || cp == 0xa || cp == 0xd || (cp >= 0x20 && cp <= 0xd7ff) || (cp >= 0xe000 && cp <= 0xfffd) ||
         (cp >= 0x10000 && cp <= 0x10ffff);
}

json attributes_json(const std::vector<std::pair<std::string, Attribute>>& attributes) {
  json out = json::object();
  for (const auto& [name, a] : attributes) {
    if (a.type.starts_with("Binary")) {
      out[name] = {{"DataType", a.type}, {"BinaryValue", base64_encode(a.value)}};
    } else {
      out[name] = {{"DataType", a.type}, {"StringValue", a.value}};
    }
  }
  return out;
}

json entry_json(const SendEntry& e) {
  json j = {{"MessageBody", e.body}};
  if (!e.id.empty()) j["Id"] = e.id;
  if (!e.attributes.empty()) j["MessageAttributes"] = attributes_json(e.attributes);
  if (!e.group_id.empty()) j["MessageGroupId"] = e.group_id;
  if (!e.deduplication_id.empty()) j["MessageDeduplicationId"] = e.deduplication_id;
  return j;
}

json receipts_json(const std::vector<std::pair<std::string, std::string>>& receipts, std::optional<int> visibility) {
  json entries = json::array();
  for (const auto& [id, receipt] : receipts) {
    json e = {{"Id", id}, {"ReceiptHandle", receipt}};
    if (visibility) e["VisibilityTimeout"] = *visibility;
    entries.push_back(std::move(e));
  }
  return entries;
}

std::optional<json> parse_object(std::string_view body) {
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return std::nullopt;
  return j;
}

// A string member, or nullopt when absent or of another type.
std::optional<std::string> string_member(const json& j, const char* name) {
  const auto it = j.find(name);
  if (it == j.end() || !it->is_string()) return std::nullopt;
  return it->get<std::string>();
}

}  // namespace

std::size_t SendEntry::size() const {
  std::size_t n = body.size();
  for (const auto& [name, a] : attributes) n += name.size() + a.type.size() + a.value.size();
  return n;
}

// ---- requests ------------------------------------------------------------------------------

std::string receive_request(std::string_view queue_url, std::size_t max, int wait_seconds, int visibility_seconds) {
  const json system = {"ApproximateReceiveCount", "MessageDeduplicationId", "MessageGroupId"};
  return dump({{"QueueUrl", queue_url},
               {"MaxNumberOfMessages", std::clamp<std::size_t>(max, 1, kMaxBatchEntries)},
               {"WaitTimeSeconds", wait_seconds},
               {"VisibilityTimeout", visibility_seconds},
               {"MessageAttributeNames", {"All"}},
               // The current name, and the one older endpoints and emulators know.
               {"MessageSystemAttributeNames", system},
               {"AttributeNames", system}});
}

std::string send_batch_request(std::string_view queue_url, const std::vector<SendEntry>& entries) {
  json list = json::array();
  for (const SendEntry& e : entries) list.push_back(entry_json(e));
  return dump({{"QueueUrl", queue_url}, {"Entries", std::move(list)}});
}

std::string send_request(std::string_view queue_url, const SendEntry& entry) {
  SendEntry single = entry;
  single.id.clear();  // SendMessage has no entry id
  json j = entry_json(single);
  j["QueueUrl"] = queue_url;
  return dump(j);
}

std::string delete_batch_request(std::string_view queue_url, const std::vector<std::pair<std::string, std::string>>& receipts) {
  return dump({{"QueueUrl", queue_url}, {"Entries", receipts_json(receipts, std::nullopt)}});
}

std::string delete_request(std::string_view queue_url, std::string_view receipt) {
  return dump({{"QueueUrl", queue_url}, {"ReceiptHandle", receipt}});
}

std::string change_visibility_batch_request(std::string_view queue_url,
                                            const std::vector<std::pair<std::string, std::string>>& receipts, int seconds) {
  return dump({{"QueueUrl", queue_url}, {"Entries", receipts_json(receipts, seconds)}});
}

std::string change_visibility_request(std::string_view queue_url, std::string_view receipt, int seconds) {
  return dump({{"QueueUrl", queue_url}, {"ReceiptHandle", receipt}, {"VisibilityTimeout", seconds}});
}

std::string get_attributes_request(std::string_view queue_url, const std::vector<std::string>& names) {
  return dump({{"QueueUrl", queue_url}, {"AttributeNames", names}});
}

// ---- answers -------------------------------------------------------------------------------

std::expected<std::vector<ReceivedMessage>, std::string> parse_receive(std::string_view body) {
  auto j = parse_object(body);
  if (!j) return std::unexpected("ReceiveMessage's answer is not a JSON object");
  std::vector<ReceivedMessage> out;
  const auto messages = j->find("Messages");
  if (messages == j->end() || messages->is_null()) return out;  // nothing this time
  if (!messages->is_array()) return std::unexpected("ReceiveMessage's Messages is not a list");
  for (const json& m : *messages) {
    if (!m.is_object()) return std::unexpected("a message in ReceiveMessage's answer is not an object");
    ReceivedMessage r;
    auto receipt = string_member(m, "ReceiptHandle");
    if (!receipt || receipt->empty()) return std::unexpected("a message in ReceiveMessage's answer has no ReceiptHandle");
    r.receipt_handle = std::move(*receipt);
    r.sqs_message_id = string_member(m, "MessageId").value_or("");
    r.body = string_member(m, "Body").value_or("");
    if (const auto attrs = m.find("MessageAttributes"); attrs != m.end() && attrs->is_object()) {
      for (const auto& [name, a] : attrs->items()) {
        if (!a.is_object()) return std::unexpected("message attribute " + name + " is not an object");
        Attribute attribute;
        attribute.type = string_member(a, "DataType").value_or("String");
        if (auto binary = string_member(a, "BinaryValue")) {
          auto decoded = base64_decode(*binary);
          if (!decoded) return std::unexpected("message attribute " + name + " has a BinaryValue that is not base64");
          attribute.value = std::move(*decoded);
        } else {
          attribute.value = string_member(a, "StringValue").value_or("");
        }
        r.attributes.emplace(name, std::move(attribute));
      }
    }
    if (const auto system = m.find("Attributes"); system != m.end() && system->is_object()) {
      if (auto count = string_member(*system, "ApproximateReceiveCount")) {
        std::uint32_t n = 0;
        auto [ptr, ec] = std::from_chars(count->data(), count->data() + count->size(), n);
        if (ec == std::errc{} && ptr == count->data() + count->size() && n > 0) r.receive_count = n;
      }
      r.deduplication_id = string_member(*system, "MessageDeduplicationId");
      r.group_id = string_member(*system, "MessageGroupId");
    }
    out.push_back(std::move(r));
  }
  return out;
}

std::expected<BatchResult, std::string> parse_batch_result(std::string_view body) {
  auto j = parse_object(body);
  if (!j) return std::unexpected("the batch answer is not a JSON object");
  BatchResult out;
  if (const auto ok = j->find("Successful"); ok != j->end() && ok->is_array()) {
    for (const json& e : *ok) {
      if (auto id = e.is_object() ? string_member(e, "Id") : std::nullopt) out.successful.push_back(std::move(*id));
    }
  }
  if (const auto failed = j->find("Failed"); failed != j->end() && failed->is_array()) {
    for (const json& e : *failed) {
      auto id = e.is_object() ? string_member(e, "Id") : std::nullopt;
      if (!id) return std::unexpected("a failed entry of the batch answer has no Id");
      EntryFailure f;
      f.code = string_member(e, "Code").value_or("");
      f.message = string_member(e, "Message").value_or("");
      if (const auto fault = e.find("SenderFault"); fault != e.end() && fault->is_boolean()) f.sender_fault = fault->get<bool>();
      out.failed.emplace(std::move(*id), std::move(f));
    }
  }
  return out;
}

std::expected<std::map<std::string, std::string>, std::string> parse_attributes(std::string_view body) {
  auto j = parse_object(body);
  if (!j) return std::unexpected("GetQueueAttributes's answer is not a JSON object");
  std::map<std::string, std::string> out;
  if (const auto attrs = j->find("Attributes"); attrs != j->end() && attrs->is_object()) {
    for (const auto& [name, value] : attrs->items()) {
      if (value.is_string()) out.emplace(name, value.get<std::string>());
    }
  }
  return out;
}

AwsError parse_error(std::string_view body) {
  AwsError out;
  auto j = parse_object(body);
  if (!j) return out;
  out.code = string_member(*j, "__type").value_or(string_member(*j, "code").value_or(""));
  out.message = string_member(*j, "message").value_or(string_member(*j, "Message").value_or(""));
  return out;
}

// ---- messages ------------------------------------------------------------------------------

Delivery to_delivery(ReceivedMessage message, std::string_view id_attribute, bool fifo) {
  Delivery d;
  if (auto id = message.attributes.find(std::string(id_attribute)); id != message.attributes.end()) {
    d.message_id = std::move(id->second.value);
    d.has_message_id = true;
    message.attributes.erase(id);
  } else if (fifo && message.deduplication_id) {
    d.message_id = *message.deduplication_id;
    d.has_message_id = true;
  }
  if (auto ct = message.attributes.find(std::string(kContentTypeAttribute)); ct != message.attributes.end()) {
    d.content_type = std::move(ct->second.value);
    message.attributes.erase(ct);
  }
  // The attribute decides when there is one (even one that is no valid key, then ignored). Else
  // a FIFO queue's group, unless it is the group idem's sink gives a message without an ordering
  // key (outgoing_entry): that one orders nothing but the copies of one message.
  if (auto key = message.attributes.find(std::string(kOrderingKeyHeader)); key != message.attributes.end()) {
    if (valid_ordering_key(key->second.value)) d.ordering_key = std::move(key->second.value);
    message.attributes.erase(key);
  } else if (fifo && message.group_id && valid_ordering_key(*message.group_id) && *message.group_id != kNoIdGroup &&
             !(d.has_message_id && *message.group_id == fifo_token(d.message_id))) {
    d.ordering_key = *message.group_id;
  }
  for (auto& [name, a] : message.attributes) d.headers.emplace_back(name, std::move(a.value));
  d.body = std::move(message.body);
  d.delivery_count = std::max<std::uint32_t>(message.receive_count, 1);
  d.redelivered = d.delivery_count > 1;
  d.broker_ref = std::move(message.sqs_message_id);
  return d;
}

std::optional<std::string> outgoing_problem(const OutgoingMessage& m, std::string_view id_attribute) {
  if (!m.destination.empty()) {
    if (auto problem = queue_name_problem(m.destination, "the destination")) return problem;
  }
  if (m.body.empty()) return std::string("SQS cannot carry an empty message body");
  if (auto problem = text_problem(m.body)) return "the body is not text SQS accepts: " + *problem;
  if (auto problem = text_problem(m.message_id)) return "the message id is not text SQS accepts: " + *problem;
  if (auto problem = text_problem(m.content_type)) return "the content type is not text SQS accepts: " + *problem;
  if (!m.ordering_key.empty() && !valid_ordering_key(m.ordering_key)) {
    return std::string("the ordering key is not 1-128 visible ASCII characters");
  }
  std::size_t count = (m.message_id.empty() ? 0 : 1) + (m.content_type.empty() ? 0 : 1) + (m.ordering_key.empty() ? 0 : 1);
  for (const auto& [name, value] : m.headers) {
    if (name == id_attribute || name == kContentTypeAttribute || name == kOrderingKeyHeader || value.empty()) continue;
    if (auto problem = attribute_name_problem(name)) return "header \"" + sqs_text(name, 100) + "\": " + *problem;
    if (auto problem = text_problem(value)) return "header " + name + "'s value is not text SQS accepts: " + *problem;
    ++count;
  }
  if (count > kMaxAttributes) {
    return "the message needs " + std::to_string(count) +
           " message attributes (its id, content type, ordering key and headers); SQS allows " +
           std::to_string(kMaxAttributes);
  }
  return std::nullopt;
}

SendEntry outgoing_entry(const OutgoingMessage& m, std::string_view id_attribute, bool fifo, std::string entry_id) {
  SendEntry e;
  e.id = std::move(entry_id);
  e.body = m.body;
  if (!m.message_id.empty()) e.attributes.push_back({std::string(id_attribute), {"String", m.message_id}});
  if (!m.content_type.empty()) e.attributes.push_back({std::string(kContentTypeAttribute), {"String", m.content_type}});
  if (!m.ordering_key.empty()) e.attributes.push_back({std::string(kOrderingKeyHeader), {"String", m.ordering_key}});
  for (const auto& [name, value] : m.headers) {
    // A header of its own named ordering_key is dropped, whether or not the message has an
    // ordering key: OutgoingMessage::ordering_key is the one way to give one (on a FIFO queue
    // the group would not be that header's value).
    if (name == id_attribute || name == kContentTypeAttribute || name == kOrderingKeyHeader || value.empty()) continue;
    e.attributes.push_back({name, {"String", value}});
  }
  if (fifo) {
    // A valid ordering key is a MessageGroupId SQS takes as it is (both: 1-128 visible ASCII).
    e.group_id = m.ordering_key.empty() ? sink_group(m.message_id) : m.ordering_key;
    e.deduplication_id = m.message_id.empty() ? random_token() : fifo_token(m.message_id);
  }
  return e;
}

std::string sink_group(std::string_view message_id) {
  return message_id.empty() ? std::string(kNoIdGroup) : fifo_token(message_id);
}

SendEntry dead_letter_entry(const Delivery& d, const DeadLetterReason& why, std::string_view id_attribute,
                            const DeadLetterOrigin& origin, bool fifo_dead_letter_queue) {
  SendEntry e;
  e.body = d.body.empty() ? std::string(" ") : d.body;  // SQS never delivers an empty body; be safe anyway
  auto text = [](std::string_view value) { return Attribute{"String", sqs_text(value, kMaxReasonBytes)}; };
  auto as_attribute = [](const std::string& value) {
    return text_problem(value) ? Attribute{"Binary", value} : Attribute{"String", value};
  };
  std::vector<std::pair<std::string, Attribute>> ours;
  if (d.has_message_id && !d.message_id.empty()) ours.push_back({std::string(id_attribute), as_attribute(d.message_id)});
  if (!d.content_type.empty()) ours.push_back({std::string(kContentTypeAttribute), as_attribute(d.content_type)});
  if (!d.ordering_key.empty()) ours.push_back({std::string(kOrderingKeyHeader), as_attribute(d.ordering_key)});
  std::vector<std::pair<std::string, Attribute>> theirs;
  std::vector<std::string> left_out;
  for (const auto& [name, value] : d.headers) {
    if (std::string_view(name).starts_with(kIdemPrefix) || name == id_attribute || name == kContentTypeAttribute ||
        name == kOrderingKeyHeader) {
      continue;
    }
    if (value.empty() || attribute_name_problem(name)) {
      left_out.push_back(name);
      continue;
    }
    theirs.push_back({name, as_attribute(value)});
  }
  // Ours: reason, detail, last error (when any), attempts, source.
  const std::size_t reserved = ours.size() + 3 + (why.detail.empty() ? 0 : 1) + (why.last_error.empty() ? 0 : 1);
  const std::size_t room = kMaxAttributes > reserved ? kMaxAttributes - reserved : 0;
  while (theirs.size() > room) {
    left_out.push_back(theirs.back().first);
    theirs.pop_back();
  }
  std::string detail = why.detail;
  if (!left_out.empty()) {
    std::string names;
    for (const auto& n : left_out) names += (names.empty() ? "" : ", ") + n;
    detail += std::string(detail.empty() ? "" : " ") + "(headers not copied: SQS allows " + std::to_string(kMaxAttributes) +
              " attributes and no empty values or odd names: " + names + ")";
  }
  e.attributes = std::move(ours);
  for (auto& a : theirs) e.attributes.push_back(std::move(a));
  e.attributes.push_back({"x-idem-reason", text(why.reason.empty() ? std::string_view("unknown") : std::string_view(why.reason))});
  if (!detail.empty()) e.attributes.push_back({"x-idem-detail", text(detail)});
  if (!why.last_error.empty()) e.attributes.push_back({"x-idem-last-error", text(why.last_error)});
  e.attributes.push_back({"x-idem-attempts", {"Number", std::to_string(why.attempts)}});
  e.attributes.push_back({"x-idem-source", text(origin.queue)});
  if (fifo_dead_letter_queue) {
    if (!origin.group_id.empty()) {
      e.group_id = origin.group_id;
    } else if (!d.ordering_key.empty()) {
      e.group_id = d.ordering_key;
    } else {
      e.group_id = d.has_message_id && !d.message_id.empty() ? fifo_token(d.message_id) : std::string("idem-dead-letters");
    }
    // A second copy of the same delivery (a retry after a lost answer) is dropped by SQS.
    e.deduplication_id = origin.sqs_message_id.empty() ? random_token() : fifo_token(origin.sqs_message_id);
  }
  return e;
}

std::optional<std::string> text_problem(std::string_view text) {
  for (std::size_t i = 0; i < text.size();) {
    const auto cp = decode_utf8(text, i);
    if (!cp) return "invalid UTF-8 at byte " + std::to_string(i) + " (SQS carries text: base64-encode binary payloads)";
    if (!allowed(cp->first)) {
      char code[16];
      std::snprintf(code, sizeof code, "U+%04X", static_cast<unsigned>(cp->first));
      return "character " + std::string(code) + " at byte " + std::to_string(i) + " is not one SQS allows";
    }
    i += cp->second;
  }
  return std::nullopt;
}

std::string sqs_text(std::string_view text, std::size_t max_bytes) {
  static constexpr std::string_view kReplacement = "\xef\xbf\xbd";  // U+FFFD
  std::string out;
  for (std::size_t i = 0; i < text.size();) {
    const auto cp = decode_utf8(text, i);
    const std::string_view piece = cp && allowed(cp->first) ? text.substr(i, cp->second) : kReplacement;
    if (out.size() + piece.size() > max_bytes) break;
    out.append(piece);
    i += cp ? cp->second : 1;
  }
  return out;
}

std::optional<std::string> queue_name_problem(std::string_view name, std::string_view what) {
  if (name.empty()) return std::string(what) + " is empty";
  if (name.size() > kMaxQueueName) return std::string(what) + " is longer than SQS's 80 characters";
  std::string_view base = name;
  if (base.ends_with(".fifo")) base.remove_suffix(5);
  const bool legal = !base.empty() && std::all_of(base.begin(), base.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_';
  });
  if (!legal) {
    return std::string(what) + " \"" + sqs_text(name, 100) +
           "\" is not a queue name SQS allows (1-80 of a-z A-Z 0-9 - _, and .fifo at the end of a FIFO queue's)";
  }
  return std::nullopt;
}

std::optional<std::string> attribute_name_problem(std::string_view name) {
  if (name.empty()) return std::string("an empty attribute name");
  if (name.size() > 256) return std::string("an attribute name longer than SQS's 256 characters");
  const bool legal = std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.';
  });
  if (!legal) return std::string("SQS attribute names take only A-Z a-z 0-9 _ - .");
  if (name.front() == '.' || name.back() == '.' || name.find("..") != std::string_view::npos) {
    return std::string("SQS attribute names cannot start or end with '.' or hold \"..\"");
  }
  std::string lowered(name.substr(0, 7));
  std::transform(lowered.begin(), lowered.end(), lowered.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (lowered.starts_with("aws.") || lowered.starts_with("amazon.")) {
    return std::string("names starting with AWS. or Amazon. are SQS's own");
  }
  return std::nullopt;
}

std::string fifo_token(std::string_view id) {
  const bool usable = !id.empty() && id.size() <= 128 && std::all_of(id.begin(), id.end(), [](char c) { return c > ' ' && c < 127; });
  if (usable) return std::string(id);
  return "sha256-" + sha256_hex(id);
}

}  // namespace idem::sqs_detail
