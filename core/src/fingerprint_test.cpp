#include "idem/fingerprint.hpp"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

namespace idem {
namespace {

// A request with owned storage, viewed as the core sees it.
struct Request {
  std::string method = "POST";
  std::string path = "/payments";
  std::string query;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;

  std::string fp(const FingerprintOptions& options = {}) const {
    std::vector<HeaderView> views;
    for (const auto& [name, value] : headers) views.push_back({name, value});
    return fingerprint(RequestView{method, path, query, views, body}, options);
  }
};

Request json(std::string body, std::string content_type = "application/json") {
  Request r;
  r.headers = {{"Content-Type", std::move(content_type)}};
  r.body = std::move(body);
  return r;
}

TEST(Sha256, KnownVectors) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST(Sha256, IncrementalEqualsOneShot) {
  const std::string data(100000, 'x');
  Sha256 h;
  for (std::size_t i = 0; i < data.size(); i += 777) h.update(std::string_view(data).substr(i, 777));
  EXPECT_EQ(h.hex_digest(), sha256_hex(data));
  Sha256 empty;
  EXPECT_EQ(empty.hex_digest(), sha256_hex(""));
}

TEST(Fingerprint, DocumentedFormat) {
  const Request r = json(R"({ "b": 1, "a": 2 })");
  EXPECT_EQ(r.fp(), sha256_hex("4:POST\n9:/payments\n0:\n0:\n4:json\n13:{\"a\":2,\"b\":1}\n"));

  Request full = json("[1]", "application/problem+json; charset=utf-8");
  full.query = "z=1&a=%7e";
  full.headers.push_back({"X-Tenant", "  t1 "});
  full.headers.push_back({"x-tenant", "t2"});
  FingerprintOptions options;
  options.headers = {"X-TENANT", "Content-Type"};
  EXPECT_EQ(full.fp(options),
            sha256_hex("4:POST\n9:/payments\n7:a=~&z=1\n"
                       "91:8:x-tenant\n2:t1\n8:x-tenant\n2:t2\n"
                       "12:content-type\n39:application/problem+json; charset=utf-8\n\n"
                       "4:json\n3:[1]\n"));

  Request text;
  text.method = "PUT";
  text.path = "/";
  text.body = "hello\n";
  EXPECT_EQ(text.fp(), sha256_hex("3:PUT\n1:/\n0:\n0:\n3:raw\n6:hello\n\n"));
}

TEST(Fingerprint, IsLowercaseHex) {
  const std::string fp = json("{}").fp();
  ASSERT_EQ(fp.size(), 64u);
  EXPECT_EQ(fp.find_first_not_of("0123456789abcdef"), std::string::npos);
}

TEST(Fingerprint, JsonKeyOrderAndWhitespaceDoNotMatter) {
  const std::string a = json(R"({"amount":1000,"currency":"EUR","meta":{"x":1,"y":[1,2]}})").fp();
  EXPECT_EQ(json(R"({ "meta" : { "y" : [ 1 , 2 ] , "x" : 1 } ,
                     "currency" : "EUR" , "amount" : 1000 })")
                .fp(),
            a);
  EXPECT_EQ(json(R"({"amount":1000.0,"currency":"\u0045UR","meta":{"x":1e0,"y":[1,2]}})").fp(), a);
}

TEST(Fingerprint, JsonValuesMatter) {
  const std::string a = json(R"({"amount":1000,"currency":"EUR"})").fp();
  EXPECT_NE(json(R"({"amount":1001,"currency":"EUR"})").fp(), a);
  EXPECT_NE(json(R"({"amount":"1000","currency":"EUR"})").fp(), a);
  EXPECT_NE(json(R"({"amount":1000,"currency":"eur"})").fp(), a);
  EXPECT_NE(json(R"({"amount":1000,"currency":"EUR","x":null})").fp(), a);
  EXPECT_NE(json(R"([1,2])").fp(), json(R"([2,1])").fp());
}

TEST(Fingerprint, JsonIgnoreLeavesPointersOut) {
  FingerprintOptions options;
  options.json_ignore = {"/client_ts", "/meta/trace_id"};
  const std::string a =
      json(R"({"amount":5,"client_ts":"2024-01-01T00:00:00Z","meta":{"trace_id":"a","k":1}})")
          .fp(options);
  EXPECT_EQ(
      json(R"({"amount":5,"client_ts":"2025-06-30T12:00:00Z","meta":{"trace_id":"b","k":1}})")
          .fp(options),
      a);
  EXPECT_EQ(json(R"({"amount":5,"meta":{"k":1}})").fp(options), a);
  EXPECT_NE(json(R"({"amount":6,"client_ts":"x","meta":{"trace_id":"a","k":1}})").fp(options), a);
  // Without the option the timestamp counts.
  EXPECT_NE(json(R"({"amount":5,"client_ts":"2024-01-01T00:00:00Z","meta":{"trace_id":"a","k":1}})")
                .fp(),
            json(R"({"amount":5,"client_ts":"2025-06-30T12:00:00Z","meta":{"trace_id":"a","k":1}})")
                .fp());
}

TEST(Fingerprint, JsonMediaTypes) {
  const std::string a = json(R"({"a":1,"b":2})").fp();
  const std::string b_first = R"({"b":2,"a":1})";
  for (const char* type :
       {"application/json", "application/json; charset=utf-8", "Application/JSON",
        " application/json ;charset=\"x\"", "application/problem+json", "application/vnd.api+json",
        "text/x-custom+JSON"}) {
    EXPECT_EQ(json(b_first, type).fp(), a) << type;
  }
  for (const char* type : {"text/plain", "application/jsonx", "application/json-seq", "+json",
                           "/+json", "application/+jsonx", ""}) {
    EXPECT_NE(json(b_first, type).fp(), a) << type;
  }
  Request no_content_type;
  no_content_type.body = b_first;
  EXPECT_NE(no_content_type.fp(), a);
  // The header name is case-insensitive.
  Request lower = json(b_first);
  lower.headers = {{"content-type", "application/json"}};
  EXPECT_EQ(lower.fp(), a);
}

TEST(Fingerprint, InvalidJsonIsHashedRaw) {
  const std::string invalid = R"({"a":1,"a":2})";
  const Request r = json(invalid);
  EXPECT_NE(r.fp(), json(R"({"a":2})").fp());
  EXPECT_NE(r.fp(), json(R"({"a":1})").fp());
  // Raw: the bytes as sent, so whitespace now matters...
  EXPECT_NE(r.fp(), json(R"({"a":1, "a":2})").fp());
  // ...and it is the same as any other raw body with those bytes.
  EXPECT_EQ(r.fp(), json(invalid, "text/plain").fp());
  EXPECT_NE(json("{\"a\":1} trailing").fp(), json("{\"a\":1}").fp());
}

TEST(Fingerprint, BodyKindIsPartOfTheHash) {
  // A canonical JSON text sent as text/plain is not the same request as that JSON.
  EXPECT_NE(json(R"({"a":1})").fp(), json(R"({"a":1})", "text/plain").fp());
  EXPECT_NE(json("a=1", "application/x-www-form-urlencoded").fp(), json("a=1", "text/plain").fp());
}

TEST(Fingerprint, FormBodiesAreDecodedAndSorted) {
  const std::string type = "application/x-www-form-urlencoded";
  const std::string a = json("amount=10&currency=EUR&note=a+b", type).fp();
  EXPECT_EQ(json("note=a%20b&currency=EUR&amount=10", type).fp(), a);
  EXPECT_EQ(json("currency=%45UR&amount=10&&note=a+b&", type + "; charset=UTF-8").fp(), a);
  EXPECT_NE(json("amount=11&currency=EUR&note=a+b", type).fp(), a);
  EXPECT_NE(json("amount=10&currency=EUR&note=a%2Bb", type).fp(), a);
}

TEST(Fingerprint, QueryOrderDoesNotMatter) {
  Request a = json("{}");
  a.query = "b=2&a=1&a=0";
  Request b = a;
  b.query = "a=0&b=2&a=1";
  EXPECT_EQ(a.fp(), b.fp());
  b.query = "a=0&b=2&a=2";
  EXPECT_NE(a.fp(), b.fp());
  Request none = json("{}");
  Request empty_pair = none;
  empty_pair.query = "&";
  EXPECT_EQ(none.fp(), empty_pair.fp());
}

TEST(Fingerprint, HeadersCountOnlyWhenConfigured) {
  Request a = json("{}");
  a.headers.push_back({"X-Request-Id", "1"});
  a.headers.push_back({"Date", "Mon, 01 Jan 2024 00:00:00 GMT"});
  a.headers.push_back({"X-Tenant", "acme"});
  Request b = json("{}");
  b.headers.push_back({"X-Request-Id", "2"});
  b.headers.push_back({"X-Tenant", "other"});
  EXPECT_EQ(a.fp(), b.fp());  // by default no header counts (Content-Type only picks the kind)

  FingerprintOptions options;
  options.headers = {"x-tenant"};
  EXPECT_NE(a.fp(options), b.fp(options));
  b.headers[2].second = " acme\t";  // values are trimmed
  EXPECT_EQ(a.fp(options), b.fp(options));
  b.headers[2].first = "X-TENANT";  // names are case-insensitive
  EXPECT_EQ(a.fp(options), b.fp(options));

  // Absent and empty differ; every occurrence counts, in order.
  Request absent = json("{}");
  Request empty = json("{}");
  empty.headers.push_back({"X-Tenant", ""});
  EXPECT_NE(absent.fp(options), empty.fp(options));
  Request twice = json("{}");
  twice.headers.push_back({"X-Tenant", "a"});
  twice.headers.push_back({"X-Tenant", "b"});
  Request swapped = json("{}");
  swapped.headers.push_back({"X-Tenant", "b"});
  swapped.headers.push_back({"X-Tenant", "a"});
  Request joined = json("{}");
  joined.headers.push_back({"X-Tenant", "a, b"});
  EXPECT_NE(twice.fp(options), swapped.fp(options));
  EXPECT_NE(twice.fp(options), joined.fp(options));
  EXPECT_NE(twice.fp(options), empty.fp(options));

  // Content-Type can be selected too, then its exact value counts.
  FingerprintOptions with_type;
  with_type.headers = {"Content-Type"};
  EXPECT_NE(json("{}", "application/json").fp(with_type),
            json("{}", "application/json; charset=utf-8").fp(with_type));
  EXPECT_EQ(json("{}", "application/json").fp(), json("{}", "application/json; charset=utf-8").fp());
}

TEST(Fingerprint, MethodAndPathMatter) {
  const Request base = json("{}");
  Request other = base;
  other.method = "PATCH";
  EXPECT_NE(base.fp(), other.fp());
  other = base;
  other.method = "post";
  EXPECT_NE(base.fp(), other.fp());
  other = base;
  other.path = "/payments/";
  EXPECT_NE(base.fp(), other.fp());
  other = base;
  other.path = "/Payments";
  EXPECT_NE(base.fp(), other.fp());
}

TEST(Fingerprint, FramingHasNoCollisions) {
  // Each of these would hash the same bytes if the parts were only joined with "\n".
  std::vector<Request> requests;
  auto add = [&](std::string method, std::string path, std::string query, std::string body,
                 std::vector<std::pair<std::string, std::string>> headers = {}) {
    Request r;
    r.method = std::move(method);
    r.path = std::move(path);
    r.query = std::move(query);
    r.body = std::move(body);
    r.headers = std::move(headers);
    requests.push_back(std::move(r));
  };
  add("POST", "/a\nb=", "", "");
  add("POST", "/a", "b=", "");
  add("POST\n/a", "", "", "");
  add("POST", "/a", "", "\n");
  add("POST", "/a\n", "", "");
  add("POST", "/a", "", "");
  add("POST", "/a", "", "x", {{"X-A", "1"}});
  add("POST", "/a", "", "x-a:1\nx", {});
  add("POST", "/a", "", "", {{"X-A", "1\n6:x-a:2"}});
  add("POST", "/a", "", "", {{"X-A", "1"}, {"X-A", "2"}});
  add("POST", "/a", "", "", {{"X-A", "1:x-b:2"}});
  add("POST", "/a", "", "", {{"X-A", "1"}, {"X-B", "2"}});
  FingerprintOptions options;
  options.headers = {"X-A", "X-B"};
  std::set<std::string> seen;
  for (const Request& r : requests) {
    EXPECT_TRUE(seen.insert(r.fp(options)).second)
        << "collision for method=" << r.method << " path=" << r.path << " body=" << r.body;
  }
}

TEST(Fingerprint, LargeBody) {
  std::string body = "[";
  for (int i = 0; i < 200000; ++i) body += (i ? "," : "") + std::to_string(i);
  body += "]";
  const Request r = json(body);
  EXPECT_EQ(r.fp(), r.fp());
  const Request raw = json(body, "application/octet-stream");
  EXPECT_EQ(raw.fp(), sha256_hex("4:POST\n9:/payments\n0:\n0:\n3:raw\n" +
                                 std::to_string(body.size()) + ":" + body + "\n"));
}

TEST(CanonicalFormUrlencoded, DocumentedExamples) {
  EXPECT_EQ(canonical_form_urlencoded(""), "");
  EXPECT_EQ(canonical_form_urlencoded("a=1&b"), "a=1&b=");
  EXPECT_EQ(canonical_form_urlencoded("b=x+y&a=%7e"), "a=~&b=x%20y");
}

TEST(CanonicalFormUrlencoded, SortsByNameThenValue) {
  EXPECT_EQ(canonical_form_urlencoded("b=2&a=2&a=1&B=0&a="), "B=0&a=&a=1&a=2&b=2");
  EXPECT_EQ(canonical_form_urlencoded("ab=1&a=2&a%00=3"), "a=2&a%00=3&ab=1");
}

TEST(CanonicalFormUrlencoded, NameWithoutEqualsIsEmptyValue) {
  EXPECT_EQ(canonical_form_urlencoded("a"), canonical_form_urlencoded("a="));
  EXPECT_EQ(canonical_form_urlencoded("a=b=c"), "a=b%3Dc");
  EXPECT_EQ(canonical_form_urlencoded("=x"), "=x");
}

TEST(CanonicalFormUrlencoded, DropsEmptyPairs) {
  EXPECT_EQ(canonical_form_urlencoded("&&a=1&&"), "a=1");
  EXPECT_EQ(canonical_form_urlencoded("=&a=1&="), "a=1");
  EXPECT_EQ(canonical_form_urlencoded("&"), "");
}

TEST(CanonicalFormUrlencoded, DecodesAndReencodesUniformly) {
  EXPECT_EQ(canonical_form_urlencoded("q=%e2%82%ac+%2B%20"), "q=%E2%82%AC%20%2B%20");
  EXPECT_EQ(canonical_form_urlencoded("q=\xE2\x82\xAC"), "q=%E2%82%AC");
  EXPECT_EQ(canonical_form_urlencoded("k=-._~AZaz09!*'()"), "k=-._~AZaz09%21%2A%27%28%29");
  EXPECT_EQ(canonical_form_urlencoded("%61=%62"), "a=b");
}

TEST(CanonicalFormUrlencoded, KeepsMalformedEscapesLiterally) {
  EXPECT_EQ(canonical_form_urlencoded("a=%"), "a=%25");
  EXPECT_EQ(canonical_form_urlencoded("a=%4"), "a=%254");
  EXPECT_EQ(canonical_form_urlencoded("a=%zz1"), "a=%25zz1");
  EXPECT_EQ(canonical_form_urlencoded("a=%%41"), "a=%25A");
  EXPECT_EQ(canonical_form_urlencoded("a=100%"), canonical_form_urlencoded("a=100%25"));
}

// A multipart/form-data body as curl -F writes it, with the boundary given.
Request multipart(const std::string& boundary, const std::string& amount, const std::string& file = "hello\n",
                  const std::string& extra_part_header = "") {
  Request r;
  r.headers = {{"Content-Type", "multipart/form-data; boundary=" + boundary}};
  r.body = "--" + boundary + "\r\n" +
           "Content-Disposition: form-data; name=\"amount\"\r\n\r\n" + amount + "\r\n" +
           "--" + boundary + "\r\n" +
           "Content-Disposition: form-data; name=\"receipt\"; filename=\"r.txt\"\r\n" + extra_part_header +
           "Content-Type: text/plain\r\n\r\n" + file + "\r\n" +
           "--" + boundary + "--\r\n";
  return r;
}

TEST(Fingerprint, MultipartIgnoresTheBoundary) {
  const auto a = multipart("------------------------a1b2c3d4e5f6a7b8", "1000");
  const auto b = multipart("------------------------0f9e8d7c6b5a4f3e", "1000");
  EXPECT_NE(a.body, b.body);
  EXPECT_EQ(a.fp(), b.fp());
  // A quoted boundary parameter, other parameters, a preamble and an epilogue change nothing.
  auto c = multipart("xyz-boundary", "1000");
  c.headers = {{"Content-Type", "Multipart/Form-Data; charset=utf-8; boundary=\"xyz-boundary\""}};
  c.body = "preamble to ignore\r\n" + c.body + "epilogue";
  EXPECT_EQ(a.fp(), c.fp());
  // Part headers that do not identify the part do not count either.
  EXPECT_EQ(a.fp(), multipart("b2", "1000", "hello\n", "X-Client-Part-Id: 77\r\n").fp());
}

TEST(Fingerprint, MultipartPartsMatter) {
  const auto base = multipart("b1", "1000").fp();
  EXPECT_NE(base, multipart("b1", "5000").fp());              // a field's value
  EXPECT_NE(base, multipart("b1", "1000", "hello!\n").fp());  // a file's content
  auto renamed = multipart("b1", "1000");
  renamed.body.replace(renamed.body.find("r.txt"), 5, "s.txt");  // a filename
  EXPECT_NE(base, renamed.fp());
  auto retyped = multipart("b1", "1000");
  retyped.body.replace(retyped.body.find("text/plain"), 10, "text/csv!!");
  EXPECT_NE(base, retyped.fp());
  auto field = multipart("b1", "1000");
  field.body.replace(field.body.find("name=\"amount\""), 13, "name=\"amounT\"");  // a part's name
  EXPECT_NE(base, field.fp());
}

TEST(Fingerprint, MultipartPartOrderMatters) {
  Request r;
  r.headers = {{"Content-Type", "multipart/form-data; boundary=q"}};
  const std::string x = "--q\r\nContent-Disposition: form-data; name=\"x\"\r\n\r\n1\r\n";
  const std::string y = "--q\r\nContent-Disposition: form-data; name=\"y\"\r\n\r\n2\r\n";
  r.body = x + y + "--q--";
  Request swapped = r;
  swapped.body = y + x + "--q--";
  EXPECT_NE(r.fp(), swapped.fp());
}

TEST(Fingerprint, MalformedMultipartIsHashedRaw) {
  auto unclosed = multipart("b1", "1000");
  unclosed.body.resize(unclosed.body.rfind("--b1--"));
  auto other = unclosed;
  other.headers = {{"Content-Type", "application/octet-stream"}};
  EXPECT_EQ(unclosed.fp(), other.fp());  // the raw bytes, like any unparsed body
  auto no_boundary = multipart("b1", "1000");
  no_boundary.headers = {{"Content-Type", "multipart/form-data"}};
  auto raw = no_boundary;
  raw.headers = {{"Content-Type", "text/plain"}};
  EXPECT_EQ(no_boundary.fp(), raw.fp());
}

TEST(CanonicalMultipart, DocumentedForm) {
  static constexpr char kBody[] =
      "--b\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\nv\r\n"
      "--b\r\ncontent-disposition: FORM-DATA; name=\"f\"; filename=\"x \\\"q\\\".bin\"\r\n"
      "Content-Type: Application/Octet-Stream\r\nContent-Transfer-Encoding: BINARY\r\n\r\n\x00\x01\r\n"
      "--b--";
  const std::string body(kBody, sizeof kBody - 1);  // it holds a NUL byte
  const auto c = canonical_multipart(body, "b");
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(*c, std::string("4:part\n9:form-data\n1:a\n1:0\n0:\n1:0\n0:\n0:\n0:\n1:v\n"
                            "4:part\n9:form-data\n1:f\n1:1\n9:x \"q\".bin\n1:0\n0:\n24:application/octet-stream\n6:binary\n2:") +
                    std::string("\x00\x01", 2) + "\n");
  EXPECT_EQ(canonical_multipart("--b--", "b"), std::string());  // no parts
  EXPECT_FALSE(canonical_multipart("--b\r\nno blank line", "b").has_value());
  EXPECT_FALSE(canonical_multipart("nothing here", "b").has_value());
  EXPECT_FALSE(canonical_multipart("--b--", "").has_value());
}

}  // namespace
}  // namespace idem
