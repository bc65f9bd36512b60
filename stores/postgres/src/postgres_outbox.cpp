#include "idem/postgres_outbox.hpp"

#include <algorithm>
#include <limits>
#include <string_view>
#include <utility>

#include "connection.hpp"
#include "errors.hpp"
#include "idem/redact.hpp"
#include "records.hpp"
#include "schema.hpp"

namespace idem {

namespace pd = postgres_detail;

namespace {

using pd::internal_error;
using pd::limit_to_db;

// Text as the server takes it: a broker's error message may hold any bytes, and one the server
// refuses would fail the whole settle. Offending bytes become '?'.
std::string storable(std::string_view text) {
  if (pd::valid_text(text)) return std::string(text);
  std::string out(text);
  for (char& c : out) {
    if (c == '\0' || static_cast<unsigned char>(c) >= 0x80) c = '?';
  }
  return out;
}

// A text[] literal: {"a","b"}, each element quoted with its quotes and backslashes escaped.
std::string text_array(const std::vector<std::string>& items) {
  std::string out = "{";
  for (const std::string& item : items) {
    if (out.size() > 1) out += ',';
    out += '"';
    for (const char c : item) {
      if (c == '"' || c == '\\') out += '\\';
      out += c;
    }
    out += '"';
  }
  return out + "}";
}

std::string hex_bytea(std::string_view bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "\\x";
  out.reserve(2 + bytes.size() * 2);
  for (const char ch : bytes) {
    const auto c = static_cast<unsigned char>(ch);
    out += kHex[c >> 4];
    out += kHex[c & 0xf];
  }
  return out;
}

std::optional<OutboxState> parse_state(std::string_view s) {
  if (s == "pending") return OutboxState::pending;
  if (s == "sent") return OutboxState::sent;
  if (s == "dead") return OutboxState::dead;
  return std::nullopt;
}

// What decode_row reads, in this order (binary results).
constexpr std::string_view kColumns =
    "id, message_id, destination, content_type, headers::text, body, state, created_ms, attempts, "
    "next_attempt_ms, last_error, sent_ms, ordering_key, key_seq";

// Row `i` of a result with kColumns, or why it cannot be read.
std::expected<OutboxRow, std::string> decode_row(const PGresult* r, int i) {
  pd::Reader in(r, i);
  OutboxRow row;
  row.id = in.int8(0);
  row.message.message_id = std::string(in.bytes(1));
  row.message.destination = std::string(in.bytes(2));
  row.message.content_type = std::string(in.bytes(3));
  // The table's CHECKs keep out what the relay could not publish; should a row get past them
  // anyway, it reads as the SQLite outbox's foreign rows do: `unreadable` set.
  read_outbox_headers(row, in.bytes(4));
  row.message.body = std::string(in.bytes(5));
  const auto state = parse_state(in.bytes(6));
  if (!state) return std::unexpected("unknown state \"" + std::string(in.bytes(6)) + "\"");
  row.state = *state;
  row.created = from_epoch_ms(in.int8(7));
  row.attempts = static_cast<std::uint32_t>(std::max(in.int4(8), 0));
  row.next_attempt = from_epoch_ms(in.int8(9));
  if (!in.null(10)) row.last_error = std::string(in.bytes(10));
  if (!in.null(11)) row.sent = from_epoch_ms(in.int8(11));
  if (!in.null(12)) row.message.ordering_key = std::string(in.bytes(12));
  if (!in.null(13)) row.key_seq = in.int8(13);
  if (!in.ok()) return std::unexpected(std::string("a column holds a value of an unexpected size"));
  return row;
}

StoreError unreadable(std::int64_t id, const std::string& why) {
  return StoreError{StoreErrc::corrupt, "postgres: outbox row " + std::to_string(id) + " cannot be read: " + why};
}

// The ordering keys a dead row holds back, and the oldest row so held: from the dead rows (few,
// on their index), each looking for the next row of its key that is pending (a walk over the
// pending rows instead looked at every earlier row of each one's key: quadratic in a backlog).
std::string held_keys_sql(const std::string& t) {
  const std::string next_pending = "(SELECT p.created_ms FROM " + t +
                                   " p WHERE p.ordering_key = d.ordering_key AND p.key_seq > d.key_seq AND "
                                   "p.state <> 'sent' AND p.state = 'pending' ORDER BY p.key_seq LIMIT 1)";
  const std::string dead_keyed = " FROM " + t + " d WHERE d.state = 'dead' AND d.ordering_key IS NOT NULL";
  return "(SELECT count(DISTINCT d.ordering_key)" + dead_keyed + " AND " + next_pending + " IS NOT NULL), (SELECT min(" +
         next_pending + ")" + dead_keyed + ")";
}

// The reader's statements for one schema.
struct Sql {
  std::string claim, mark_unreadable, sent, retry, postpone, dead, purge, count, list_all, list_pending, list_sent,
      list_dead, get, retry_dead, drop_dead, ping;

