#include "schema.hpp"

#include <span>

namespace idem::postgres_detail {
namespace {

using std::chrono::milliseconds;

// Replaces every "@S" with the quoted schema name.
std::string in_schema(std::string_view sql, const std::string& schema) {
  const std::string quoted = quote_ident(schema);
  std::string out;
  out.reserve(sql.size() + 8 * quoted.size());
  for (std::size_t i = 0; i < sql.size(); ++i) {
    if (sql[i] == '@' && i + 1 < sql.size() && sql[i + 1] == 'S') {
      out += quoted;
      ++i;
    } else {
      out += sql[i];
    }
  }
  return out;
}

struct Migration {
  int version;
  const char* sql;  // "@S" stands for the schema
};

// The transactional outbox (docs/outbox.md), created by migration 2 and by an outbox reader
// (ensure_outbox) in a schema that holds no idem store. Every statement is IF NOT EXISTS for that
// reason, and a later change to the outbox must be written so that it applies to a table either
// of them made. Its columns are what a service in any language fills with one INSERT; the
// defaults make (message_id, body) enough. The CHECKs refuse, at the writer's INSERT, what the
// relay could not publish.
constexpr const char* kOutbox = R"sql(
CREATE TABLE IF NOT EXISTS @S.idem_outbox (
  id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,  -- enqueue order
  message_id       text COLLATE "C" NOT NULL UNIQUE  -- visible ASCII; a regex counts to 255 at most
                   CHECK (message_id ~ '^[!-~]+$' AND octet_length(message_id) <= 256),
  destination      text NOT NULL DEFAULT '' CHECK (char_length(destination) <= 256),
  content_type     text NOT NULL DEFAULT 'application/json',
  headers          jsonb NOT NULL DEFAULT '{}'
                   CHECK (jsonb_typeof(headers) = 'object'
                          AND NOT jsonb_path_exists(headers, '$.* ? (@.type() != "string")')),
  body             bytea NOT NULL DEFAULT '',
  created_ms       bigint NOT NULL DEFAULT (extract(epoch FROM now()) * 1000)::bigint,
  state            text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'sent', 'dead')),
  attempts         integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
  next_attempt_ms  bigint NOT NULL DEFAULT 0,
  last_error       text,
  sent_ms          bigint,
  lease_owner      text,
  lease_expires_ms bigint
);
-- The relays' claim: pending rows in id order (due and unleased ones are filtered on the way).
CREATE INDEX IF NOT EXISTS idem_outbox_pending ON @S.idem_outbox (id) WHERE state = 'pending';
-- purge_sent: sent rows by sent time.
CREATE INDEX IF NOT EXISTS idem_outbox_sent ON @S.idem_outbox (sent_ms) WHERE state = 'sent';
-- An operator's list of dead rows, and their count.
CREATE INDEX IF NOT EXISTS idem_outbox_dead ON @S.idem_outbox (id) WHERE state = 'dead';
)sql";

// Migration 4, and what ensure_outbox applies to a relay's own table that lacks it: ordering keys
// (docs/outbox.md, "Order"). Idempotent (IF NOT EXISTS, OR REPLACE), so that a relay newer than
// the service's store can bring the table forward and the store's migration later finds it done.
//  - key_seq is a row's place among its key's rows, in commit order: the trigger takes a
//    transaction-scoped advisory lock on the key before it reads the key's last key_seq, so
//    transactions enqueuing for one key take turns from that INSERT to their commit (or rollback,
//    which gives the number back), and a later number is always a later commit. Ids cannot say
//    that: they are taken at INSERT, and a transaction holding a lower one may commit later.
//  - Only READ COMMITTED transactions may insert a row with a key: the fresh snapshot after the
//    lock is what sees the previous writer's rows. A REPEATABLE READ or SERIALIZABLE transaction
//    reads its older snapshot, and would number its row below a later commit's whenever the row
//    that holds the number it missed was purged or dropped meanwhile (proof/outbox_order.pml's
//    "limits" runs); the trigger refuses it with the reason.
//  - The unique index finds the last key_seq, and refuses a duplicate one (a second guard).
//  - The partial index finds, for a row the relay considers, an earlier row of its key that is
//    not sent yet.
constexpr const char* kOutboxOrdering = R"sql(
ALTER TABLE @S.idem_outbox ADD COLUMN IF NOT EXISTS ordering_key text COLLATE "C"
  CHECK (ordering_key IS NULL OR ordering_key ~ '^[!-~]{1,128}$');
