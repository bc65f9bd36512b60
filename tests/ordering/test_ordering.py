"""End to end: in order, per aggregate (docs/outbox.md, "Order"; docs/consumers.md, "Ordering key").

Writers commit events of 200 aggregates (25 each, the aggregate's version in the body) into the
outbox with the aggregate as the ordering key; idem-relay publishes them to a sink; consumers
(idem-consume with ordering = "key") deliver them to a handler that records what it gets. The
handler must see each aggregate's events in version order, 1 to 25 without a gap, each once.

    test_ordering.py storm|kills|poison --outbox sqlite|postgres --sink webhook|amqp|redis_streams|kafka|sqs

  storm   PostgreSQL: 6 writer sessions commit concurrently, each transaction sleeping a little
          between its INSERT and its COMMIT, so that rows commit out of id order; 3 relays. SQLite:
          one writer, one relay. Consumers: 3 (Kafka: partitions by key; SQS: a FIFO queue, groups by
          key; RabbitMQ: a single-active-consumer queue), 1 on a Redis stream (a stream keeps order
          only for one consumer of its group); the webhook sink delivers to the handler directly.
  kills   the same while relays and consumers are SIGKILLed in turn (IDEM_ORDERING_KILLS, default
          20) and the broker restarts once (Kafka: a broker down and up, a partition leader moved;
          SQS: the endpoint away): every event's first delivery to the handler in version order,
          none missing (a killed consumer's handler call may come again: the handler dedupes by
          Idempotency-Key, as handlers must).
  poison  20 aggregates x 8 events; the handler fails one event (agg-003 version 4) until it is
          fixed. With the webhook sink the relay gives up on its row (dead): the aggregate's later
          rows are held, every other aggregate completes, and after `idemctl outbox retry` the held
          one completes in order. Through a broker the consumer dead-letters it: the aggregate's
          later events are parked behind it (`idemctl holds list` shows them), every other
          aggregate completes, and once the operator replays the dead letters in their order the
          held one completes in order and is no longer held.

Every scenario's handler writes a history (tests/common/history.py) that the chaos tests'
checker verifies, its order invariant included: each aggregate's events took effect in order.

Binaries from the environment (set by ctest): IDEM_RELAY_BIN, IDEM_CONSUME_BIN,
IDEM_BROKER_TOOL_BIN, IDEM_FAULT_PROXY_BIN, IDEM_KAFKA_MOCK, IDEM_SQS_EMULATOR, IDEMCTL_BIN; PostgreSQL,
RabbitMQ and Redis from scripts/test's servers (IDEM_TEST_POSTGRES_URL, ...).
"""
import argparse
import http.server
import json
import os
import random
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.parse

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "common"))
import brokers  # noqa: E402
import history  # noqa: E402
from procs import Proc  # noqa: E402
from scratch import run_in_scratch_dir  # noqa: E402

AGGREGATES = int(os.environ.get("IDEM_ORDERING_AGGREGATES", "200"))
EVENTS = int(os.environ.get("IDEM_ORDERING_EVENTS", "25"))
KILLS = int(os.environ.get("IDEM_ORDERING_KILLS", "20"))


def fail(message):
    print("FAIL: " + message, file=sys.stderr)
    sys.exit(1)


def log(message):
    print(message, flush=True)


