#include "idem/sidecar/message_http.hpp"

#include <cctype>

namespace idem::sidecar {
namespace {

bool is_token(std::string_view s) {
  if (s.empty()) return false;
  for (const char ch : s) {
    if (std::isalnum(static_cast<unsigned char>(ch))) continue;
    if (std::string_view("!#$%&'*+-.^_`|~").find(ch) != std::string_view::npos) continue;
    return false;
  }
  return true;
}

bool is_field_value(std::string_view s) {
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if ((c < 0x20 && c != '\t') || c == 0x7f) return false;
  }
  return true;
}

}  // namespace

client::HttpRequest message_post(std::string url, std::string_view message_id, std::string_view content_type,
                                 const MessageHeaders& headers, std::string body) {
  client::HttpRequest request;
  request.method = "POST";
  request.url = std::move(url);
  request.body = std::move(body);
  request.headers.push_back({"Idempotency-Key", std::string(message_id)});
  request.headers.push_back({"Content-Type", content_type.empty() ? "application/octet-stream" : std::string(content_type)});
  for (const auto& [name, value] : headers) {
    if (is_token(name) && is_field_value(value)) request.headers.push_back({std::string(kMessageHeaderPrefix) + name, value});
  }
  return request;
}

void sign_message(client::HttpRequest& request, const webhook::StandardSigner& signer, std::string_view message_id,
                  std::int64_t now) {
  for (auto& [name, value] : signer.headers(message_id, now, request.body)) {
    request.headers.push_back({std::move(name), std::move(value)});
  }
}

bool retryable_status(int status) {
  return status == 408 || status == 409 || status == 425 || status == 429 || status >= 500;
}

std::string describe_answer(std::string_view who, int status, std::string_view body) {
  constexpr std::size_t kMax = 200;
  std::string out = std::string(who) + " answered " + std::to_string(status);
  if (body.empty()) return out;
  out += ": ";
  for (const char ch : body.substr(0, kMax)) out.push_back(ch == '\n' || ch == '\r' ? ' ' : ch);
  if (body.size() > kMax) out += "...";
  return out;
}

}  // namespace idem::sidecar