ALTER TABLE @S.idem_outbox ADD COLUMN IF NOT EXISTS key_seq bigint;
CREATE UNIQUE INDEX IF NOT EXISTS idem_outbox_key_seq ON @S.idem_outbox (ordering_key, key_seq)
  WHERE ordering_key IS NOT NULL;
CREATE INDEX IF NOT EXISTS idem_outbox_unsent_by_key ON @S.idem_outbox (ordering_key, key_seq)
  WHERE ordering_key IS NOT NULL AND state <> 'sent';
CREATE OR REPLACE FUNCTION @S.idem_outbox_number_key() RETURNS trigger LANGUAGE plpgsql AS $number$
BEGIN
  IF NEW.ordering_key IS NULL THEN
    NEW.key_seq := NULL;
    RETURN NEW;
  END IF;
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION USING ERRCODE = 'feature_not_supported',
      MESSAGE = 'idem_outbox: a row with an ordering key must be inserted by a READ COMMITTED transaction (this one is '
                || current_setting('transaction_isolation') || ')',
      HINT = 'its key_seq must see the commits of the transactions that enqueued for the key before it';
  END IF;
  PERFORM pg_advisory_xact_lock(hashtextextended('idem.outbox-key:' || TG_TABLE_SCHEMA || ':' || NEW.ordering_key, 0));
  -- A fresh snapshot (READ COMMITTED): the rows of the transaction we waited for are in it.
  EXECUTE format('SELECT coalesce(max(key_seq), 0) + 1 FROM %I.idem_outbox WHERE ordering_key = $1', TG_TABLE_SCHEMA)
    INTO NEW.key_seq USING NEW.ordering_key;
  RETURN NEW;
END
$number$;
DROP TRIGGER IF EXISTS idem_outbox_number_key ON @S.idem_outbox;
CREATE TRIGGER idem_outbox_number_key BEFORE INSERT ON @S.idem_outbox
  FOR EACH ROW EXECUTE FUNCTION @S.idem_outbox_number_key();
)sql";

// Migration 3: the attempt number (SPEC §12: every takeover counts one more; the gateway tells the
// upstream) and an "ask" route's lookup (idemctl reconcile reads it). Records from before are
// first attempts without a lookup. ADD COLUMN with a constant default rewrites no row and checks
// no constraint, so the migration is quick on a big table.
//
// idem_claim gains the lookup as a ninth parameter and returns both columns; being an overload,
// the eight-parameter version of migration 1 stays, so replicas of the previous version keep
// claiming while they are replaced (their takeovers do not count attempts, nor do they store a
// lookup). This one is the same function (see migration 1 for why it is atomic) with the
// claimed_record rule for the attempt: a takeover of an unexpired record counts on from it,
// anything else starts at 1.
constexpr const char* kAttempts = R"sql(
ALTER TABLE @S.idempotency_keys ADD COLUMN attempt bigint NOT NULL DEFAULT 1,
                                ADD COLUMN lookup text NOT NULL DEFAULT '';

CREATE FUNCTION @S.idem_claim(p_tenant text, p_key text, p_hash text, p_token bigint, p_now bigint,
                              p_lease_expires bigint, p_expires bigint, p_take_over boolean, p_lookup text)
RETURNS TABLE (o_outcome text, o_kind text, o_state text, o_request_hash text, o_fencing_token bigint,
               o_lease_expires_ms bigint, o_response_status integer, o_response_headers bytea,
               o_response_body bytea, o_created_ms bigint, o_completed_ms bigint, o_expires_ms bigint,
               o_attempt bigint, o_lookup text)
LANGUAGE plpgsql VOLATILE
AS $claim$
DECLARE
  r @S.idempotency_keys%ROWTYPE;
  v_decision text;
  v_created bigint;
  v_attempt bigint;
  v_locked boolean;
