#include "records.hpp"

#include <algorithm>
#include <limits>

#include "idem/headers_codec.hpp"
#include "schema.hpp"

namespace idem::postgres_detail {

std::int64_t limit_to_db(std::size_t limit) {
  return static_cast<std::int64_t>(std::min<std::size_t>(limit, std::numeric_limits<std::int64_t>::max()));
}

StoreError internal_error(std::string message) { return StoreError{StoreErrc::internal, std::move(message)}; }

std::optional<StoreError> unstorable(std::initializer_list<std::string_view> texts) {
  for (std::string_view text : texts) {
    if (!valid_text(text)) return internal_error("postgres: tenant and key must be valid UTF-8 without NUL bytes");
  }
  return std::nullopt;
}
std::optional<StoreError> unstorable(const RecordId& id) { return unstorable({id.tenant, id.key}); }

// ---- reading results ------------------------------------------------------------------------

StoreResult<Record> read_record(const PGresult* r, int row, int col0, std::string tenant, std::string key) {
  Reader in(r, row);
  auto corrupt = [&](std::string_view what) {
    return std::unexpected(StoreError{StoreErrc::corrupt, "postgres: record (\"" + tenant + "\", \"" + key +
                                                              "\"): " + std::string(what)});
  };
  const auto state = in.null(col0) ? std::nullopt : parse_record_state(in.bytes(col0));
  if (!state) return corrupt("unknown state \"" + std::string(in.bytes(col0)) + "\"");
  Record rec;
  rec.state = *state;
  rec.request_hash = std::string(in.bytes(col0 + 1));
  rec.fencing_token = token_from_db(in.int8(col0 + 2));
  rec.lease_expires = from_epoch_ms(in.int8(col0 + 3));
  rec.created = from_epoch_ms(in.int8(col0 + 7));
  if (!in.null(col0 + 8)) rec.completed = from_epoch_ms(in.int8(col0 + 8));
  rec.expires = from_epoch_ms(in.int8(col0 + 9));
  const std::int64_t attempt = in.int8(col0 + 10);
  if (in.ok() && (attempt < 1 || attempt > UINT32_MAX)) {
    return corrupt("attempt " + std::to_string(attempt) + " out of range");
  }
  rec.attempt = static_cast<std::uint32_t>(attempt);
  rec.lookup = std::string(in.bytes(col0 + 11));
  if (rec.state == RecordState::completed) {
    if (in.null(col0 + 4)) return corrupt("completed without a response status");
    auto headers = decode_headers(in.bytes(col0 + 5));
    if (!headers) return corrupt("response_headers cannot be decoded");
    rec.response = StoredResponse{in.int4(col0 + 4), std::move(*headers), std::string(in.bytes(col0 + 6))};
  }
  if (!in.ok()) return corrupt("a column holds a value of an unexpected size");
  rec.tenant = std::move(tenant);
  rec.key = std::move(key);
  return rec;
}

StoreResult<ClaimResult> parse_claim(const ClaimRequest& req, const PGresult* r) {
  if (PQntuples(r) != 1 || PQnfields(r) != 2 + kRecordColumnCount) {
    return std::unexpected(internal_error("postgres: idem_claim returned an unexpected shape"));
  }
  Reader in(r, 0);
  const std::string_view outcome = in.bytes(0);
  ClaimResult out;
  if (outcome == "claimed") {
    out.status = ClaimStatus::claimed;
    const std::string_view kind = in.bytes(1);
    if (kind == "fresh") {
      out.kind = ClaimKind::fresh;
    } else if (kind == "after_failure") {
      out.kind = ClaimKind::after_failure;
    } else if (kind == "after_lease_expiry") {
      out.kind = ClaimKind::after_lease_expiry;
    } else {
      return std::unexpected(internal_error("postgres: idem_claim returned kind \"" + std::string(kind) + "\""));
    }
  } else if (outcome == "mismatch") {
    out.status = ClaimStatus::mismatch;
  } else if (outcome == "completed") {
    out.status = ClaimStatus::completed;
  } else if (outcome == "in_progress") {
    out.status = ClaimStatus::in_progress;
  } else if (outcome == "outcome_unknown") {
    out.status = ClaimStatus::outcome_unknown;
  } else {
    return std::unexpected(internal_error("postgres: idem_claim returned outcome \"" + std::string(outcome) + "\""));
  }
  auto record = read_record(r, 0, 2, req.id.tenant, req.id.key);
  if (!record) return std::unexpected(record.error());
  out.record = std::move(*record);
  return out;
}

StoreResult<FenceStatus> fenced(const PGresult* r) {
  return affected_rows(r) == 1 ? FenceStatus::ok : FenceStatus::lost;
}

void bind_fence(const Fence& fence, Params& p) {
  p.text(fence.id.tenant);
  p.text(fence.id.key);
  p.int8(token_to_db(fence.token));
}

// ---- requests as the statements bind them ---------------------------------------------------

void bind_claim(const ClaimRequest& req, Params& p) {
  p.text(req.id.tenant);
  p.text(req.id.key);
  p.text(req.request_hash);
  p.int8(token_to_db(req.token));
  p.int8(to_epoch_ms(req.now));
  p.int8(to_epoch_ms(req.lease_expires));
  p.int8(to_epoch_ms(req.expires));
  p.boolean(req.take_over_expired_lease);
  p.text(req.lookup);
}

void bind_complete(const CompleteWrite& w, Params& p) {
  bind_fence(w.req.fence, p);
  p.int4(w.req.response.status);
  p.bytea(w.headers);
  p.bytea(w.req.response.body);
  p.int8(to_epoch_ms(w.req.now));
  p.int8(to_epoch_ms(w.req.expires));
}

}  // namespace idem::postgres_detail
