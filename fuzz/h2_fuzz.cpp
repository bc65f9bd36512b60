// The gateway's HTTP/2 and gRPC framing paths, without a socket: the input is what a client sends
// after the connection preface, fed to an nghttp2 server session set up as the gateway's
// (h2_session.cpp: the same settings, stream reset rate limit and callbacks' work), whose request
// streams are assembled by the gateway's own code (h2_message.cpp: H2Request). Each complete
// request is answered as the gateway would: a gRPC call with its trailers-only refusal
// (grpc_answer) or a stored-looking answer with trailers, a refused one (431, 413, 400) with its
// problem, any other with a 200 carrying "trailer:" fields, through response_fields and a data
// source, and the session's output is drained.
//
// Properties: nothing crashes or leaks (ASan, UBSan); a request that assembles has a method, a
// target and at most one Host, equal to its :authority when both were sent; a header list kept
// whole never exceeds max_header; a body kept never exceeds its limit; every gRPC answer carries
// a valid grpc-status; grpc_record_for decides on any fields.
#include <nghttp2/nghttp2.h>

#include <cstring>
#include <map>
#include <memory>
#include <string>

#include "../gateway/src/h2_message.hpp"
#include "check.hpp"
#include "idem/gateway/grpc.hpp"

namespace {

using idem::gateway::H2Request;
namespace bhttp = boost::beast::http;
namespace grpc = idem::gateway::grpc;

constexpr std::size_t kMaxHeader = 1024;  // small, so that the 431 path is reached
constexpr std::size_t kBodyLimit = 512;
constexpr std::string_view kPreface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

struct Answer {
  std::string body;
  std::size_t sent = 0;
  std::vector<std::pair<std::string, std::string>> trailers;
};

struct Connection {
  nghttp2_session* session = nullptr;
  std::map<std::int32_t, std::unique_ptr<H2Request>> requests;
  std::map<std::int32_t, std::unique_ptr<Answer>> answers;
};

ssize_t read_answer(nghttp2_session* session, std::int32_t stream_id, std::uint8_t* buf, std::size_t length,
                    std::uint32_t* flags, nghttp2_data_source* source, void*) {
  auto* answer = static_cast<Answer*>(source->ptr);
  const std::size_t n = std::min(length, answer->body.size() - answer->sent);
  std::memcpy(buf, answer->body.data() + answer->sent, n);
  answer->sent += n;
  if (answer->sent == answer->body.size()) {
    *flags |= NGHTTP2_DATA_FLAG_EOF;
    if (!answer->trailers.empty()) {
      std::vector<nghttp2_nv> nv;
      for (const auto& [name, value] : answer->trailers) nv.push_back(idem::gateway::make_nv(name, value));
      if (nghttp2_submit_trailer(session, stream_id, nv.data(), nv.size()) == 0) *flags |= NGHTTP2_DATA_FLAG_NO_END_STREAM;
    }
  }
  return static_cast<ssize_t>(n);
}

void respond(Connection& c, std::int32_t id, idem::http::Response& res) {
  auto answer = std::make_unique<Answer>();
  std::string status_text;
  std::vector<std::string> names;
  const std::vector<nghttp2_nv> nv =
      idem::gateway::response_fields(res.base(), res.result_int(), status_text, names, answer->trailers);
  for (const auto& field : nv) {
    const std::string_view name(reinterpret_cast<const char*>(field.name), field.namelen);
    FUZZ_CHECK(!name.starts_with(grpc::kTrailerPrefix), "a trailer among the response head's fields");
    FUZZ_CHECK(!idem::gateway::is_connection_specific(name), "a connection-specific field in an HTTP/2 response");
  }
  answer->body = std::move(res.body());
  nghttp2_data_provider provider{};
  provider.source.ptr = answer.get();
  provider.read_callback = read_answer;
  const bool with_body = !answer->body.empty() || !answer->trailers.empty();
  if (nghttp2_submit_response(c.session, id, nv.data(), nv.size(), with_body ? &provider : nullptr) == 0) {
    c.answers[id] = std::move(answer);
  }
}

void complete(Connection& c, std::int32_t id) {
  auto it = c.requests.find(id);
  if (it == c.requests.end()) return;
  H2Request& request = *it->second;
  FUZZ_CHECK(request.req.body().size() <= request.body_limit, "a body kept beyond its limit");
  if (!request.header_too_large) FUZZ_CHECK(request.header_bytes <= kMaxHeader, "a header list kept beyond max_header");
  const bool grpc_call = grpc::is_grpc_content_type(request.req[bhttp::field::content_type]);
  std::optional<idem::Problem> refusal;
  if (request.header_too_large) {
    refusal = idem::make_problem(431, "request_header_too_large", "The request header is too large", "");
  } else if (request.body_too_large) {
    refusal = idem::request_too_large("too large");
  } else {
    refusal = request.finish();
  }
  if (!refusal) {
    // Assembled: what the Handler would see.
    FUZZ_CHECK(!request.req.method_string().empty(), "an assembled request without a method");
    std::size_t hosts = 0;
    for (auto [h, end] = request.req.equal_range(bhttp::field::host); h != end; ++h) {
      ++hosts;
      if (!request.authority.empty()) FUZZ_CHECK(idem::iequals(h->value(), request.authority), "Host differs from :authority");
    }
    FUZZ_CHECK(hosts == 1, "an assembled request without exactly one Host");  // check_request_head demands one for an HTTP/1.1 request
  }
  idem::http::Response res;
  if (grpc_call) {
    const idem::Problem problem = refusal ? *refusal : idem::make_problem(409, "idempotency_key_in_use", "In use", "");
    res = idem::gateway::grpc_answer(problem);
    FUZZ_CHECK(grpc::parse_status(res["grpc-status"]).has_value(), "a gRPC answer without a valid grpc-status");
    (void)idem::gateway::grpc_record_for(res.base(), grpc::kDefaultRetryable);
    if (auto timeout = request.req.find("grpc-timeout"); timeout != request.req.end()) {
      (void)grpc::parse_timeout(timeout->value());
    }
  } else if (refusal) {
    res = idem::http::Response{static_cast<bhttp::status>(refusal->status), 11};
    res.body() = idem::problem_json(*refusal);
  } else {
    // An upstream's answer with trailers, as an HTTP/2 upstream's is kept, fields from the request
    // echoed (any bytes a client may send reach the response path).
    res = idem::http::Response{bhttp::status::ok, 11};
    for (const auto& field : request.req) res.insert(field.name_string(), field.value());
    res.insert(std::string(grpc::kTrailerPrefix) + "grpc-status", "0");
    res.body() = request.req.body();
    (void)idem::gateway::grpc_record_for(res.base(), grpc::kDefaultRetryable);
  }
  respond(c, id, res);
  c.requests.erase(it);
}

int on_begin_headers(nghttp2_session*, const nghttp2_frame* frame, void* self) {
  auto& c = *static_cast<Connection*>(self);
  if (frame->hd.type != NGHTTP2_HEADERS || frame->headers.cat != NGHTTP2_HCAT_REQUEST) return 0;
  auto request = std::make_unique<H2Request>();
  request->body_limit = kBodyLimit;
  c.requests[frame->hd.stream_id] = std::move(request);
  return 0;
}

int on_header(nghttp2_session*, const nghttp2_frame* frame, const std::uint8_t* name, std::size_t namelen,
              const std::uint8_t* value, std::size_t valuelen, std::uint8_t, void* self) {
  auto& c = *static_cast<Connection*>(self);
  auto it = c.requests.find(frame->hd.stream_id);
  if (it == c.requests.end()) return 0;
  it->second->add_field(std::string_view(reinterpret_cast<const char*>(name), namelen),
                        std::string_view(reinterpret_cast<const char*>(value), valuelen),
                        frame->headers.cat != NGHTTP2_HCAT_REQUEST, kMaxHeader);
  return 0;
}

int on_data_chunk(nghttp2_session*, std::uint8_t, std::int32_t stream_id, const std::uint8_t* data, std::size_t len,
                  void* self) {
  auto& c = *static_cast<Connection*>(self);
  auto it = c.requests.find(stream_id);
  if (it == c.requests.end()) return 0;
  if (!it->second->add_data(std::string_view(reinterpret_cast<const char*>(data), len))) complete(c, stream_id);
  return 0;
}

int on_frame_recv(nghttp2_session*, const nghttp2_frame* frame, void* self) {
  auto& c = *static_cast<Connection*>(self);
  if ((frame->hd.type == NGHTTP2_HEADERS || frame->hd.type == NGHTTP2_DATA) &&
      (frame->hd.flags & NGHTTP2_FLAG_END_STREAM) != 0) {
    complete(c, frame->hd.stream_id);
  }
  return 0;
}

int on_stream_close(nghttp2_session*, std::int32_t stream_id, std::uint32_t, void* self) {
  auto& c = *static_cast<Connection*>(self);
  c.requests.erase(stream_id);
  c.answers.erase(stream_id);
  return 0;
}

void drain(Connection& c) {
  for (int i = 0; i < 1000 && nghttp2_session_want_write(c.session) != 0; ++i) {
    const std::uint8_t* out = nullptr;
    if (nghttp2_session_mem_send(c.session, &out) <= 0) break;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Connection c;
  nghttp2_session_callbacks* callbacks = nullptr;
  nghttp2_session_callbacks_new(&callbacks);
  nghttp2_session_callbacks_set_on_begin_headers_callback(callbacks, on_begin_headers);
  nghttp2_session_callbacks_set_on_header_callback(callbacks, on_header);
  nghttp2_session_callbacks_set_on_data_chunk_recv_callback(callbacks, on_data_chunk);
  nghttp2_session_callbacks_set_on_frame_recv_callback(callbacks, on_frame_recv);
  nghttp2_session_callbacks_set_on_stream_close_callback(callbacks, on_stream_close);
  nghttp2_option* option = nullptr;
  nghttp2_option_new(&option);
  nghttp2_option_set_stream_reset_rate_limit(option, 1000, 33);  // the gateway's
  nghttp2_session_server_new2(&c.session, callbacks, &c, option);
  nghttp2_option_del(option);
  nghttp2_session_callbacks_del(callbacks);
  const nghttp2_settings_entry settings[] = {
      {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, 8},
      {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, 4096},
      {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, kMaxHeader},
  };
  nghttp2_submit_settings(c.session, NGHTTP2_FLAG_NONE, settings, std::size(settings));
  drain(c);
  // The preface, then the input in two pieces (where it splits is the input's first byte), so
  // that frames cut across reads are fed as the gateway feeds them.
  nghttp2_session_mem_recv(c.session, reinterpret_cast<const std::uint8_t*>(kPreface.data()), kPreface.size());
  const std::size_t cut = size > 0 ? std::min<std::size_t>(data[0], size - 1) + 1 : 0;
  if (nghttp2_session_mem_recv(c.session, data, cut) >= 0) {
    drain(c);
    if (nghttp2_session_mem_recv(c.session, data + cut, size - cut) >= 0) drain(c);
  }
  drain(c);
  nghttp2_session_del(c.session);
  return 0;
}