BEGIN
  FOR attempt IN 1..8 LOOP
    INSERT INTO @S.idempotency_keys (tenant_id, key, state, request_hash, fencing_token,
                                     lease_expires_ms, created_ms, expires_ms, attempt, lookup)
    VALUES (p_tenant, p_key, 'in_progress', p_hash, p_token, p_lease_expires, p_now, p_expires, 1, p_lookup)
    ON CONFLICT (tenant_id, key) DO NOTHING;
    IF FOUND THEN
      RETURN QUERY SELECT 'claimed'::text, 'fresh'::text, 'in_progress'::text, p_hash, p_token,
                          p_lease_expires, NULL::integer, NULL::bytea, NULL::bytea, p_now,
                          NULL::bigint, p_expires, 1::bigint, p_lookup;
      RETURN;
    END IF;

    v_locked := false;
    LOOP
      IF v_locked THEN
        SELECT * INTO r FROM @S.idempotency_keys k
         WHERE k.tenant_id = p_tenant AND k.key = p_key FOR UPDATE;
      ELSE
        SELECT * INTO r FROM @S.idempotency_keys k
         WHERE k.tenant_id = p_tenant AND k.key = p_key;
      END IF;
      EXIT WHEN NOT FOUND;  -- deleted since the INSERT: insert again

      -- decide_claim, in the same order.
      IF r.expires_ms <= p_now THEN
        v_decision := 'fresh';
      ELSIF r.request_hash <> p_hash THEN
        v_decision := 'mismatch';
      ELSIF r.state = 'completed' THEN
        v_decision := 'completed';
      ELSIF r.state = 'failed_retryable' THEN
        v_decision := 'after_failure';
      ELSIF r.lease_expires_ms > p_now THEN
        v_decision := 'in_progress';
      ELSIF NOT p_take_over THEN
        v_decision := 'outcome_unknown';
      ELSE
        v_decision := 'after_lease_expiry';
      END IF;

      IF v_decision IN ('mismatch', 'completed', 'in_progress', 'outcome_unknown') THEN
        RETURN QUERY SELECT v_decision, NULL::text, r.state, r.request_hash, r.fencing_token,
                            r.lease_expires_ms, r.response_status, r.response_headers,
                            r.response_body, r.created_ms, r.completed_ms, r.expires_ms,
                            r.attempt, r.lookup;
        RETURN;
      END IF;

      IF v_locked THEN
        -- claimed_record: a takeover continues the operation, keeps its creation time and counts
        -- one more attempt (saturating at the uint32 range the stores share).
        v_created := CASE WHEN v_decision = 'fresh' THEN p_now ELSE r.created_ms END;
        v_attempt := CASE WHEN v_decision = 'fresh' THEN 1 ELSE LEAST(r.attempt + 1, 4294967295) END;
        UPDATE @S.idempotency_keys k
           SET state = 'in_progress', request_hash = p_hash, fencing_token = p_token,
               lease_expires_ms = p_lease_expires, response_status = NULL,
               response_headers = NULL, response_body = NULL, created_ms = v_created,
               completed_ms = NULL, expires_ms = p_expires, attempt = v_attempt, lookup = p_lookup
         WHERE k.tenant_id = p_tenant AND k.key = p_key AND k.fencing_token = r.fencing_token;
        IF NOT FOUND THEN  -- cannot happen while we hold the row lock; never claim blindly
          RAISE EXCEPTION USING ERRCODE = 'serialization_failure',
                MESSAGE = format('idem_claim(%L, %L): takeover matched no row', p_tenant, p_key);
        END IF;
        RETURN QUERY SELECT 'claimed'::text, v_decision, 'in_progress'::text, p_hash, p_token,
                            p_lease_expires, NULL::integer, NULL::bytea, NULL::bytea, v_created,
                            NULL::bigint, p_expires, v_attempt, p_lookup;
        RETURN;
      END IF;
      v_locked := true;  -- claimable: read it again under the row lock and decide for real
    END LOOP;
  END LOOP;
  -- Only a key deleted and re-created again and again between our statements gets here.
  RAISE EXCEPTION USING ERRCODE = 'serialization_failure',
        MESSAGE = format('idem_claim(%L, %L): the record kept changing', p_tenant, p_key);
END
$claim$;
)sql";