  explicit Sql(const std::string& schema) {
    const std::string t = pd::quote_ident(schema) + ".idem_outbox";
    const std::string cols(kColumns);
    // One statement: the subquery locks due, unleased pending rows (skipping rows another
    // relay's claim or settle has locked at this instant), the UPDATE leases them, and the
    // lease keeps them from other relays until it runs out. ARRAY(...) runs the subquery
    // exactly once; the outer conditions hold for the locked row versions.
    claim = "UPDATE " + t + " SET lease_owner = $3::text, lease_expires_ms = $4::bigint WHERE id = ANY (ARRAY("
            "SELECT id FROM " + t + " o WHERE state = 'pending' AND next_attempt_ms <= $1::bigint "
            "AND (lease_expires_ms IS NULL OR lease_expires_ms <= $1::bigint) "
            // A row with an ordering key waits while an earlier row of its key (key_seq: commit
            // order) is pending, in flight on any relay included, or dead outside the
            // destinations whose dead rows let the key go on ($5). A row that commits while this
            // runs is not seen: what is not seen is never taken.
            "AND (o.ordering_key IS NULL OR NOT EXISTS (SELECT 1 FROM " + t + " e WHERE e.ordering_key = o.ordering_key "
            "AND e.key_seq < o.key_seq AND e.state <> 'sent' "
            "AND (e.state = 'pending' OR (e.destination <> ALL ($5::text[]) AND '*' <> ALL ($5::text[]))))) "
            "ORDER BY id LIMIT $2::bigint FOR UPDATE SKIP LOCKED)) RETURNING " + cols;
    mark_unreadable = "UPDATE " + t + " SET state = 'dead', last_error = $2::text, lease_owner = NULL, "
                      "lease_expires_ms = NULL WHERE id = $1::bigint AND lease_owner = $3::text";
    // Settling touches only rows still pending and leased to the settling relay ($2): a row
    // whose lease ran out and that another relay took is left as that relay has it.
    const std::string held = " WHERE id = $1::bigint AND state = 'pending' AND lease_owner = $2::text";
    sent = "UPDATE " + t + " SET state = 'sent', sent_ms = $3::bigint, lease_owner = NULL, lease_expires_ms = NULL "
           "WHERE id = ANY ($1::bigint[]) AND state = 'pending' AND lease_owner = $2::text";
    retry = "UPDATE " + t + " SET attempts = attempts + 1, next_attempt_ms = $3::bigint, "
            "last_error = NULLIF($4::text, ''), lease_owner = NULL, lease_expires_ms = NULL" + held;
    postpone = "UPDATE " + t + " SET next_attempt_ms = $3::bigint, last_error = NULLIF($4::text, ''), "
               "lease_owner = NULL, lease_expires_ms = NULL" + held;
    dead = "UPDATE " + t + " SET state = 'dead', attempts = attempts + 1, last_error = NULLIF($3::text, ''), "
           "lease_owner = NULL, lease_expires_ms = NULL" + held;
    // Bounded, and rows another transaction holds are left for the next round.
    purge = "DELETE FROM " + t + " WHERE id = ANY (ARRAY(SELECT id FROM " + t +
            " WHERE state = 'sent' AND sent_ms < $1::bigint LIMIT $2::bigint FOR UPDATE SKIP LOCKED)) "
            "AND state = 'sent'";
    count = "SELECT (SELECT count(*) FROM " + t + " WHERE state = 'pending'), (SELECT count(*) FROM " + t +
            " WHERE state = 'sent'), (SELECT count(*) FROM " + t + " WHERE state = 'dead'), "
            "(SELECT min(created_ms) FROM " + t + " WHERE state = 'pending'), "
            + held_keys_sql(t);
    // The state is written into the SQL so that the planner uses its partial index.
    const auto list = [&](std::string_view state) {
      return "SELECT " + cols + " FROM " + t + " WHERE id > $1::bigint" +
             (state.empty() ? std::string() : " AND state = '" + std::string(state) + "'") +
             " ORDER BY id LIMIT $2::bigint";
    };
    list_all = list("");
    list_pending = list("pending");
    list_sent = list("sent");
    list_dead = list("dead");
    get = "SELECT " + cols + " FROM " + t + " WHERE id = $1::bigint";
    retry_dead = "UPDATE " + t + " SET state = 'pending', attempts = 0, next_attempt_ms = $2::bigint, "
                 "lease_owner = NULL, lease_expires_ms = NULL WHERE id = $1::bigint AND state = 'dead'";
    drop_dead = "DELETE FROM " + t + " WHERE id = $1::bigint AND state = 'dead'";
    ping = "SELECT 1 FROM " + t + " LIMIT 1";
  }
};

}  // namespace

// ---- enqueue ----------------------------------------------------------------------------------

namespace {

// enqueue's INSERT of a checked message whose headers are `headers_json`.
bool insert_message(PostgresTransaction& tx, const OutboxMessage& message, const std::string& headers_json,
                    TimePoint now, std::string& error) {
  // ON CONFLICT DO NOTHING rather than a unique violation: the transaction stays usable, and the
  // sentence says what happened. A concurrent transaction enqueuing the same id makes this one
  // wait for it, then see its row.
  const std::string sql = "INSERT INTO " + pd::quote_ident(tx.schema()) +
                          ".idem_outbox (message_id, destination, content_type, headers, body, created_ms, ordering_key) "
                          "VALUES ($1, $2, $3, $4::jsonb, $5::bytea, $6::bigint, $7) "
                          "ON CONFLICT (message_id) DO NOTHING RETURNING id";
  std::optional<std::string> key;
  if (!message.ordering_key.empty()) key = message.ordering_key;
  auto r = tx.exec(sql, {message.message_id, message.destination, message.content_type, headers_json,
                         hex_bytea(message.body), std::to_string(to_epoch_ms(now)), key});
  if (!r) {
    error = r.error().message;
    return false;
  }
  if (r->rows.empty()) {
    error = "message id " + message.message_id + " is already in the outbox";
    return false;
  }
  return true;
}

}  // namespace

bool PostgresOutbox::enqueue(PostgresTransaction& tx, const OutboxMessage& message, TimePoint now,
                             std::string& error) {
  if (auto problem = outbox_message_problem(message)) {
    error = "outbox: cannot enqueue the message: " + *problem;
    return false;
  }
  return insert_message(tx, message, outbox_headers_to_json(message.headers), now, error);
}

bool PostgresOutbox::enqueue(PostgresTransaction& tx, const CheckedOutboxMessage& checked, TimePoint now,
                             std::string& error) {
  return insert_message(tx, checked.message(), checked.headers_json(), now, error);
}

// ---- the reader -------------------------------------------------------------------------------

class PostgresOutbox::Impl {
 public:
  Impl(PostgresOutboxOptions options, pd::Conn conn)
      : options_(std::move(options)),
        sql_(options_.schema),
        silence_((options_.statement_timeout > Millis::zero() ? options_.statement_timeout : Millis{60'000}) +
                 Millis{1000}),
        conn_(std::move(conn)) {}

  // Connects (or reconnects) with the session's settings.
  static std::expected<pd::Conn, StoreError> connect(const PostgresOutboxOptions& o, std::chrono::milliseconds silence) {
    auto conn = pd::connect(o.conninfo, o.application_name, pd::SteadyClock::now() + o.connect_timeout);
    if (!conn) return std::unexpected(scrubbed(conn.error().error, o.conninfo));
    const std::string timeout = std::to_string(o.statement_timeout.count());
    pd::Params p;
    p.text_form(timeout.c_str());
    auto set = pd::exec(conn->get(), "SELECT set_config('statement_timeout', $1, false)", p, 0, silence,
                        {"set statement_timeout", false, false});
    if (!set) return std::unexpected(scrubbed(set.error().error, o.conninfo));
    return std::move(*conn);
  }

  StoreResult<std::vector<OutboxRow>> claim(const OutboxClaim& c) {
    if (auto refused = relay_only("claim")) return std::unexpected(*refused);
    if (c.owner.empty() || !pd::valid_text(c.owner)) {
      return std::unexpected(internal_error("postgres: outbox claim: OutboxClaim::owner must be a non-empty UTF-8 name"));
    }
    if (c.lease <= Millis::zero()) return std::unexpected(internal_error("postgres: outbox claim: the lease must be positive"));
    if (c.limit == 0) return std::vector<OutboxRow>{};
    pd::Params p;
    p.int8(to_epoch_ms(c.now));
    p.int8(limit_to_db(c.limit));
    p.text(c.owner);
    p.int8(to_epoch_ms(c.now + c.lease));
    const std::string passing = text_array(c.dead_rows_pass);
    p.text_form(passing.c_str());  // the text form of a text[]
    auto r = run(sql_.claim, p, {"outbox claim", true, true});
    if (!r) return std::unexpected(r.error());
    std::vector<OutboxRow> rows;
    std::vector<std::pair<std::int64_t, std::string>> bad;
    for (int i = 0; i < PQntuples(r->get()); ++i) {
      auto row = decode_row(r->get(), i);
      if (!row) {
        bad.emplace_back(pd::Reader(r->get(), i).int8(0), std::move(row.error()));
      } else if (!row->unreadable.empty()) {
        bad.emplace_back(row->id, std::move(row->unreadable));
      } else {
        rows.push_back(std::move(*row));
      }
    }
    // A row nobody can publish must not stop the ones behind it: dead, with the reason.
    for (const auto& [id, why] : bad) {
      const std::string reason = storable("the row cannot be read: " + why);
      pd::Params m;
      m.int8(id);
      m.text(reason);
      m.text(c.owner);
      if (auto marked = run(sql_.mark_unreadable, m, {"outbox claim: mark an unreadable row dead", true, true});
          !marked) {
        return std::unexpected(marked.error());
      }
    }
    // RETURNING gives rows in no promised order.
    std::sort(rows.begin(), rows.end(), [](const OutboxRow& a, const OutboxRow& b) { return a.id < b.id; });
    return rows;
  }

  StoreResult<Done> settle(const std::vector<OutboxResult>& results, TimePoint now, const std::string& owner) {
    if (auto refused = relay_only("settle")) return std::unexpected(*refused);
    if (results.empty()) return Done{};
    if (!pd::valid_text(owner)) return std::unexpected(internal_error("postgres: outbox settle: the owner is not UTF-8"));
    // Sent rows, the common case, in one statement; the others one statement each.
    std::string sent_ids;
    std::vector<const OutboxResult*> others;
    for (const OutboxResult& r : results) {
      if (r.kind == OutboxResult::Kind::sent) {
        if (!sent_ids.empty()) sent_ids += ',';
        sent_ids += std::to_string(r.id);
      } else {
        others.push_back(&r);
      }
    }
    const std::size_t statements = (sent_ids.empty() ? 0 : 1) + others.size();
    const bool alone = statements == 1;  // autocommitted: one round trip
    const pd::Exchange step{"outbox settle", true, alone};
    if (!alone) {
      if (auto begun = run("BEGIN", pd::Params{}, {"outbox settle: begin", false, false}); !begun) {
        return std::unexpected(begun.error());
      }
    }
    auto body = [&]() -> StoreResult<Done> {
      if (!sent_ids.empty()) {
        const std::string array = "{" + sent_ids + "}";
        pd::Params p;
        p.text_form(array.c_str());
        p.text(owner);
        p.int8(to_epoch_ms(now));
        if (auto r = run(sql_.sent, p, step, /*may_reconnect=*/alone); !r) return std::unexpected(r.error());
      }
      for (const OutboxResult* r : others) {
        const std::string* sql = nullptr;
        switch (r->kind) {
          case OutboxResult::Kind::retry: sql = &sql_.retry; break;
          case OutboxResult::Kind::postpone: sql = &sql_.postpone; break;
          case OutboxResult::Kind::dead: sql = &sql_.dead; break;
          case OutboxResult::Kind::sent: break;
        }
        if (sql == nullptr) return std::unexpected(internal_error("postgres: outbox settle: unknown result kind"));
        const std::string error = storable(r->error);
        pd::Params p;
        p.int8(r->id);
        p.text(owner);
        if (r->kind != OutboxResult::Kind::dead) p.int8(to_epoch_ms(r->next_attempt));  // dead: no next attempt
        p.text(error);
        if (auto done = run(*sql, p, step, /*may_reconnect=*/alone); !done) return std::unexpected(done.error());
      }
      return Done{};
    }();
    if (alone) return body;
    if (!body) {
      rollback();
      return body;
    }
    if (auto committed = run("COMMIT", pd::Params{}, {"outbox settle: commit", true, true}, /*may_reconnect=*/false);
        !committed) {
      return std::unexpected(committed.error());
    }
    return Done{};
  }

  StoreResult<std::size_t> purge_sent(TimePoint before, std::size_t limit) {
    if (limit == 0) return std::size_t{0};
    pd::Params p;
    p.int8(to_epoch_ms(before));
    p.int8(limit_to_db(limit));
    auto r = run(sql_.purge, p, {"outbox purge", true, true});
    if (!r) return std::unexpected(r.error());
    return static_cast<std::size_t>(pd::affected_rows(r->get()));
  }

  StoreResult<OutboxCounts> count() {
    auto r = run(sql_.count, pd::Params{}, {"outbox count", false, false});
    if (!r) return std::unexpected(r.error());
    if (PQntuples(r->get()) != 1) return std::unexpected(internal_error("postgres: outbox count returned no row"));
    pd::Reader in(r->get(), 0);
    OutboxCounts counts;
    counts.pending = static_cast<std::uint64_t>(in.int8(0));
    counts.sent = static_cast<std::uint64_t>(in.int8(1));
    counts.dead = static_cast<std::uint64_t>(in.int8(2));
    if (!in.null(3)) counts.oldest_pending = from_epoch_ms(in.int8(3));
    counts.held_keys = static_cast<std::uint64_t>(in.int8(4));
    if (!in.null(5)) counts.oldest_held = from_epoch_ms(in.int8(5));
    if (!in.ok()) return std::unexpected(internal_error("postgres: outbox count returned a malformed row"));
    return counts;
  }

  StoreResult<std::vector<OutboxRow>> list(const OutboxQuery& query) {
    const std::string* sql = &sql_.list_all;
    if (query.state) {
      switch (*query.state) {
        case OutboxState::pending: sql = &sql_.list_pending; break;
        case OutboxState::sent: sql = &sql_.list_sent; break;
        case OutboxState::dead: sql = &sql_.list_dead; break;
      }
    }
    pd::Params p;
    p.int8(query.after_id);
    p.int8(limit_to_db(query.limit));
    auto r = run(*sql, p, {"outbox list", false, false});
    if (!r) return std::unexpected(r.error());
    std::vector<OutboxRow> rows;
    rows.reserve(static_cast<std::size_t>(PQntuples(r->get())));
    for (int i = 0; i < PQntuples(r->get()); ++i) {
      auto row = decode_row(r->get(), i);
      if (!row) return std::unexpected(unreadable(pd::Reader(r->get(), i).int8(0), row.error()));
      rows.push_back(std::move(*row));
    }
    return rows;
  }

  StoreResult<std::optional<OutboxRow>> get(std::int64_t id) {
    pd::Params p;
    p.int8(id);
    auto r = run(sql_.get, p, {"outbox get", false, false});
    if (!r) return std::unexpected(r.error());
    if (PQntuples(r->get()) == 0) return std::nullopt;
    auto row = decode_row(r->get(), 0);
    if (!row) return std::unexpected(unreadable(id, row.error()));
    return std::move(*row);
  }

  StoreResult<bool> retry_dead(std::int64_t id, TimePoint now) {
    pd::Params p;
    p.int8(id);
    p.int8(to_epoch_ms(now));
    auto r = run(sql_.retry_dead, p, {"outbox retry", true, true});
    if (!r) return std::unexpected(r.error());
    return pd::affected_rows(r->get()) == 1;
  }

  StoreResult<bool> drop_dead(std::int64_t id) {
    pd::Params p;
    p.int8(id);
    auto r = run(sql_.drop_dead, p, {"outbox drop", true, true});
    if (!r) return std::unexpected(r.error());
    return pd::affected_rows(r->get()) == 1;
  }

  StoreResult<Done> ping() {
    auto r = run(sql_.ping, pd::Params{}, {"outbox ping", false, false});
    if (!r) return std::unexpected(r.error());
    return Done{};
  }

 private:
  static StoreError scrubbed(StoreError error, const std::string& conninfo) {
    // libpq may quote the part of a URL it could not parse, password included.
    error.message = scrub_secrets(error.message, conninfo);
    return error;
  }

  std::optional<StoreError> relay_only(std::string_view what) const {
    if (options_.relay) return std::nullopt;
    return internal_error("postgres: outbox " + std::string(what) +
                          ": this reader was opened for an operator (relay = false)");
  }

  // One statement on the connection, reconnecting first if it was lost (unless the statement
  // belongs to a transaction begun on the lost one); a failure that poisons the connection drops
  // it, so the next call starts on a new one.
  StoreResult<pd::Result> run(const std::string& sql, const pd::Params& p, const pd::Exchange& ex,
                              bool may_reconnect = true) {
    if (!conn_ || !pd::idle_connection_alive(conn_.get())) {
      conn_.reset();
      if (!may_reconnect) {
        return std::unexpected(StoreError{StoreErrc::unavailable,
                                          "postgres: " + std::string(ex.what) +
                                              ": the connection was lost inside the transaction, which rolled back"});
      }
      auto conn = connect(options_, silence_);
      if (!conn) return std::unexpected(conn.error());
      conn_ = std::move(*conn);
    }
    auto r = pd::exec(conn_.get(), sql, p, 1, silence_, ex);
    if (!r) {
      if (r.error().poison) conn_.reset();
      return std::unexpected(scrubbed(r.error().error, options_.conninfo));
    }
    return std::move(*r);
  }

  void rollback() {
    if (conn_ && PQtransactionStatus(conn_.get()) != PQTRANS_IDLE) {
      if (auto r = pd::exec(conn_.get(), "ROLLBACK", pd::Params{}, 0, silence_, {"outbox: rollback", false, false}); !r) {
        conn_.reset();
      }
    }
  }

  const PostgresOutboxOptions options_;
  const Sql sql_;
  const std::chrono::milliseconds silence_;
  pd::Conn conn_;  // null while disconnected
};

StoreResult<std::unique_ptr<PostgresOutbox>> PostgresOutbox::open_reader(PostgresOutboxOptions options) {
  if (options.conninfo.empty()) return std::unexpected(internal_error("postgres: PostgresOutboxOptions::conninfo is empty"));
  if (options.schema.empty() || !pd::valid_text(options.schema)) {
    return std::unexpected(internal_error("postgres: PostgresOutboxOptions::schema must be a non-empty UTF-8 name"));
  }
  if (options.connect_timeout <= Millis::zero() || options.statement_timeout < Millis::zero()) {
    return std::unexpected(internal_error("postgres: connect_timeout must be positive, statement_timeout not negative"));
  }
  const std::chrono::milliseconds silence =
      (options.statement_timeout > Millis::zero() ? options.statement_timeout : Millis{60'000}) + Millis{1000};
  auto conn = Impl::connect(options, silence);
  if (!conn) return std::unexpected(conn.error());
  if (auto ready = pd::ensure_outbox(conn->get(), options.schema, options.relay, silence); !ready) {
    StoreError error = ready.error().error;
    error.message = scrub_secrets(error.message, options.conninfo);
    return std::unexpected(std::move(error));
  }
  return std::unique_ptr<PostgresOutbox>(new PostgresOutbox(std::make_unique<Impl>(std::move(options), std::move(*conn))));
}

PostgresOutbox::PostgresOutbox(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
PostgresOutbox::~PostgresOutbox() = default;

StoreResult<std::vector<OutboxRow>> PostgresOutbox::claim(const OutboxClaim& claim) { return impl_->claim(claim); }
StoreResult<Done> PostgresOutbox::settle(const std::vector<OutboxResult>& results, TimePoint now,
                                         const std::string& owner) {
  return impl_->settle(results, now, owner);
}
StoreResult<std::size_t> PostgresOutbox::purge_sent(TimePoint before, std::size_t limit) {
  return impl_->purge_sent(before, limit);
}
StoreResult<OutboxCounts> PostgresOutbox::count() { return impl_->count(); }
StoreResult<std::vector<OutboxRow>> PostgresOutbox::list(const OutboxQuery& query) { return impl_->list(query); }
StoreResult<std::optional<OutboxRow>> PostgresOutbox::get(std::int64_t id) { return impl_->get(id); }
StoreResult<bool> PostgresOutbox::retry_dead(std::int64_t id, TimePoint now) { return impl_->retry_dead(id, now); }
StoreResult<bool> PostgresOutbox::drop_dead(std::int64_t id) { return impl_->drop_dead(id); }
StoreResult<Done> PostgresOutbox::ping() { return impl_->ping(); }

}  // namespace idem
