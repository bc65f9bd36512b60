// HTTP/2 messages as the gateway sees them, and the gRPC forms of its answers and of the storage
// rule (h2_message.hpp; docs/gateway.md, HTTP/2 and gRPC).
#include "h2_message.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <span>

#include "idem/gateway/grpc.hpp"
#include "idem/http/message.hpp"

namespace idem::gateway {

void H2Request::add_field(std::string_view name, std::string_view value, bool trailer, std::size_t max_header) {
  header_bytes += name.size() + value.size() + 32;
  if (header_bytes > max_header) header_too_large = true;
  if (header_too_large || trailer) return;  // trailers are not forwarded to HTTP/1.1
  if (!name.empty() && name.front() == ':') {
    if (name == ":method") {
      req.method_string(value);
    } else if (name == ":path") {
      req.target(value);
    } else if (name == ":authority") {
      authority = value;
    }
    return;  // :scheme (nghttp2 checked it is there)
  }
  if (name == "cookie") {
    // HTTP/2 may split the Cookie field; HTTP/1.1 carries one (RFC 9113, 8.2.3).
    if (!cookies.empty()) cookies += "; ";
    cookies += value;
    return;
  }
  req.insert(name, value);
}

bool H2Request::add_data(std::string_view data) {
  std::string& body = req.body();
  if (body_too_large || body.size() + data.size() > body_limit) {
    body_too_large = true;
    body.clear();
    return false;
  }
  body.append(data);
  return true;
}

std::optional<std::uint64_t> H2Request::declared_length() const {
  auto it = req.find(bhttp::field::content_length);
  if (it == req.end()) return std::nullopt;
  std::uint64_t declared = 0;
  const std::string_view text = it->value();
  const auto [end, err] = std::from_chars(text.data(), text.data() + text.size(), declared);
  if (err != std::errc{} || end != text.data() + text.size()) return std::nullopt;
  return declared;
}

std::optional<Problem> H2Request::finish() {
  std::array<std::string_view, 2> hosts;
  std::size_t host_count = 0;
  for (auto [it, end] = req.equal_range(bhttp::field::host); it != end && host_count < hosts.size(); ++it) {
    hosts[host_count++] = it->value();
  }
  if (!authority.empty()) {
    if (host_count > 1 || (host_count == 1 && !iequals(hosts[0], authority))) {
      return make_problem(400, "bad_request", "The request could not be parsed",
                          "the Host header differs from the request's :authority");
    }
    if (host_count == 0) {
      req.set(bhttp::field::host, authority);
      hosts[0] = req[bhttp::field::host];
      host_count = 1;
    }
  }
  const http::HeadFacts facts{11, req.method_string(), {}, std::span<const std::string_view>(hosts.data(), host_count)};
  if (auto defect = http::check_request_head(facts)) {
    const bool unsupported = defect->status == 501;
    return make_problem(static_cast<int>(defect->status), std::string(defect->code),
                        unsupported ? "The request needs what the gateway does not support"
                                    : "The request could not be parsed",
                        std::move(defect->detail));
  }
  if (!cookies.empty()) req.set(bhttp::field::cookie, cookies);
  req.version(11);
  req.prepare_payload();
  return std::nullopt;
}

nghttp2_nv make_nv(std::string_view name, std::string_view value) {
  return nghttp2_nv{reinterpret_cast<std::uint8_t*>(const_cast<char*>(name.data())),
                    reinterpret_cast<std::uint8_t*>(const_cast<char*>(value.data())), name.size(), value.size(),
                    NGHTTP2_NV_FLAG_NONE};
}

std::string_view lowercase_name(std::string_view name, std::vector<std::string>& storage) {
  const auto upper = [](char c) { return c >= 'A' && c <= 'Z'; };
  if (std::none_of(name.begin(), name.end(), upper)) return name;
  std::string& lowered = storage.emplace_back(name);
  for (char& c : lowered) {
    if (upper(c)) c = static_cast<char>(c + ('a' - 'A'));
  }
  return lowered;
}

bool take_frames(nghttp2_session* session, std::string& out, std::size_t limit) {
  while (out.size() < limit && nghttp2_session_want_write(session) != 0) {
    const std::uint8_t* data = nullptr;
    const ssize_t n = nghttp2_session_mem_send(session, &data);
    if (n < 0) return false;
    if (n == 0) break;
    out.append(reinterpret_cast<const char*>(data), static_cast<std::size_t>(n));
  }
  return true;
}

bool is_connection_specific(std::string_view name) {
  return iequals(name, "connection") || iequals(name, "keep-alive") || iequals(name, "proxy-connection") ||
         iequals(name, "transfer-encoding") || iequals(name, "upgrade");
}

std::vector<nghttp2_nv> response_fields(const bhttp::fields& fields, unsigned status, std::string& status_text,
                                        std::vector<std::string>& names,
                                        std::vector<std::pair<std::string, std::string>>& trailers) {
  status_text = std::to_string(status);
  std::size_t count = 0;
  for (auto it = fields.begin(); it != fields.end(); ++it) ++count;
  names.clear();
  names.reserve(count);  // no reallocation: the fields point into these strings
  std::vector<nghttp2_nv> nv;
  nv.reserve(count + 1);
  nv.push_back(make_nv(":status", status_text));
  for (const auto& field : fields) {
    const std::string_view name = field.name_string();
    if (is_connection_specific(name)) continue;
    if (name.starts_with(grpc::kTrailerPrefix)) {
      trailers.emplace_back(name.substr(grpc::kTrailerPrefix.size()), field.value());
      continue;
    }
    nv.push_back(make_nv(lowercase_name(name, names), field.value()));
  }
  return nv;
}

namespace {

// What a gRPC client acts on when it cannot be told by an HTTP status: how long to wait before
// it may retry a call the gateway refused for now (in use, store unavailable).
constexpr long kDefaultPushbackMs = 1000;

std::optional<grpc::Code> status_of(const bhttp::fields& fields) {
  const std::string trailer = std::string(grpc::kTrailerPrefix) + "grpc-status";
  if (auto it = fields.find(trailer); it != fields.end()) return grpc::parse_status(it->value());
  if (auto it = fields.find("grpc-status"); it != fields.end()) return grpc::parse_status(it->value());  // trailers-only
  return std::nullopt;
}

}  // namespace

http::Response grpc_answer(const Problem& problem) {
  // A "trailers-only" answer: HTTP 200 and the call's status in the one HEADERS frame.
  http::Response res{bhttp::status::ok, 11};
  const grpc::Code code = grpc::code_for_problem(problem.code, problem.status);
  res.set(bhttp::field::content_type, "application/grpc");
  res.set("grpc-status", std::to_string(static_cast<int>(code)));
  res.set("grpc-message", grpc::percent_encode(problem.detail.empty() ? problem.title : problem.title + ": " + problem.detail));
  res.set("idem-problem-code", problem.code);
  if (problem.retry_after_seconds || code == grpc::Code::aborted || code == grpc::Code::unavailable) {
    const long ms = problem.retry_after_seconds ? *problem.retry_after_seconds * 1000 : kDefaultPushbackMs;
    res.set("grpc-retry-pushback-ms", std::to_string(ms));
  }
  res.keep_alive(true);
  return res;
}

GrpcRecord grpc_record_for(const bhttp::fields& fields, std::uint32_t retryable) {
  // No valid grpc-status: the call failed in a way gRPC calls INTERNAL, which is stored unless
  // listed, like any other status.
  const grpc::Code status = status_of(fields).value_or(grpc::Code::internal);
  if ((retryable & (1u << static_cast<unsigned>(status))) != 0) return GrpcRecord::retryable;
  // A server whose deadline fired answers DEADLINE_EXCEEDED while its handler may still run on
  // (gRPC does not stop it): the effect may happen after the answer.
  if (status == grpc::Code::deadline_exceeded) return GrpcRecord::leave_in_progress;
  return GrpcRecord::store;
}

}  // namespace idem::gateway