// Append only: a released migration is never edited, a change is a new entry.
//
// Migration 1's idem_claim is the claim rule of core/src/store.cpp (decide_claim and
// claimed_record) in PL/pgSQL, so that a claim is one statement and can share a pipelined
// transaction with others. Why it is atomic under READ COMMITTED, with any number of concurrent
// claims on other connections:
//
//  1. INSERT ... ON CONFLICT DO NOTHING either inserts (no live row: a fresh claim, and the unique
//     index makes it the only one) or finds a row. An insert that meets another transaction's
//     uncommitted row for the key waits for that transaction to end, so "conflict" always means
//     a committed row (or one this transaction wrote earlier in its batch).
//  2. A PL/pgSQL statement takes a new snapshot under READ COMMITTED, so the SELECT after the
//     conflict sees that row (a single statement with CTEs would not: its one snapshot predates
//     the row the INSERT waited for; that is the trap of "ON CONFLICT DO NOTHING, then read").
//     If the row is gone meanwhile (released, purged), the loop inserts again.
//  3. Answers that change nothing (mismatch, completed, in progress, outcome unknown) come from
//     that committed row: true at the instant of the snapshot, so they need no lock.
//  4. A claimable row (expired, failed, lease run out) is read again with FOR UPDATE, which
//     waits for any transaction writing it and returns the newest version, then locks it until
//     commit. The rule is applied again to that version and the takeover UPDATE runs under the
//     lock: no other claim, completion or operator action can come between decision and write.
//     Another claim that took it over first is seen here, and answered in_progress.
// Batches lock rows in (tenant, key) order (the store sorts them), so batches cannot deadlock.
constexpr Migration kMigrations[] = {
    {1, R"sql(
CREATE TABLE @S.idempotency_keys (
  tenant_id        text COLLATE "C" NOT NULL,
  key              text COLLATE "C" NOT NULL,
  state            text NOT NULL CHECK (state IN ('in_progress', 'completed', 'failed_retryable')),
  request_hash     text NOT NULL,
  fencing_token    bigint NOT NULL,  -- the uint64 token's bits, as a signed 64-bit integer
  lease_expires_ms bigint NOT NULL,  -- Unix epoch milliseconds, like every *_ms column
  response_status  integer CHECK (response_status BETWEEN 100 AND 999),  -- set once completed
  response_headers bytea,            -- stores/postgres/src/headers_codec.hpp
  response_body    bytea,
  created_ms       bigint NOT NULL,
  completed_ms     bigint,
  expires_ms       bigint NOT NULL,  -- after this the record is as if absent
  PRIMARY KEY (tenant_id, key)
);

-- The reaper's: DELETE ... WHERE expires_ms <= now, in batches.
CREATE INDEX idempotency_keys_expires ON @S.idempotency_keys (expires_ms);

CREATE FUNCTION @S.idem_claim(p_tenant text, p_key text, p_hash text, p_token bigint, p_now bigint,
                              p_lease_expires bigint, p_expires bigint, p_take_over boolean)
RETURNS TABLE (o_outcome text, o_kind text, o_state text, o_request_hash text, o_fencing_token bigint,
               o_lease_expires_ms bigint, o_response_status integer, o_response_headers bytea,
               o_response_body bytea, o_created_ms bigint, o_completed_ms bigint, o_expires_ms bigint)
LANGUAGE plpgsql VOLATILE
AS $claim$
DECLARE
  r @S.idempotency_keys%ROWTYPE;
  v_decision text;
  v_created bigint;
  v_locked boolean;
BEGIN
  FOR attempt IN 1..8 LOOP
    INSERT INTO @S.idempotency_keys (tenant_id, key, state, request_hash, fencing_token,
                                     lease_expires_ms, created_ms, expires_ms)
    VALUES (p_tenant, p_key, 'in_progress', p_hash, p_token, p_lease_expires, p_now, p_expires)
    ON CONFLICT (tenant_id, key) DO NOTHING;
    IF FOUND THEN
      RETURN QUERY SELECT 'claimed'::text, 'fresh'::text, 'in_progress'::text, p_hash, p_token,
                          p_lease_expires, NULL::integer, NULL::bytea, NULL::bytea, p_now,
                          NULL::bigint, p_expires;
      RETURN;
    END IF;

    v_locked := false;
    LOOP
      IF v_locked THEN
        SELECT * INTO r FROM @S.idempotency_keys k
         WHERE k.tenant_id = p_tenant AND k.key = p_key FOR UPDATE;
      ELSE
        SELECT * INTO r FROM @S.idempotency_keys k
         WHERE k.tenant_id = p_tenant AND k.key = p_key;
      END IF;
      EXIT WHEN NOT FOUND;  -- deleted since the INSERT: insert again

      -- decide_claim, in the same order.
      IF r.expires_ms <= p_now THEN
        v_decision := 'fresh';
      ELSIF r.request_hash <> p_hash THEN
        v_decision := 'mismatch';
      ELSIF r.state = 'completed' THEN
        v_decision := 'completed';
      ELSIF r.state = 'failed_retryable' THEN
        v_decision := 'after_failure';
      ELSIF r.lease_expires_ms > p_now THEN
        v_decision := 'in_progress';
      ELSIF NOT p_take_over THEN
        v_decision := 'outcome_unknown';
      ELSE
        v_decision := 'after_lease_expiry';
      END IF;

      IF v_decision IN ('mismatch', 'completed', 'in_progress', 'outcome_unknown') THEN
        RETURN QUERY SELECT v_decision, NULL::text, r.state, r.request_hash, r.fencing_token,
                            r.lease_expires_ms, r.response_status, r.response_headers,
                            r.response_body, r.created_ms, r.completed_ms, r.expires_ms;
        RETURN;
      END IF;

      IF v_locked THEN
        -- claimed_record: a takeover continues the operation and keeps its creation time.
        v_created := CASE WHEN v_decision = 'fresh' THEN p_now ELSE r.created_ms END;
        UPDATE @S.idempotency_keys k
           SET state = 'in_progress', request_hash = p_hash, fencing_token = p_token,
               lease_expires_ms = p_lease_expires, response_status = NULL,
               response_headers = NULL, response_body = NULL, created_ms = v_created,
               completed_ms = NULL, expires_ms = p_expires
         WHERE k.tenant_id = p_tenant AND k.key = p_key AND k.fencing_token = r.fencing_token;
        IF NOT FOUND THEN  -- cannot happen while we hold the row lock; never claim blindly
          RAISE EXCEPTION USING ERRCODE = 'serialization_failure',
                MESSAGE = format('idem_claim(%L, %L): takeover matched no row', p_tenant, p_key);
        END IF;
        RETURN QUERY SELECT 'claimed'::text, v_decision, 'in_progress'::text, p_hash, p_token,
                            p_lease_expires, NULL::integer, NULL::bytea, NULL::bytea, v_created,
                            NULL::bigint, p_expires;
        RETURN;
      END IF;
      v_locked := true;  -- claimable: read it again under the row lock and decide for real
    END LOOP;
  END LOOP;
  -- Only a key deleted and re-created again and again between our statements gets here.
  RAISE EXCEPTION USING ERRCODE = 'serialization_failure',
        MESSAGE = format('idem_claim(%L, %L): the record kept changing', p_tenant, p_key);
END
$claim$;
)sql"},
    {2, kOutbox},
    {3, kAttempts},
    {4, kOutboxOrdering},
};