class Handler:
    """The consumers' (or the webhook sink's) HTTP handler: records every POST it gets, in order,
    as (message id, aggregate, version, the Idem-Ordering-Key header), and its effects in a history
    (tests/common/history.py) that the chaos tests' checker verifies, order per aggregate included:
    every call with `every_call`, else each message's first call (the effect of a handler that
    dedupes by Idempotency-Key)."""

    def __init__(self, history_path, every_call=True):
        self.lock = threading.Lock()
        self.calls = []
        self.history_path = history_path
        self.history = history.History(history_path)
        self.effects = set()
        self.failing = set()  # message ids answered 500 (poison), not recorded as calls
        self.refused = 0
        outer = self

        class Endpoint(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # The status line and headers go in one write, the body in another: without
            # TCP_NODELAY the body waits for the client's delayed ACK, 40 ms a request.
            disable_nagle_algorithm = True

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                try:
                    event = json.loads(body)
                    call = (self.headers.get("Idempotency-Key"), event["aggregate"], int(event["version"]),
                            self.headers.get("Idem-Ordering-Key"))
                except (ValueError, KeyError, TypeError):
                    call = (self.headers.get("Idempotency-Key"), None, None, None)
                with outer.lock:
                    failed = call[0] in outer.failing
                    if failed:
                        outer.refused += 1
                    else:
                        outer.calls.append(call)
                        if call[1] is not None and (every_call or call[0] not in outer.effects):
                            outer.effects.add(call[0])
                            outer.history.execution(call[0], "%s#%d" % (call[0], len(outer.calls)),
                                                    group=call[1], seq=call[2])
                if failed:
                    self.send_response(500)
                    self.send_header("Content-Length", "9")
                    self.end_headers()
                    self.wfile.write(b"ledger is")
                    return
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args):
                pass

        class Server(http.server.ThreadingHTTPServer):
            def handle_error(self, request, client_address):
                pass  # a killed consumer's connection reset mid-request: nothing to report

        self.server = Server(("127.0.0.1", 0), Endpoint)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def url(self):
        return "http://127.0.0.1:%d/events" % self.port

    def seen(self):
        with self.lock:
            return {c[0] for c in self.calls}

    def check(self, once, context):
        """Each aggregate's first deliveries are versions 1..EVENTS in order; with `once`, no
        message came twice."""
        with self.lock:
            calls = list(self.calls)
        bad = [c for c in calls if c[1] is None]
        if bad:
            fail("the handler got bodies it could not read (%s): %s" % (context, bad[:3]))
        wrong_key = [c for c in calls if c[3] != c[1]]
        if wrong_key:
            fail("Idem-Ordering-Key is not the aggregate (%s): %s" % (context, wrong_key[:3]))
        first, seen, twice = {}, set(), []
        for message_id, aggregate, version, _ in calls:
            if message_id in seen:
                twice.append(message_id)
                continue
            seen.add(message_id)
            first.setdefault(aggregate, []).append(version)
        if once and twice:
            fail("messages the handler got more than once (%s): %s" % (context, twice[:10]))
        expected = list(range(1, EVENTS + 1))
        out_of_order = {a: v for a, v in first.items() if v != expected}
        if out_of_order:
            a, v = sorted(out_of_order.items())[0]
            fail("%d aggregates not seen in order 1..%d (%s); %s saw %s" % (len(out_of_order), EVENTS, context, a, v))
        if len(first) != AGGREGATES:
            fail("%d aggregates seen of %d (%s)" % (len(first), AGGREGATES, context))
        return len(calls), len(twice)

    def verify_history(self, context):
        """The history checker's verdict on what the handler recorded."""
        ok, text = history.report(history.load(self.history_path))
        if not ok:
            fail("%s: %s" % (context, text))
        return text

    def close(self):
        self.server.shutdown()
        self.history.close()


# ---- the outbox and its writers ------------------------------------------------------------------

def psql(url, sql):
    out = subprocess.run(["psql", url, "-v", "ON_ERROR_STOP=1", "-Atqc", sql], capture_output=True, text=True,
                         timeout=120)
    if out.returncode != 0:
        raise RuntimeError("psql: %s" % out.stderr.strip())
    return out.stdout.strip()


