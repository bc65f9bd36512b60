#include "message.hpp"

#include <charconv>
#include <cmath>

namespace idem::amqp_detail {
namespace {

void render(const amqp_field_value_t& v, std::string& out, bool nested);

template <class T>
void append_number(T value, std::string& out) {
  char buf[64];
  auto [ptr, ec] = std::to_chars(buf, buf + sizeof buf, value);
  if (ec == std::errc{}) out.append(buf, ptr);
}

void render_quoted(amqp_bytes_t b, std::string& out) {
  out.push_back('"');
  for (char c : string_of(b)) {
    if (c == '"' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  out.push_back('"');
}

void render_table(const amqp_table_t& t, std::string& out) {
  out.push_back('{');
  for (int i = 0; i < t.num_entries; ++i) {
    if (i > 0) out.push_back(',');
    render_quoted(t.entries[i].key, out);
    out.push_back(':');
    render(t.entries[i].value, out, true);
  }
  out.push_back('}');
}

void render(const amqp_field_value_t& v, std::string& out, bool nested) {
  switch (v.kind) {
    case AMQP_FIELD_KIND_UTF8:
    case AMQP_FIELD_KIND_BYTES:
      if (nested) {
        render_quoted(v.value.bytes, out);
      } else {
        out += string_of(v.value.bytes);
      }
      return;
    case AMQP_FIELD_KIND_BOOLEAN: out += v.value.boolean ? "true" : "false"; return;
    case AMQP_FIELD_KIND_I8: append_number(static_cast<int>(v.value.i8), out); return;
    case AMQP_FIELD_KIND_U8: append_number(static_cast<unsigned>(v.value.u8), out); return;
    case AMQP_FIELD_KIND_I16: append_number(v.value.i16, out); return;
    case AMQP_FIELD_KIND_U16: append_number(v.value.u16, out); return;
    case AMQP_FIELD_KIND_I32: append_number(v.value.i32, out); return;
    case AMQP_FIELD_KIND_U32: append_number(v.value.u32, out); return;
    case AMQP_FIELD_KIND_I64: append_number(v.value.i64, out); return;
    case AMQP_FIELD_KIND_U64:
    case AMQP_FIELD_KIND_TIMESTAMP: append_number(v.value.u64, out); return;
    case AMQP_FIELD_KIND_F32: append_number(v.value.f32, out); return;
    case AMQP_FIELD_KIND_F64: append_number(v.value.f64, out); return;
    case AMQP_FIELD_KIND_DECIMAL: {
      // value x 10^-decimals, written out: 12345 with 2 decimals is "123.45".
      std::string digits = std::to_string(v.value.decimal.value);
      const std::size_t places = v.value.decimal.decimals;
      if (places > 0) {
        if (digits.size() <= places) digits.insert(0, places - digits.size() + 1, '0');
        digits.insert(digits.size() - places, 1, '.');
      }
      out += digits;
      return;
    }
    case AMQP_FIELD_KIND_VOID: if (nested) out += "null"; return;
    case AMQP_FIELD_KIND_ARRAY:
      out.push_back('[');
      for (int i = 0; i < v.value.array.num_entries; ++i) {
        if (i > 0) out.push_back(',');
        render(v.value.array.entries[i], out, true);
      }
      out.push_back(']');
      return;
    case AMQP_FIELD_KIND_TABLE: render_table(v.value.table, out); return;
    default: return;
  }
}

}  // namespace

MessageHeaders headers_from_table(const amqp_table_t& table) {
  MessageHeaders out;
  out.reserve(static_cast<std::size_t>(std::max(table.num_entries, 0)));
  for (int i = 0; i < table.num_entries; ++i) {
    std::string value;
    render(table.entries[i].value, value, false);
    out.emplace_back(string_of(table.entries[i].key), std::move(value));
  }
  return out;
}

std::optional<std::int64_t> integer_of(const amqp_field_value_t& v) {
  switch (v.kind) {
    case AMQP_FIELD_KIND_I8: return v.value.i8;
    case AMQP_FIELD_KIND_U8: return v.value.u8;
    case AMQP_FIELD_KIND_I16: return v.value.i16;
    case AMQP_FIELD_KIND_U16: return v.value.u16;
    case AMQP_FIELD_KIND_I32: return v.value.i32;
    case AMQP_FIELD_KIND_U32: return v.value.u32;
    case AMQP_FIELD_KIND_I64: return v.value.i64;
    case AMQP_FIELD_KIND_U64:
      if (v.value.u64 > static_cast<std::uint64_t>(INT64_MAX)) return std::nullopt;
      return static_cast<std::int64_t>(v.value.u64);
    case AMQP_FIELD_KIND_UTF8:
    case AMQP_FIELD_KIND_BYTES: {
      const std::string text = string_of(v.value.bytes);
      std::int64_t n = 0;
      auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
      if (text.empty() || ec != std::errc{} || ptr != text.data() + text.size()) return std::nullopt;
      return n;
    }
    default: return std::nullopt;
  }
}

void Assembler::reset() {
  state_ = State::idle;
  body_size_ = 0;
  current_ = Incoming{};
}

std::expected<Assembler::Step, Failure> Assembler::feed(const amqp_frame_t& frame) {
  auto out_of_order = [&](std::string what) -> std::unexpected<Failure> {
    reset();
    Failure f;
    f.kind = Failure::Kind::protocol;
    f.reply_text = std::move(what) + " on channel " + std::to_string(frame.channel);
    return std::unexpected(std::move(f));
  };
  switch (frame.frame_type) {
    case AMQP_FRAME_METHOD: {
      const auto id = frame.payload.method.id;
      if (id != AMQP_BASIC_DELIVER_METHOD && id != AMQP_BASIC_RETURN_METHOD) {
        if (state_ != State::idle) return out_of_order(std::string("a ") + amqp_method_name(id) + " inside a message");
        return Step::other;
      }
      if (state_ != State::idle) return out_of_order("a new message before the last one ended");
      current_ = Incoming{};
      if (id == AMQP_BASIC_DELIVER_METHOD) {
        const auto* m = static_cast<const amqp_basic_deliver_t*>(frame.payload.method.decoded);
        current_.delivery_tag = m->delivery_tag;
        current_.redelivered = m->redelivered != 0;
        current_.exchange = string_of(m->exchange);
        current_.routing_key = string_of(m->routing_key);
      } else {
        const auto* m = static_cast<const amqp_basic_return_t*>(frame.payload.method.decoded);
        current_.returned = true;
        current_.reply_code = m->reply_code;
        current_.reply_text = string_of(m->reply_text);
        current_.exchange = string_of(m->exchange);
        current_.routing_key = string_of(m->routing_key);
      }
      state_ = State::header;
      return Step::more;
    }
    case AMQP_FRAME_HEADER: {
      if (state_ != State::header) return out_of_order("a content header without its method");
      const auto* p = static_cast<const amqp_basic_properties_t*>(frame.payload.properties.decoded);
      if (p->_flags & AMQP_BASIC_MESSAGE_ID_FLAG) {
        current_.message_id = string_of(p->message_id);
        current_.has_message_id = true;
      }
      if (p->_flags & AMQP_BASIC_CONTENT_TYPE_FLAG) current_.content_type = string_of(p->content_type);
      if (p->_flags & AMQP_BASIC_HEADERS_FLAG) {
        current_.headers = headers_from_table(p->headers);
        for (int i = 0; i < p->headers.num_entries; ++i) {
          const auto& e = p->headers.entries[i];
          const std::string key = string_of(e.key);
          if (key == "x-delivery-count") current_.x_delivery_count = integer_of(e.value);
          const bool text = e.value.kind == AMQP_FIELD_KIND_UTF8 || e.value.kind == AMQP_FIELD_KIND_BYTES;
          if (key == kLongMessageIdHeader && text && !current_.has_message_id) {
            current_.message_id = string_of(e.value.value.bytes);
            current_.has_message_id = true;
          }
        }
        // Our transport headers are not the producer's: the Delivery carries the id and the
        // ordering key itself. The ordering key as text, whatever its type (a foreign producer's
        // numeric aggregate id is a key too); one that is no valid key is none.
        for (const auto& [name, value] : current_.headers) {
          if (name != kOrderingKeyHeader) continue;
          if (valid_ordering_key(value)) current_.ordering_key = value;
          break;
        }
        std::erase_if(current_.headers,
                      [](const auto& h) { return h.first == kLongMessageIdHeader || h.first == kOrderingKeyHeader; });
      }
      body_size_ = frame.payload.properties.body_size;
      // Reserve what was announced, up to a bound: a broker's word is not a reason to allocate
      // gigabytes up front (RabbitMQ's own limit is 512 MiB; the body grows as it comes).
      current_.body.reserve(static_cast<std::size_t>(std::min<std::uint64_t>(body_size_, 16u << 20)));
      if (body_size_ == 0) {
        state_ = State::idle;
        return Step::complete;
      }
      state_ = State::body;
      return Step::more;
    }
    case AMQP_FRAME_BODY: {
      if (state_ != State::body) return out_of_order("a body frame without a content header");
      const auto& b = frame.payload.body_fragment;
      if (current_.body.size() + b.len > body_size_) return out_of_order("a body longer than its header said");
      current_.body.append(static_cast<const char*>(b.bytes), b.len);
      if (current_.body.size() < body_size_) return Step::more;
      state_ = State::idle;
      return Step::complete;
    }
    default:
      return out_of_order("an unexpected frame type " + std::to_string(frame.frame_type));
  }
}

std::optional<std::string> unpublishable(const Outgoing& m, std::uint32_t frame_max) {
  if (m.exchange.size() > kMaxShortString) return "the exchange name is longer than AMQP's 255 bytes";
  if (m.routing_key.size() > kMaxShortString) return "the routing key is longer than AMQP's 255 bytes";
  if (m.content_type.size() > kMaxShortString) return "the content type is longer than AMQP's 255 bytes";
  if (!m.ordering_key.empty() && !valid_ordering_key(m.ordering_key)) {
    return "the ordering key is not 1-128 visible ASCII characters";
  }
  // The content header frame: class, weight, body size, flags (14 bytes), the properties, and
  // the frame's own 8 bytes, all within frame_max.
  std::size_t size = 8 + 14 + 1 /*delivery mode*/ + 1 + m.content_type.size() + 1 + std::min(m.message_id.size(), kMaxShortString) + 4;
  for (const auto& h : m.headers) {
    if (h.name.size() > kMaxShortString) return "a header name is longer than AMQP's 255 bytes";
    size += 1 + h.name.size() + 1 + (h.integer ? 8 : 4 + h.text.size());
  }
  if (!m.ordering_key.empty()) size += 1 + kOrderingKeyHeader.size() + 1 + 4 + m.ordering_key.size();
  if (m.message_id.size() > kMaxShortString) size += 1 + kLongMessageIdHeader.size() + 1 + 4 + m.message_id.size();
  if (frame_max != 0 && size > frame_max) {
    return "its headers take " + std::to_string(size) + " bytes, more than fit in one AMQP frame (" + std::to_string(frame_max) + ")";
  }
  return std::nullopt;
}

Properties::Properties(const Outgoing& m) {
  props_._flags = AMQP_BASIC_DELIVERY_MODE_FLAG;
  props_.delivery_mode = 2;  // persistent: written to disk by durable queues before the confirm
  const bool long_id = m.message_id.size() > kMaxShortString;
  if (!m.message_id.empty() && !long_id) {
    props_._flags |= AMQP_BASIC_MESSAGE_ID_FLAG;
    props_.message_id = bytes_of(m.message_id);
  }
  if (!m.content_type.empty()) {
    props_._flags |= AMQP_BASIC_CONTENT_TYPE_FLAG;
    props_.content_type = bytes_of(m.content_type);
  }
  entries_.reserve(m.headers.size() + 2);
  for (const auto& h : m.headers) {
    if (long_id && h.name == kLongMessageIdHeader) continue;  // ours, set below
    if (h.name == kOrderingKeyHeader) continue;                // the message's own, set below
    amqp_table_entry_t e{};
    e.key = bytes_of(h.name);
    if (h.integer) {
      e.value.kind = AMQP_FIELD_KIND_I64;
      e.value.value.i64 = *h.integer;
    } else {
      e.value.kind = AMQP_FIELD_KIND_UTF8;
      e.value.value.bytes = bytes_of(h.text);
    }
    entries_.push_back(e);
  }
  if (!m.ordering_key.empty()) {
    amqp_table_entry_t e{};
    e.key = bytes_of(kOrderingKeyHeader);
    e.value.kind = AMQP_FIELD_KIND_UTF8;
    e.value.value.bytes = bytes_of(m.ordering_key);
    entries_.push_back(e);
  }
  if (long_id) {
    amqp_table_entry_t e{};
    e.key = bytes_of(kLongMessageIdHeader);
    e.value.kind = AMQP_FIELD_KIND_UTF8;
    e.value.value.bytes = bytes_of(m.message_id);
    entries_.push_back(e);
  }
  if (!entries_.empty()) {
    props_._flags |= AMQP_BASIC_HEADERS_FLAG;
    props_.headers.num_entries = static_cast<int>(entries_.size());
    props_.headers.entries = entries_.data();
  }
}

}  // namespace idem::amqp_detail