constexpr const char* kVersionTable = R"sql(
CREATE TABLE IF NOT EXISTS @S.idem_schema_version (
  id      integer PRIMARY KEY CHECK (id = 1),
  version integer NOT NULL
);
)sql";

// 0 when the schema or its version table does not exist yet.
std::expected<int, Failure> read_version(PGconn* conn, const std::string& schema, milliseconds silence) {
  const Exchange ex{"read schema version", false, false};
  const std::string table = quote_ident(schema) + ".idem_schema_version";
  Params p;
  p.text(table);
  auto exists = exec(conn, "SELECT to_regclass($1::text) IS NOT NULL", p, 0, silence, ex);
  if (!exists) return std::unexpected(exists.error());
  if (PQntuples(exists->get()) != 1 || std::string_view(PQgetvalue(exists->get(), 0, 0)) != "t") return 0;
  auto version = exec(conn, "SELECT version FROM " + table + " WHERE id = 1", Params{}, 0, silence, ex);
  if (!version) return std::unexpected(version.error());
  if (PQntuples(version->get()) == 0) return 0;
  return std::atoi(PQgetvalue(version->get(), 0, 0));
}

Failure schema_failure(StoreErrc code, std::string message) {
  Failure f;
  f.error = StoreError{code, std::move(message)};
  return f;
}

std::expected<Done, Failure> check_version(int current, const std::string& schema) {
  const int latest = latest_schema_version();
  if (current > latest) {
    return std::unexpected(schema_failure(
        StoreErrc::corrupt, "postgres: schema " + quote_ident(schema) + " is at idem schema version " +
                                std::to_string(current) + ", newer than this build understands (" +
                                std::to_string(latest) + "); run a newer idem, or use another schema"));
  }
  return Done{};
}

}  // namespace

int latest_schema_version() { return std::span(kMigrations).back().version; }

