#include "idem/http/beast.hpp"

#include <algorithm>
#include <string>

#include "idem/http/message.hpp"

namespace idem::http {
namespace {

// The tokens of every Connection field; `found` says whether there was one. A scan comparing
// field codes: for the handful of fields a message has it is cheaper than the field set's
// case-insensitive tree lookup.
ConnectionTokens connection_tokens(const bhttp::fields& fields, bool* found = nullptr) {
  ConnectionTokens tokens;
  for (const auto& f : fields) {
    if (f.name() != bhttp::field::connection) continue;
    tokens.add(f.value());
    if (found) *found = true;
  }
  return tokens;
}

void append_version(std::string& out, unsigned version) {
  out += "HTTP/";
  out += static_cast<char>('0' + version / 10 % 10);
  out += '.';
  out += static_cast<char>('0' + version % 10);
}

void append_fields(std::string& out, const bhttp::fields& fields) {
  for (const auto& f : fields) {
    out += f.name_string();
    out += ": ";
    out += f.value();
    out += "\r\n";
  }
  out += "\r\n";
}

}  // namespace

void append_head(std::string& out, const bhttp::request_header<>& header) {
  out += header.method_string();
  out += ' ';
  out += header.target();
  out += ' ';
  append_version(out, header.version());
  out += "\r\n";
  append_fields(out, header);
}

void append_head(std::string& out, const bhttp::response_header<>& header) {
  append_version(out, header.version());
  const unsigned status = header.result_int();
  const char digits[] = {' ', static_cast<char>('0' + status / 100 % 10), static_cast<char>('0' + status / 10 % 10),
                         static_cast<char>('0' + status % 10), ' '};
  out.append(digits, sizeof digits);
  // Like Beast's serializer: the reason phrase received, or the standard one for the status.
  const auto reason = header.reason();
  out += reason.empty() ? bhttp::obsolete_reason(header.result()) : reason;
  out += "\r\n";
  append_fields(out, header);
}

const RequestView& BeastRequestView::assign(const Request& request) {
  headers_.clear();
  for (const auto& f : request) headers_.push_back(HeaderView{f.name_string(), f.value()});
  const Target target = split_target(request.target());
  view_.method = request.method_string();
  view_.path = target.path;
  view_.query = target.query;
  view_.headers = headers_;
  view_.body = request.body();
  return view_;
}

Response problem_response(const Problem& problem, unsigned version, bool keep_alive) {
  return problem_response(problem, *ErrorEnvelope::problem_json(), version, keep_alive);
}

Response problem_response(const Problem& problem, const ErrorEnvelope& envelope, unsigned version, bool keep_alive) {
  Response res;
  res.result(static_cast<unsigned>(problem.status));
  res.version(version);
  res.set(bhttp::field::content_type, envelope.content_type());
  res.set(bhttp::field::cache_control, "no-store");
  if (problem.retry_after_seconds) {
    res.set(bhttp::field::retry_after, std::to_string(*problem.retry_after_seconds));
  }
  if (problem.conflict) res.set(kConflictHeader, "true");
  if (problem.www_authenticate) res.set(bhttp::field::www_authenticate, *problem.www_authenticate);
  res.body() = envelope.body(problem);
  res.keep_alive(keep_alive);
  res.prepare_payload();
  return res;
}

Response replay_response(const StoredResponse& stored, unsigned version, bool keep_alive) {
  Response res;
  res.result(static_cast<unsigned>(stored.status));
  res.version(version);
  for (const auto& h : stored.headers) {
    // Stores only ever hold what to_stored_response kept; filtering again makes a record written
    // by another tool harmless.
    if (is_hop_by_hop(h.name) || iequals(h.name, "Content-Length") || iequals(h.name, kReplayedHeader)) {
      continue;
    }
    res.insert(h.name, h.value);
  }
  res.set(kReplayedHeader, "true");
  res.body() = stored.body;
  res.keep_alive(keep_alive);
  res.prepare_payload();
  return res;
}

StoredResponse to_stored_response(const bhttp::fields& fields, unsigned status, std::string_view body) {
  StoredResponse stored;
  stored.status = static_cast<int>(status);
  const ConnectionTokens tokens = connection_tokens(fields);
  // Counted first: the vector is kept for as long as the record, at exactly its size.
  const auto kept = std::count_if(fields.begin(), fields.end(),
                                  [&](const auto& f) { return is_stored(f.name_string(), tokens); });
  stored.headers.reserve(static_cast<std::size_t>(kept));
  for (const auto& f : fields) {
    if (is_stored(f.name_string(), tokens)) {
      stored.headers.push_back(Header{std::string(f.name_string()), std::string(f.value())});
    }
  }
  stored.body.assign(body);
  return stored;
}

void strip_hop_by_hop(bhttp::fields& fields) {
  // The tokens borrow the Connection values: erase everything else first, Connection last.
  // No allocation: this runs on every forwarded request and response.
  bool has_connection = false;
  const ConnectionTokens tokens = connection_tokens(fields, &has_connection);
  for (auto it = fields.begin(); it != fields.end();) {
    if (it->name() != bhttp::field::connection && !is_forwarded(it->name_string(), tokens)) {
      it = fields.erase(it);
    } else {
      ++it;
    }
  }
  if (has_connection) fields.erase(bhttp::field::connection);
}

}  // namespace idem::http
