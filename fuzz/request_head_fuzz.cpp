// The gateway's request-head checks: Beast's parser, then http::check_request_head with the
// facts the gateway gathers (proxy.cpp head_defect), and split_target.
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>

#include <array>
#include <string>
#include <string_view>
#include <vector>

#include "check.hpp"
#include "idem/http/message.hpp"

namespace bhttp = boost::beast::http;

extern "C" int LLVMFuzzerTestOneInput(const unsigned char* data, std::size_t size) {
  bhttp::request_parser<bhttp::string_body> parser;
  parser.header_limit(16 * 1024);
  parser.body_limit(64 * 1024);
  parser.eager(true);
  boost::beast::error_code ec;
  parser.put(boost::asio::buffer(data, size), ec);
  if (!parser.is_header_done()) return 0;
  const auto& req = parser.get();

  std::array<std::string_view, 2> hosts;
  std::size_t host_count = 0;
  for (auto [it, end] = req.equal_range(bhttp::field::host); it != end && host_count < hosts.size(); ++it) {
    hosts[host_count++] = it->value();
  }
  std::vector<std::string_view> transfer_encodings;
  for (auto [it, end] = req.equal_range(bhttp::field::transfer_encoding); it != end; ++it) {
    transfer_encodings.push_back(it->value());
  }
  const idem::http::HeadFacts facts{req.version(), req.method_string(), transfer_encodings,
                                    std::span<const std::string_view>(hosts.data(), host_count)};
  const auto defect = idem::http::check_request_head(facts);
  if (defect) {
    FUZZ_CHECK(defect->status == 400 || defect->status == 501, "a defect is 400 or 501");
    FUZZ_CHECK(defect->code == (defect->status == 400 ? "bad_request" : "not_implemented"), "code matches status");
    FUZZ_CHECK(!defect->detail.empty(), "a defect says why");
  } else {
    FUZZ_CHECK(req.method_string() != "CONNECT", "CONNECT never passes");
    FUZZ_CHECK(req.version() < 11 || host_count == 1, "HTTP/1.1 passes with exactly one Host");
    FUZZ_CHECK(transfer_encodings.empty() || req.version() >= 11, "no Transfer-Encoding in HTTP/1.0");
  }
  const auto target = idem::http::split_target(req.target());
  FUZZ_CHECK(target.query.find('?') == std::string_view::npos || target.path.find('?') == std::string_view::npos,
             "the path holds no query");
  FUZZ_CHECK(target.path.find('?') == std::string_view::npos, "the path stops at the first '?'");
  return 0;
}