namespace {

// Runs `body` in a transaction holding the schema's migration lock, with the schema created if
// missing: replicas (and relays) starting together queue there, the first does the work and the
// others find it done.
template <class Body>
std::expected<Done, Failure> under_migration_lock(PGconn* conn, const std::string& schema, milliseconds silence,
                                                  const Exchange& ex, Body&& body) {
  if (auto begun = exec(conn, "BEGIN", Params{}, 0, silence, ex); !begun) return std::unexpected(begun.error());
  auto done = [&]() -> std::expected<Done, Failure> {
    Params lock;
    const std::string lock_name = "idem.migrate:" + schema;
    lock.text(lock_name);
    if (auto locked = exec(conn, "SELECT pg_advisory_xact_lock(hashtextextended($1::text, 0))", lock, 0, silence, ex);
        !locked) {
      return std::unexpected(locked.error());
    }
    // Not CREATE SCHEMA IF NOT EXISTS: it needs CREATE rights on the database even when the
    // schema exists.
    Params name;
    name.text(schema);
    auto has_schema = exec(conn, "SELECT 1 FROM pg_namespace WHERE nspname = $1::text", name, 0, silence, ex);
    if (!has_schema) return std::unexpected(has_schema.error());
    if (PQntuples(has_schema->get()) == 0) {
      if (auto made = exec_script(conn, "CREATE SCHEMA " + quote_ident(schema), silence, ex); !made) return made;
    }
    return body();
  }();
  if (!done) {
    if (!done.error().poison) (void)exec(conn, "ROLLBACK", Params{}, 0, silence, ex);
    return done;
  }
  Exchange commit = ex;
  commit.commit_sent = true;
  if (auto committed = exec(conn, "COMMIT", Params{}, 0, silence, commit); !committed) {
    return std::unexpected(committed.error());
  }
  return Done{};
}

std::expected<bool, Failure> has_outbox(PGconn* conn, const std::string& schema, milliseconds silence) {
  Params p;
  const std::string table = quote_ident(schema) + ".idem_outbox";
  p.text(table);
  auto exists = exec(conn, "SELECT to_regclass($1::text) IS NOT NULL", p, 0, silence, {"read schema", false, false});
  if (!exists) return std::unexpected(exists.error());
  return PQntuples(exists->get()) == 1 && std::string_view(PQgetvalue(exists->get(), 0, 0)) == "t";
}

// Whether the schema's idem_outbox has the ordering_key column (migration 4).
std::expected<bool, Failure> has_ordering(PGconn* conn, const std::string& schema, milliseconds silence) {
  const Exchange ex{"read idem_outbox columns", false, false};
  Params p;
  p.text(schema);
  auto r = exec(conn,
                "SELECT 1 FROM information_schema.columns WHERE table_schema = $1::text AND table_name = 'idem_outbox' "
                "AND column_name = 'ordering_key'",
                p, 0, silence, ex);
  if (!r) return std::unexpected(r.error());
  return PQntuples(r->get()) > 0;
}

}  // namespace

std::expected<Done, Failure> migrate(PGconn* conn, const std::string& schema, bool run_migrations,
                                     milliseconds silence, int target) {
  // Fast path, with no lock and no DDL: every open of an up-to-date schema (and every replica
  // whose role may not create anything) ends here.
  auto current = read_version(conn, schema, silence);
  if (!current) return std::unexpected(current.error());
  if (auto ok = check_version(*current, schema); !ok) return ok;
  if (*current >= target) return Done{};
  if (!run_migrations) {
    return std::unexpected(schema_failure(
        StoreErrc::corrupt, "postgres: schema " + quote_ident(schema) + " is at idem schema version " +
                                std::to_string(*current) + ", this build needs " + std::to_string(target) +
                                "; open once with migrations enabled (PostgresOptions::migrate)"));
  }
  const Exchange ex{"migrate", true, false};
  return under_migration_lock(conn, schema, silence, ex, [&]() -> std::expected<Done, Failure> {
    if (auto made = exec_script(conn, in_schema(kVersionTable, schema), silence, ex); !made) return made;
    auto now = read_version(conn, schema, silence);
    if (!now) return std::unexpected(now.error());
    if (auto ok = check_version(*now, schema); !ok) return ok;
    if (*now >= target) return Done{};
    for (const auto& m : kMigrations) {
      if (m.version <= *now || m.version > target) continue;
      Exchange step = ex;
      const std::string what = "apply migration " + std::to_string(m.version);
      step.what = what;
      if (auto applied = exec_script(conn, in_schema(m.sql, schema), silence, step); !applied) return applied;
    }
    const std::string record = "INSERT INTO " + quote_ident(schema) +
                               ".idem_schema_version (id, version) VALUES (1, " + std::to_string(target) +
                               ") ON CONFLICT (id) DO UPDATE SET version = excluded.version";
    return exec_script(conn, record, silence, ex);
  });
}

