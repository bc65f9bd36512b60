#include "idem/http/beast.hpp"

#include <gtest/gtest.h>

#include <boost/beast/http/read.hpp>
#include <boost/beast/http/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <sstream>

#include "idem/engine.hpp"
#include "idem/fingerprint.hpp"
#include "idem/http/message.hpp"

namespace idem::http {
namespace {

std::string serialize(const Response& res) {
  std::ostringstream out;
  out << res;
  return out.str();
}

std::string header(const Response& res, std::string_view name) {
  auto it = res.find(name);
  return it == res.end() ? std::string("<absent>") : std::string(it->value());
}

TEST(BeastRequestView, SplitsTargetAndBorrowsHeaders) {
  Request req{bhttp::verb::post, "/v1/payments?b=2&a=1", 11};
  req.set("Idempotency-Key", "\"key-0123456789abcdef\"");
  req.insert("X-Dup", "1");
  req.insert("X-Dup", "2");
  req.body() = R"({"amount":100})";
  BeastRequestView holder;
  const RequestView& v = holder.assign(req);
  EXPECT_EQ(v.method, "POST");
  EXPECT_EQ(v.path, "/v1/payments");
  EXPECT_EQ(v.query, "b=2&a=1");
  EXPECT_EQ(v.body, R"({"amount":100})");
  ASSERT_EQ(v.headers.size(), 3u);
  EXPECT_EQ(v.headers[0].name, "Idempotency-Key");
  EXPECT_EQ(v.headers[2].value, "2");
  EXPECT_EQ(find_header(v.headers, "idempotency-key"), "\"key-0123456789abcdef\"");

  // Reuse for another request: nothing of the first remains.
  Request other{bhttp::verb::patch, "/x", 11};
  holder.assign(other);
  EXPECT_EQ(holder.view().method, "PATCH");
  EXPECT_TRUE(holder.view().headers.empty());
}

TEST(BeastRequestView, SameFingerprintAsAHandBuiltView) {
  Request req{bhttp::verb::post, "/p?a=1", 11};
  req.set("Content-Type", "application/json");
  req.body() = R"({"b":1,"a":2})";
  BeastRequestView holder;
  const HeaderView headers[] = {{"Content-Type", "application/json"}};
  RequestView manual{"POST", "/p", "a=1", headers, R"({"a":2,"b":1})"};
  EXPECT_EQ(fingerprint(holder.assign(req)), fingerprint(manual));
}

TEST(ProblemResponse, InUseCarriesRetryAfter) {
  Decision d;
  d.verdict = Verdict::in_use;
  d.retry_after = std::chrono::seconds(3);
  d.detail = "busy";
  const auto res = problem_response(*problem_for(d), 11, true);
  EXPECT_EQ(res.result_int(), 409u);
  EXPECT_EQ(header(res, "Content-Type"), "application/problem+json");
  EXPECT_EQ(header(res, "Retry-After"), "3");
  EXPECT_EQ(header(res, "X-Idempotency-Conflict"), "<absent>");
  EXPECT_NE(res.body().find("\"code\":\"idempotency_key_in_use\""), std::string::npos);
  EXPECT_EQ(header(res, "Content-Length"), std::to_string(res.body().size()));
  EXPECT_TRUE(res.keep_alive());
}

TEST(ProblemResponse, MismatchCarriesConflictHeader) {
  Decision d;
  d.verdict = Verdict::mismatch;
  const auto res = problem_response(*problem_for(d), 11, false);
  EXPECT_EQ(res.result_int(), 422u);
  EXPECT_EQ(header(res, "X-Idempotency-Conflict"), "true");
  EXPECT_EQ(header(res, "Retry-After"), "<absent>");
  EXPECT_FALSE(res.keep_alive());
  EXPECT_NE(serialize(res).find("Connection: close"), std::string::npos);
}

TEST(ProblemResponse, AnyStatus) {
  const auto res = problem_response(make_problem(504, "upstream_timeout", "t", "d"), 11, true);
  EXPECT_EQ(res.result_int(), 504u);
  const auto odd = problem_response(make_problem(599, "x", "t", "d"), 10, false);
  EXPECT_EQ(odd.result_int(), 599u);
}

TEST(ProblemResponse, UnauthorizedCarriesWwwAuthenticate) {
  Problem p = make_problem(401, "token_invalid", "t", "d");
  EXPECT_EQ(header(problem_response(p, 11, true), "WWW-Authenticate"), "<absent>");
  p.www_authenticate = "Bearer error=\"invalid_token\"";
  const auto res = problem_response(p, 11, true);
  EXPECT_EQ(res.result_int(), 401u);
  EXPECT_EQ(header(res, "WWW-Authenticate"), "Bearer error=\"invalid_token\"");
  EXPECT_EQ(header(res, "Content-Type"), "application/problem+json");
}

TEST(ReplayResponse, SameStatusHeadersAndBodyPlusMarker) {
  StoredResponse stored;
  stored.status = 201;
  stored.headers = {{"Content-Type", "application/json"}, {"Set-Cookie", "a=1"}, {"Set-Cookie", "b=2"},
                    {"Date", "Mon, 01 Jan 2024 00:00:00 GMT"}};
  stored.body = std::string("{\"id\":1}\0tail", 13);
  const auto res = replay_response(stored, 11, true);
  EXPECT_EQ(res.result_int(), 201u);
  EXPECT_EQ(res.body(), stored.body);
  EXPECT_EQ(header(res, "Idempotent-Replayed"), "true");
  EXPECT_EQ(header(res, "Content-Length"), "13");
  EXPECT_EQ(header(res, "Date"), "Mon, 01 Jan 2024 00:00:00 GMT");
  std::vector<std::string> cookies;
  for (auto [it, end] = res.equal_range(bhttp::field::set_cookie); it != end; ++it) cookies.emplace_back(it->value());
  EXPECT_EQ(cookies, (std::vector<std::string>{"a=1", "b=2"}));
}

TEST(ReplayResponse, NeverReplaysFramingOrHopByHop) {
  StoredResponse stored;
  stored.status = 200;
  stored.headers = {{"Transfer-Encoding", "chunked"}, {"Content-Length", "999"}, {"Connection", "close"},
                    {"Idempotent-Replayed", "false"}, {"X-Ok", "1"}};
  stored.body = "abc";
  const auto res = replay_response(stored, 11, true);
  EXPECT_EQ(header(res, "Transfer-Encoding"), "<absent>");
  EXPECT_EQ(header(res, "Content-Length"), "3");
  EXPECT_EQ(header(res, "Idempotent-Replayed"), "true");
  EXPECT_EQ(header(res, "X-Ok"), "1");
  EXPECT_TRUE(res.keep_alive());
}

TEST(ToStoredResponse, KeepsOnlyEndToEndHeaders) {
  bhttp::response<bhttp::string_body> res{bhttp::status::created, 11};
  res.set("Content-Type", "application/json");
  res.set("Connection", "keep-alive, X-Hop");
  res.set("X-Hop", "secret");
  res.set("Keep-Alive", "timeout=5");
  res.set("Transfer-Encoding", "chunked");
  res.set("Content-Length", "2");
  res.set("Idempotent-Replayed", "true");
  res.set("Location", "/v1/payments/1");
  const auto stored = to_stored_response(res.base(), res.result_int(), "{}");
  EXPECT_EQ(stored.status, 201);
  EXPECT_EQ(stored.body, "{}");
  EXPECT_EQ(stored.headers, (Headers{{"Content-Type", "application/json"}, {"Location", "/v1/payments/1"}}));
}

TEST(StripHopByHop, RemovesListedAndStandardHeaders) {
  Request req{bhttp::verb::post, "/", 11};
  req.set("Connection", "X-A, keep-alive");
  req.insert("Connection", "X-B");
  req.set("X-A", "1");
  req.set("X-B", "2");
  req.set("Keep-Alive", "300");
  req.set("TE", "trailers");
  req.set("Upgrade", "websocket");
  req.set("Proxy-Authorization", "Basic x");
  req.set("Authorization", "Bearer y");
  req.set("Idempotency-Key", "k");
  strip_hop_by_hop(req.base());
  std::vector<std::string> left;
  for (const auto& f : req) left.emplace_back(f.name_string());
  EXPECT_EQ(left, (std::vector<std::string>{"Authorization", "Idempotency-Key"}));
}


// What Beast's own serializer writes for `message`, up to and including the blank line.
template <class Message>
std::string beast_head(const Message& message) {
  std::ostringstream wire;
  wire << message;
  const std::string all = wire.str();
  return all.substr(0, all.find("\r\n\r\n") + 4);
}

TEST(AppendHead, RequestIsWhatBeastWrites) {
  Request req{bhttp::verb::post, "/v1/payments?x=1", 11};
  req.set(bhttp::field::host, "api.example");
  req.insert("X-Custom", "a, b");
  req.insert("x-custom", "c");
  req.body() = "{\"amount\":1}";
  req.prepare_payload();
  std::string head = "left alone|";
  append_head(head, req.base());
  EXPECT_EQ(head, "left alone|" + beast_head(req));
  EXPECT_EQ(head.substr(11, 36), "POST /v1/payments?x=1 HTTP/1.1\r\nHost");

  Request old{bhttp::verb::get, "/", 10};
  std::string old_head;
  append_head(old_head, old.base());
  EXPECT_EQ(old_head, "GET / HTTP/1.0\r\n\r\n");
  EXPECT_EQ(old_head, beast_head(old));
}

TEST(AppendHead, ResponseIsWhatBeastWrites) {
  Response res{bhttp::status::created, 11};
  res.set(bhttp::field::content_type, "application/json");
  res.set(bhttp::field::location, "/v1/payments/pay_1");
  res.body() = "{}";
  res.prepare_payload();
  std::string head;
  append_head(head, res.base());
  EXPECT_EQ(head, beast_head(res));
  EXPECT_EQ(head.substr(0, 22), "HTTP/1.1 201 Created\r\n");

  // A reason phrase as the upstream sent it, and a status Beast has no name for.
  Response custom{bhttp::status::ok, 10};
  custom.reason("All Good");
  Response unknown;
  unknown.result(599);
  unknown.version(11);
  unknown.content_length(0);
  for (const Response* r : {&custom, &unknown}) {
    std::string h;
    append_head(h, r->base());
    EXPECT_EQ(h, beast_head(*r));
  }
  std::string h;
  append_head(h, custom.base());
  EXPECT_EQ(h, "HTTP/1.0 200 All Good\r\n\r\n");
}

}  // namespace
}  // namespace idem::http