class PostgresOutbox:
    """A database of its own on the test server: the relays make idem_outbox in it (public)."""

    def __init__(self, name):
        base = brokers.env("IDEM_TEST_POSTGRES_URL")
        self.admin_url = base
        self.db = name.replace("-", "_")
        psql(base, "CREATE DATABASE %s" % self.db)
        parts = urllib.parse.urlsplit(base)
        self.url = urllib.parse.urlunsplit(parts._replace(path="/" + self.db))
        psql(self.url, "CREATE TABLE aggregates (id text PRIMARY KEY, version integer NOT NULL DEFAULT 0)")

    def relay_url(self):
        return self.url

    def ready(self):
        return psql(self.url, "SELECT to_regclass('public.idem_outbox') IS NOT NULL") == "t"

    def write(self, order, sessions):
        """Commits one event per entry of `order` (aggregate ids), from `sessions` concurrent
        psql sessions. Each transaction bumps its aggregate's version (the row lock orders one
        aggregate's transactions, as a real aggregate's would) and enqueues the event with that
        version, then sleeps 0-15 ms before COMMIT: other sessions' later rows commit first."""
        chunks = [order[i::sessions] for i in range(sessions)]
        errors = []

        def session(chunk, seed):
            rng = random.Random(seed)
            p = subprocess.Popen(["psql", self.url, "-v", "ON_ERROR_STOP=1", "-q"], stdin=subprocess.PIPE,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            for aggregate in chunk:
                p.stdin.write(
                    "BEGIN;\n"
                    "WITH v AS (INSERT INTO aggregates (id, version) VALUES ('%(a)s', 1) ON CONFLICT (id) DO UPDATE "
                    "SET version = aggregates.version + 1 RETURNING version)\n"
                    "INSERT INTO idem_outbox (message_id, body, ordering_key) SELECT '%(a)s/' || version, "
                    "convert_to('{\"aggregate\":\"%(a)s\",\"version\":' || version || '}', 'UTF8'), '%(a)s' FROM v;\n"
                    "SELECT pg_sleep(%(s).3f);\nCOMMIT;\n" % {"a": aggregate, "s": rng.random() * 0.015})
            p.stdin.close()
            err = p.stderr.read()
            if p.wait() != 0:
                errors.append(err.strip())

        threads = [threading.Thread(target=session, args=(c, i)) for i, c in enumerate(chunks)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            fail("a writer session failed: %s" % errors[0][:500])

    def counts(self):
        rows = psql(self.url, "SELECT state, count(*) FROM idem_outbox GROUP BY state")
        return dict((s, int(n)) for s, n in (line.split("|") for line in rows.splitlines() if line))

    def close(self):
        try:
            psql(self.admin_url, "DROP DATABASE IF EXISTS %s WITH (FORCE)" % self.db)
        except RuntimeError:
            pass


class SqliteOutbox:
    """The service's own SQLite file; the relay makes idem_outbox in it."""

    def __init__(self, workdir):
        self.path = os.path.join(workdir, "service.db")
        db = sqlite3.connect(self.path)
        db.execute("CREATE TABLE aggregates (id TEXT PRIMARY KEY, version INTEGER NOT NULL DEFAULT 0)")
        db.commit()
        db.close()

    def relay_url(self):
        return "sqlite:" + self.path

    def ready(self):
        db = sqlite3.connect(self.path, timeout=30)
        try:
            return db.execute("SELECT count(*) FROM sqlite_master WHERE name = 'idem_outbox'").fetchone()[0] == 1
        finally:
            db.close()

    def write(self, order, sessions, pace=0.0):
        """One writer (SQLite has one): a transaction per event, its version from the aggregate row;
        `pace` seconds between transactions (the kill loop needs the writing to last)."""
        db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        db.execute("PRAGMA journal_mode = WAL")
        for aggregate in order:
            db.execute("BEGIN IMMEDIATE")
            db.execute("INSERT INTO aggregates (id, version) VALUES (?, 1) ON CONFLICT (id) DO UPDATE "
                       "SET version = version + 1", (aggregate,))
            (version,) = db.execute("SELECT version FROM aggregates WHERE id = ?", (aggregate,)).fetchone()
            body = json.dumps({"aggregate": aggregate, "version": version}).encode()
            db.execute("INSERT INTO idem_outbox (message_id, body, ordering_key) VALUES (?, ?, ?)",
                       ("%s/%d" % (aggregate, version), body, aggregate))
            db.execute("COMMIT")
            if pace:
                time.sleep(pace)
        db.close()

    def counts(self):
        db = sqlite3.connect(self.path, timeout=30)
        try:
            return dict(db.execute("SELECT state, count(*) FROM idem_outbox GROUP BY state").fetchall())
        finally:
            db.close()

    def close(self):
        pass


# ---- the way out: relays, the broker, consumers ----------------------------------------------------

class Chain:
    def __init__(self, args, workdir, outbox, handler, max_attempts=1000):
        self.args, self.workdir, self.outbox, self.handler = args, workdir, outbox, handler
        self.max_attempts = max_attempts
        self.private = None
        self.broker = None
        self.consumers = []
        self.relays = []
        self.restarts = 0  # exits by themselves, started again (check_alive)
        try:
            self._start()
        except BaseException:  # a failure (SystemExit included) leaves nothing running behind
            self.stop()
            raise

    def _start(self):
        args, workdir, outbox, handler = self.args, self.workdir, self.outbox, self.handler
        self.private = brokers.private_server(args.sink, workdir) if args.sink != "webhook" else None
        if args.sink == "webhook":
            sink_url = handler.url()
        else:
            self.broker = brokers.Broker(args.sink, name=brokers.unique("ord"), private=self.private,
                                         fifo=args.sink == "sqs")
            sink_url = self.broker.sink_url()
            self.store = os.path.join(workdir, "consumers.db")
            source = self.source_url()
            if args.sink in ("amqp", "redis_streams"):
                brokers.BrokerTool(brokers.env("IDEM_BROKER_TOOL_BIN")).take(source, idle_ms=50)  # declare
            n = 1 if args.sink == "redis_streams" else 3
            for i in range(n):
                config = os.path.join(workdir, "consume-%d.toml" % i)
                with open(config, "w") as f:
                    # A killed consumer's message is held in the store for the lease: short, so
                    # that the key's next message does not wait long behind it. A stable consumer
                    # name: a restarted one takes its own unacknowledged stream entries first.
                    f.write('source = "%s"\ndeliver = "%s"\nstore = "sqlite:%s"\nordering = "key"\nlease = "3s"\n'
                            'handler_timeout = "2s"\nretry_min = "100ms"\nretry_max = "1s"\nmax_attempts = %d\n'
                            'admin_listen = "off"\nlog_level = "warn"\nname = "ordering"\nconsumer = "consumer-%d"\n'
                            % (source, handler.url(), self.store, self.max_attempts, i))
                self.consumers.append(Proc("consumer-%d" % i, [brokers.env("IDEM_CONSUME_BIN"), "--config", config],
                                           workdir))
        n_relays = 3 if args.outbox == "postgres" else 1
        for i in range(n_relays):
            config = os.path.join(workdir, "relay-%d.toml" % i)
            with open(config, "w") as f:
                f.write('outbox = "%s"\nsink = "%s"\nadmin_listen = "off"\nlog_level = "warn"\nname = "relay-%d"\n'
                        'poll_interval = "20ms"\nretry_min = "100ms"\nretry_max = "1s"\nmax_attempts = %d\n'
                        'lease = "20s"\nwebhook_timeout = "5s"\nconfirm_timeout = "5s"\n'
                        % (outbox.relay_url(), sink_url, i, self.max_attempts))
            self.relays.append(Proc("relay-%d" % i, [brokers.env("IDEM_RELAY_BIN"), "--config", config], workdir))
        brokers.wait_until(lambda: self.check_alive() and outbox.ready(), 30, what="the relays made the outbox")

    def check_alive(self):
        """A relay or consumer that exited by itself: in the kill loops, started again, as its
        supervisor would (one restarted while the broker is away exits 1: it cannot open its
        sink or source); otherwise a failure, with its log."""
        for p in self.processes():
            if not p.alive() and p.proc.returncode >= 0:
                if self.args.scenario == "kills":
                    self.restarts += 1
                    p.start()
                    continue
                with open(p.log_path, errors="replace") as f:
                    fail("%s exited with %d: %s" % (p.name, p.proc.returncode, f.read()[-2000:]))
        return True

    def source_url(self):
        if self.args.sink == "amqp":
            return self.broker.source_url() + "&single_active_consumer=true"
        return self.broker.source_url(group="ordering")

    def processes(self):
        return self.relays + self.consumers

    def restart_broker(self):
        if self.args.sink in ("kafka", "sqs", "redis_streams"):
            brokers.restart_broker(self.args.sink, self.private, brokers.outage_seconds(self.args.sink))

    def stop(self):
        codes = {p.name: p.stop() for p in self.processes()}
        if self.private:
            self.private.stop()
            self.private = None
        return codes


def aggregate_order(seed):
    """Every aggregate EVENTS times, shuffled: the order the writers take them in."""
    order = ["agg-%03d" % a for a in range(AGGREGATES) for _ in range(EVENTS)]
    random.Random(seed).shuffle(order)
    return order


def wait_delivered(chain, outbox, handler, context, timeout=300):
    total = AGGREGATES * EVENTS
    brokers.wait_until(lambda: chain.check_alive() and len(handler.seen()) >= total, timeout, interval=0.2,
                       what="every event at the handler (%s): %d of %d" % (context, len(handler.seen()), total))
    time.sleep(1.0)  # a redelivery still on its way would show as a second call
    counts = outbox.counts()
    if counts.get("sent", 0) != total or counts.get("pending", 0) or counts.get("dead", 0):
        fail("the outbox did not drain to %d sent rows (%s): %s" % (total, context, counts))


def run(args, tmp):
    handler = Handler(os.path.join(tmp, "history.jsonl"), every_call=args.scenario == "storm")
    outbox = PostgresOutbox(brokers.unique("ord")) if args.outbox == "postgres" else SqliteOutbox(tmp)
    chain = None
    try:
        chain = Chain(args, tmp, outbox, handler)
        if args.sink == "kafka":
            time.sleep(brokers.KAFKA_JOIN_MS / 1000.0)  # the group settles before the storm
        context = "%s over %s, %s" % (args.scenario, args.sink, args.outbox)
        # SQLite's one writer commits 5,000 events in about a second: the kill loop needs longer.
        pace = 0.002 if args.scenario == "kills" and args.outbox == "sqlite" else 0.0
        writer = threading.Thread(target=outbox.write, args=(aggregate_order(7), 6) + ((pace,) if pace else ()))
        started = time.monotonic()
        writer.start()
        kills = 0
        if args.scenario == "kills":
            rng = random.Random(11)
            victims = chain.processes()
            restart = threading.Thread(target=chain.restart_broker)
            # While the writers write (about 10 s): a kill every 0.2-0.6 s.
            while kills < KILLS and (writer.is_alive() or len(handler.seen()) < AGGREGATES * EVENTS):
                time.sleep(rng.uniform(0.1, 0.4))
                chain.check_alive()
                victim = rng.choice(victims)
                victim.kill()
                kills += 1
                time.sleep(rng.uniform(0.0, 0.2))
                victim.start()
                if kills == KILLS // 2:
                    restart.start()  # beside the kills: an SQS outage lasts 30 s
            if restart.ident:
                restart.join()
            if kills < KILLS:
                fail("only %d kills happened before the events were all delivered (%s)" % (kills, context))
        writer.join()
        written = time.monotonic() - started
        wait_delivered(chain, outbox, handler, context)
        calls, twice = handler.check(once=args.scenario == "storm", context=context)
        checked = handler.verify_history(context)
        restarts = chain.restarts
        codes = chain.stop()
        chain = None
        if set(codes.values()) != {0}:
            fail("exit codes %s (%s)" % (codes, context))
        log("%s: %d aggregates x %d events in version order, %d handler calls (%d again after kills), %d kills, "
            "%d restarts after exits, written in %.1f s, delivered in %.1f s; %s"
            % (context, AGGREGATES, EVENTS, calls, twice, kills, restarts, written, time.monotonic() - started,
               checked))
    finally:
        if chain:
            chain.stop()
        handler.close()
        outbox.close()


def idemctl(*argv):
    out = subprocess.run([brokers.env("IDEMCTL_BIN")] + list(argv), capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        fail("idemctl %s: exit %d: %s" % (" ".join(argv[:2]), out.returncode, out.stderr.strip()))
    return out.stdout


def run_poison(args, tmp):
    global AGGREGATES, EVENTS
    AGGREGATES, EVENTS = 20, 8  # the point is the hold, not the volume
    poisoned = "agg-003/4"
    held = ["agg-003/%d" % v for v in range(4, EVENTS + 1)]
    handler = Handler(os.path.join(tmp, "history.jsonl"))
    handler.failing.add(poisoned)
    outbox = PostgresOutbox(brokers.unique("ord")) if args.outbox == "postgres" else SqliteOutbox(tmp)
    chain = None
    context = "poison over %s, %s" % (args.sink, args.outbox)
    try:
        chain = Chain(args, tmp, outbox, handler, max_attempts=3)
        if args.sink == "kafka":
            time.sleep(brokers.KAFKA_JOIN_MS / 1000.0)
        outbox.write(aggregate_order(7), 6 if args.outbox == "postgres" else 1)
        total = AGGREGATES * EVENTS
        # Every other aggregate completes; the poisoned one stops before version 4.
        brokers.wait_until(lambda: chain.check_alive() and len(handler.seen()) >= total - len(held), 120,
                           interval=0.2, what="every event but the held ones at the handler (%s)" % context)
        time.sleep(2.0)  # a held event that slipped through would arrive meanwhile
        slipped = handler.seen() & set(held)
        if slipped:
            fail("events of the held aggregate reached the handler (%s): %s" % (context, sorted(slipped)))
        if args.sink == "webhook":
            counts = outbox.counts()
            if counts.get("dead", 0) != 1 or counts.get("pending", 0) != len(held) - 1:
                fail("expected 1 dead row and %d held behind it (%s): %s" % (len(held) - 1, context, counts))
            stats = json.loads(idemctl("outbox", "stats", "--outbox", outbox.relay_url(), "--json"))
            if stats.get("held_keys") != 1:
                fail("idemctl outbox stats shows %s held keys, not 1 (%s)" % (stats.get("held_keys"), context))
            rows = json.loads(idemctl("outbox", "list", "--outbox", outbox.relay_url(), "--state", "dead", "--json"))
            dead = rows["rows"]
            if [r["message_id"] for r in dead] != [poisoned]:
                fail("the dead rows are %s, not [%s] (%s)" % (dead, poisoned, context))
            handler.failing.clear()  # the receiver is fixed
            idemctl("outbox", "retry", "--outbox", outbox.relay_url(), str(dead[0]["id"]))
        else:
            store = "sqlite:" + chain.store
            holds = json.loads(idemctl("holds", "list", "--store", store, "--consumer", "ordering", "--json"))
            want = [{"key": "agg-003", "parked": len(held), "first": poisoned}]
            got = [{k: h[k] for k in ("key", "parked", "first")} for h in holds["held_keys"]]
            if got != want:
                fail("idemctl holds list shows %s, not %s (%s)" % (got, want, context))
            handler.failing.clear()  # the handler is fixed
            tool = brokers.BrokerTool(brokers.env("IDEM_BROKER_TOOL_BIN"))
            dead = chain.broker.take_dead_letters(tool, idle_ms=3000)
            ids = [d["id"] for d in dead]
            if ids != held:
                fail("the dead-letter queue holds %s, not %s in order (%s)" % (ids, held, context))
            # The operator's replay: the dead letters, in their order, back to the queue. On an SQS
            # FIFO queue with new deduplication ids (AWS SDK): SQS drops a copy sent again within 5
            # minutes under the id it came with.
            if args.sink == "sqs":
                chain.private.produce(chain.broker.name, [
                    {"body": d["body"], "id": d["id"], "group": "agg-003", "dedup": d["id"] + "#replay",
                     "attributes": {"ordering_key": "agg-003"}} for d in dead])
            else:
                tool.publish(chain.broker.sink_url(),
                             [{"id": d["id"], "body": d["body"], "ordering_key": "agg-003"} for d in dead])
        wait_delivered(chain, outbox, handler, context, timeout=120)
        calls, twice = handler.check(once=True, context=context)
        checked = handler.verify_history(context)
        if args.sink != "webhook":
            brokers.wait_until(
                lambda: json.loads(idemctl("holds", "list", "--store", "sqlite:" + chain.store, "--consumer",
                                           "ordering", "--json"))["held_keys"] == [], 30,
                what="the key no longer held (%s)" % context)
        codes = chain.stop()
        chain = None
        if set(codes.values()) != {0}:
            fail("exit codes %s (%s)" % (codes, context))
        log("%s: %d aggregates x %d events in version order, the poisoned one held (%d refusals) then completed, "
            "%d handler calls; %s" % (context, AGGREGATES, EVENTS, handler.refused, calls, checked))
    finally:
        if chain:
            chain.stop()
        handler.close()
        outbox.close()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario", choices=["storm", "kills", "poison"])
    parser.add_argument("--outbox", choices=["sqlite", "postgres"], required=True)
    parser.add_argument("--sink", choices=["webhook", "amqp", "redis_streams", "kafka", "sqs"], required=True)
    args = parser.parse_args()
    run_in_scratch_dir("idem-ordering-", lambda tmp: (run_poison if args.scenario == "poison" else run)(args, tmp))


if __name__ == "__main__":
    main()