std::expected<Done, Failure> ensure_outbox(PGconn* conn, const std::string& schema, bool create,
                                           milliseconds silence) {
  // Fast path, no lock: a relay restarting, or one on an idem store's schema.
  auto version = read_version(conn, schema, silence);
  if (!version) return std::unexpected(version.error());
  if (auto ok = check_version(*version, schema); !ok) return ok;
  auto present = has_outbox(conn, schema, silence);
  if (!present) return std::unexpected(present.error());
  if (*present) {
    auto ordering = has_ordering(conn, schema, silence);
    if (!ordering) return std::unexpected(ordering.error());
    if (*ordering) return Done{};
    // A table from before ordering keys: a relay's own (no store migrates it), or an idem store's
    // not opened by this version yet.
    if (!create) {
      return std::unexpected(schema_failure(
          StoreErrc::internal, "postgres: " + quote_ident(schema) +
                                   ".idem_outbox predates ordering keys: start idem-relay or open an idem store on it "
                                   "once, which moves it forward"));
    }
    const Exchange ex{"add ordering keys to idem_outbox", true, false};
    return under_migration_lock(conn, schema, silence, ex, [&]() -> std::expected<Done, Failure> {
      return exec_script(conn, in_schema(kOutboxOrdering, schema), silence, ex);
    });
  }
  if (!create) {
    return std::unexpected(schema_failure(
        StoreErrc::internal, "postgres: schema " + quote_ident(schema) +
                                 " has no idem_outbox table (an idem store or idem-relay creates it): is it the "
                                 "service's schema?"));
  }
  const Exchange ex{"create idem_outbox", true, false};
  return under_migration_lock(conn, schema, silence, ex, [&]() -> std::expected<Done, Failure> {
    if (auto made = exec_script(conn, in_schema(kOutbox, schema), silence, ex); !made) return made;
    return exec_script(conn, in_schema(kOutboxOrdering, schema), silence, ex);
  });
}

const char* statement_name(Stmt stmt) {
  static constexpr const char* kNames[kStatementCount] = {
      "idem_claim",       "idem_complete",   "idem_fail",  "idem_release",        "idem_get",
      "idem_ping",        "idem_purge",      "idem_list_all", "idem_list_after",  "idem_list_tenant",
      "idem_list_tenant_after", "idem_count",
      "idem_lock_fenced", "idem_lock_record", "idem_mark_retryable", "idem_resolve",
      "idem_abandon",
  };
  return kNames[static_cast<int>(stmt)];
}

std::string statement_sql(Stmt stmt, const std::string& schema) {
  std::string_view sql;
  switch (stmt) {
    case Stmt::claim:
      sql = "SELECT * FROM @S.idem_claim($1::text, $2::text, $3::text, $4::bigint, $5::bigint, $6::bigint, "
            "$7::bigint, $8::boolean, $9::text)";
      break;
    // Fenced writes: they apply only while the caller's token is on an in-progress record.
    case Stmt::complete:
      sql = "UPDATE @S.idempotency_keys SET state = 'completed', response_status = $4::integer, "
            "response_headers = $5::bytea, response_body = $6::bytea, completed_ms = $7::bigint, "
            "expires_ms = $8::bigint "
            "WHERE tenant_id = $1::text AND key = $2::text AND fencing_token = $3::bigint AND state = 'in_progress'";
      break;
    case Stmt::fail:
      sql = "UPDATE @S.idempotency_keys SET state = 'failed_retryable', expires_ms = $4::bigint "
            "WHERE tenant_id = $1::text AND key = $2::text AND fencing_token = $3::bigint AND state = 'in_progress'";
      break;
    case Stmt::release:
      sql = "DELETE FROM @S.idempotency_keys "
            "WHERE tenant_id = $1::text AND key = $2::text AND fencing_token = $3::bigint AND state = 'in_progress'";
      break;
    case Stmt::abandon:
      sql = "UPDATE @S.idempotency_keys SET lease_expires_ms = $4::bigint "
            "WHERE tenant_id = $1::text AND key = $2::text AND fencing_token = $3::bigint AND state = 'in_progress'";
      break;
    case Stmt::get:
      sql = "SELECT state, request_hash, fencing_token, lease_expires_ms, response_status, response_headers, "
            "response_body, created_ms, completed_ms, expires_ms, attempt, lookup "
            "FROM @S.idempotency_keys WHERE tenant_id = $1::text AND key = $2::text";
      break;
    case Stmt::ping:
      sql = "SELECT version FROM @S.idem_schema_version";
      break;
    // Bounded and lock-friendly: rows another transaction holds are left for the next round, so
    // the reaper never waits for a request and a request waits for the reaper only on an
    // expired row it is deleting.
    case Stmt::purge:
      sql = "DELETE FROM @S.idempotency_keys WHERE ctid = ANY (ARRAY("
            "SELECT ctid FROM @S.idempotency_keys WHERE expires_ms <= $1::bigint "
            "LIMIT $2::bigint FOR UPDATE SKIP LOCKED)) AND expires_ms <= $1::bigint";
      break;
    // Listing one tenant has statements of its own: in a `$n IS NULL OR tenant_id = $n` test the
    // tenant cannot bound the index scan, and once the plan cache turns generic (after five runs on
    // a connection, as when paging with --all) such a listing read the whole index (250 ms for
    // 500k records against 0.1 ms).
    case Stmt::list_all:
      sql = "SELECT tenant_id, key, state, request_hash, fencing_token, lease_expires_ms, response_status, "
            "response_headers, response_body, created_ms, completed_ms, expires_ms, attempt, lookup FROM @S.idempotency_keys "
            "WHERE ($1::text IS NULL OR state = $1::text) ORDER BY tenant_id, key LIMIT $2::bigint";
      break;
    case Stmt::list_after:
      sql = "SELECT tenant_id, key, state, request_hash, fencing_token, lease_expires_ms, response_status, "
            "response_headers, response_body, created_ms, completed_ms, expires_ms, attempt, lookup FROM @S.idempotency_keys "
            "WHERE ($1::text IS NULL OR state = $1::text) AND (tenant_id, key) > ($3::text, $4::text) "
            "ORDER BY tenant_id, key LIMIT $2::bigint";
      break;
    case Stmt::list_tenant:
      sql = "SELECT tenant_id, key, state, request_hash, fencing_token, lease_expires_ms, response_status, "
            "response_headers, response_body, created_ms, completed_ms, expires_ms, attempt, lookup FROM @S.idempotency_keys "
            "WHERE ($1::text IS NULL OR state = $1::text) AND tenant_id = $3::text "
            "ORDER BY tenant_id, key LIMIT $2::bigint";
      break;
    case Stmt::list_tenant_after:
      sql = "SELECT tenant_id, key, state, request_hash, fencing_token, lease_expires_ms, response_status, "
            "response_headers, response_body, created_ms, completed_ms, expires_ms, attempt, lookup FROM @S.idempotency_keys "
            "WHERE ($1::text IS NULL OR state = $1::text) AND tenant_id = $5::text "
            "AND (tenant_id, key) > ($3::text, $4::text) ORDER BY tenant_id, key LIMIT $2::bigint";
      break;
    case Stmt::count:
      sql = "SELECT count(*) FILTER (WHERE expires_ms > $1::bigint AND state = 'in_progress'), "
            "count(*) FILTER (WHERE expires_ms > $1::bigint AND state = 'completed'), "
            "count(*) FILTER (WHERE expires_ms > $1::bigint AND state = 'failed_retryable'), "
            "count(*) FILTER (WHERE expires_ms <= $1::bigint) FROM @S.idempotency_keys";
      break;
    case Stmt::lock_fenced:
      sql = "SELECT 1 FROM @S.idempotency_keys WHERE tenant_id = $1::text AND key = $2::text "
            "AND fencing_token = $3::bigint AND state = 'in_progress' FOR UPDATE";
      break;
    case Stmt::lock_record:
      sql = "SELECT state, expires_ms FROM @S.idempotency_keys WHERE tenant_id = $1::text AND key = $2::text "
            "FOR UPDATE";
      break;
    case Stmt::mark_retryable:
      sql = "UPDATE @S.idempotency_keys SET state = 'failed_retryable', fencing_token = $3::bigint "
            "WHERE tenant_id = $1::text AND key = $2::text";
      break;
    case Stmt::resolve:
      sql = "UPDATE @S.idempotency_keys SET state = 'completed', fencing_token = $3::bigint, "
            "response_status = $4::integer, response_headers = $5::bytea, response_body = $6::bytea, "
            "completed_ms = $7::bigint, expires_ms = $8::bigint WHERE tenant_id = $1::text AND key = $2::text";
      break;
  }
  return in_schema(sql, schema);
}

}  // namespace idem::postgres_detail
