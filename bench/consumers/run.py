#!/usr/bin/env python3
"""Consumer and outbox throughput, each against its raw baseline on the same broker, in one run.

Consumers (issue "Queues for real"), per broker (RabbitMQ, Redis Streams, Kafka on librdkafka's
mock cluster with three brokers and three partitions a topic, SQS on the fauxqs emulator), N
messages each case, prefetch 64, 8 workers:
  raw              receive + ack, no store (idem-consume-bench raw; on Kafka the ack moves the
                   committed offset, a consume-commit loop; on SQS a receive-delete loop)
  inprocess/STORE  ConsumeLoop + process_once, a no-op handler, STORE = memory, sqlite, redis
  raw-http         receive, POST to the handler, ack, no store (the sidecar's baseline)
  sidecar/STORE    idem-consume delivering to the same handler (nginx `return 200`)
Ratios: inprocess/raw, sidecar/raw-http; CPU per message (the measured process only).

Outbox (issue "The outbox"):
  payments/s of idem-payments --idempotency inprocess (SQLite FULL) with --outbox on and off, wrk
  sending fresh keys, measured in 8 pairs of 3 s loads per round (payments_pairs: both services
  warm, loaded in turn, ABBA); and idem-relay's rows/s (SQLite outbox -> RabbitMQ, -> Kafka, ->
  SQS) against a raw publish loop on the same broker (batches of 100; RabbitMQ: with confirms,
  Kafka: the idempotent producer, waiting for the delivery reports; SQS: SendMessageBatch).

The cases run in rounds; each reports its median round (the payments pair: its median pair).
Servers (RabbitMQ, Redis) are started fresh under a temporary directory (scripts/lib/servers.sh),
the Kafka mock cluster and the SQS emulator by this script (testing/kafka_mock,
testing/sqs_emulator), and stopped at exit.

usage: bench/consumers/run.py --build DIR [--messages N] [--rounds R] [--out-dir DIR] [--quick]
                              [--outbox-only | --consumers-only] [--brokers amqp,redis_streams,kafka,sqs]
  --out-dir: where results.md and consumers_bench.png go; default: update docs/benchmarks.md
  (section "## Consumers and the outbox") and docs/img/consumers_bench.png
"""
import argparse
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SERVERS = os.path.join(ROOT, "scripts", "lib", "servers.sh")
sys.path.insert(0, os.path.join(ROOT, "tests", "common"))
import brokers  # noqa: E402  (PrivateKafka, PrivateSqs: the Kafka mock cluster, the SQS emulator)
from ports import free_port  # noqa: E402
from stores import read_servers_env  # noqa: E402


def ticks(pid):
    """User + system CPU seconds of a process so far."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_payments(binary, db, outbox, under=(), start_seconds=10):
    """idem-payments --idempotency inprocess (SQLite FULL) on a fresh `db`, the outbox on or off,
    with the two accounts bench/consumers/payment.lua pays between: (process, port). `under`: a
    command to run it under (valgrind), which may need more than `start_seconds` to start."""
    port = free_port()
    p = subprocess.Popen(list(under) + [binary, "--listen", "127.0.0.1:%d" % port, "--db", db, "--idempotency",
                                        "inprocess", "--outbox", "on" if outbox else "off"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + start_seconds
        while True:
            try:
                urllib.request.urlopen("http://127.0.0.1:%d/healthz" % port, timeout=1)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("idem-payments did not answer /healthz") from None
                time.sleep(0.05)
        con = sqlite3.connect(db, timeout=30)
        con.execute("INSERT INTO accounts (id, currency, balance, opening, created) VALUES "
                    "('acct_a', 'EUR', 4000000000000, 4000000000000, 0), ('acct_b', 'EUR', 0, 0, 0)")
        con.commit()
        con.close()
    except BaseException:
        p.terminate()
        p.wait()
        raise
    return p, port


class PaymentsLoad:
    """wrk (-t2 -c32, a fresh Idempotency-Key per request) on a started idem-payments, begun at
    construction; result() waits for it: payments/s and the service's CPU µs per payment."""

    def __init__(self, p, port, db, duration):
        self.p, self.db = p, db
        self.cpu0 = ticks(p.pid)
        self.count0 = self.payments()
        lua = os.path.join(ROOT, "bench", "consumers", "payment.lua")
        self.wrk = subprocess.Popen(["wrk", "-t2", "-c32", "-d" + duration, "-s", lua, "http://127.0.0.1:%d" % port],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def result(self):
        out, err = self.wrk.communicate(timeout=600)
        cpu = ticks(self.p.pid) - self.cpu0
        if self.wrk.returncode != 0 or "Non-2xx" in out:
            raise RuntimeError("wrk failed or payments answered non-2xx:\n" + out + err)
        rate = float([l for l in out.splitlines() if l.startswith("Requests/sec")][0].split()[1])
        count = self.payments() - self.count0  # the service may have served earlier loads
        return {"payments_per_s": rate, "cpu_us_per_payment": cpu * 1e6 / max(count, 1)}

    def payments(self):
        con = sqlite3.connect(self.db, timeout=30)
        try:
            (count,), = con.execute("SELECT COUNT(*) FROM payments").fetchall()
            return count
        finally:
            con.close()


def payments_pairs(binary, work, rounds, duration, on_pair=None):
    """The outbox's cost, measured in pairs: ([off], [on]) PaymentsLoad results. Both services are
    started once under `work`, each on its own fresh database, warmed with one discarded load, then
    loaded in turn for `duration` at a time in ABBA order (off-on, on-off, ...). This host's speed
    drifts by more than the outbox costs over tens of seconds; short alternating loads put both
    halves of a pair in the same phase of that drift, and the ABBA order cancels a linear trend
    inside a pair. on_pair(i, off, on) is called after each pair."""
    started = {}
    try:
        for outbox in (False, True):
            db = os.path.join(work, "payments-%s.db" % ("on" if outbox else "off"))
            started[outbox] = (start_payments(binary, db, outbox), db)

        def load(outbox):
            (p, port), db = started[outbox]
            return PaymentsLoad(p, port, db, duration).result()

        for outbox in (False, True):
            load(outbox)  # warm: caches, the page cache, the database's first pages
        off, on = [], []
        for i in range(rounds):
            for outbox in ((False, True) if i % 2 == 0 else (True, False)):
                (on if outbox else off).append(load(outbox))
            if on_pair:
                on_pair(i, off[-1], on[-1])
        return off, on
    finally:
        for (p, _), _ in started.values():
            p.terminate()
            p.wait()


def metric(port, name):
    try:
        text = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=2).read().decode()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


class Run:
    def __init__(self, args):
        self.args = args
        self.work = tempfile.mkdtemp(prefix="idem-consumers-bench-")
        os.chmod(self.work, 0o755)  # the servers drop root (rabbitmq, postgres) and must reach it
        self.bin = lambda *p: os.path.join(args.build, *p)
        subprocess.run(["bash", SERVERS, "start", os.path.join(self.work, "servers"), "rabbitmq", "redis", "postgres"],
                       check=True,
                       stdout=subprocess.DEVNULL)
        self.env = read_servers_env(os.path.join(self.work, "servers", "env"))
        self.procs = []
        self.handler_port = free_port()
        prefix = os.path.join(self.work, "nginx")
        os.makedirs(os.path.join(prefix, "logs"))
        with open(os.path.join(prefix, "nginx.conf"), "w") as f:
            f.write("daemon off; worker_processes 1; pid %s/nginx.pid; error_log %s/logs/error.log warn;\n"
                    "events { worker_connections 1024; }\n"
                    "http { access_log off; client_body_temp_path %s/body; keepalive_requests 1000000;\n"
                    "  server { listen 127.0.0.1:%d; location / { return 200 \"ok\"; } } }\n"
                    % (prefix, prefix, prefix, self.handler_port))
        self.procs.append(subprocess.Popen([shutil.which("nginx") or "/usr/sbin/nginx", "-p", prefix, "-c",
                                            os.path.join(prefix, "nginx.conf")], stderr=subprocess.DEVNULL))
        time.sleep(0.5)
        self.handler = "http://127.0.0.1:%d/messages" % self.handler_port
        self.n = 0
        os.environ["IDEM_KAFKA_MOCK"] = self.bin("testing", "kafka_mock", "idem-kafka-mock")
        os.environ["IDEM_SQS_EMULATOR"] = os.path.join(ROOT, "testing", "sqs_emulator", "serve.mjs")
        os.environ["IDEM_FAULT_PROXY_BIN"] = self.bin("testing", "fault_proxy", "idem-fault-proxy")
        self.kafka = brokers.PrivateKafka(self.work)
        self.sqs = brokers.PrivateSqs(self.work)

    def close(self):
        self.kafka.stop()
        self.sqs.stop()
        for p in self.procs:
            p.terminate()
            p.wait()
        subprocess.run(["bash", SERVERS, "stop", os.path.join(self.work, "servers")], stdout=subprocess.DEVNULL)
        shutil.rmtree(self.work, ignore_errors=True)

    def urls(self, broker):
        """(source, sink) URLs of a fresh queue or stream."""
        self.n += 1
        name = "bench-%d-%d" % (os.getpid(), self.n)
        if broker == "amqp":
            base = self.env["IDEM_TEST_AMQP_URL"].rstrip("/")
            return "%s?queue=%s" % (base, name), "%s?exchange=&routing_key=%s" % (base, name)
        if broker in ("kafka", "sqs"):
            topic = brokers.Broker(broker, name=name, private=self.kafka if broker == "kafka" else self.sqs)
            return topic.source_url(group="bench"), topic.sink_url()
        netloc = urllib.parse.urlsplit(self.env["IDEM_TEST_REDIS_URL"]).netloc
        return "redis+stream://%s/%s?group=bench" % (netloc, name), "redis+stream://%s/%s" % (netloc, name)

    def tool(self, *argv):
        out = subprocess.run([self.bin("bench", "consumers", "idem-consume-bench")] + [str(a) for a in argv],
                             capture_output=True, text=True, timeout=600)
        if out.returncode != 0:
            raise RuntimeError("idem-consume-bench %s: %s" % (argv[0], out.stderr))
        return json.loads(out.stdout.strip().splitlines()[-1])

    def prepared(self, broker):
        source, sink = self.urls(broker)
        # Declare the queue (or group) before publishing: open a source on it once. (Kafka
        # topics and SQS queues are made by urls(); a new Kafka group starts at the earliest offset.)
        if broker not in ("kafka", "sqs"):
            subprocess.run([self.bin("tests", "tools", "idem-broker-tool"), "take", source, "--idle-ms", "50"],
                           check=True, stdout=subprocess.DEVNULL)
        self.tool("publish", sink, self.args.messages)
        return source

    def store_url(self, store):
        if store == "memory":
            return "memory:"
        if store == "sqlite":
            return "sqlite:%s" % os.path.join(self.work, "store-%d.db" % self.n)
        if store == "postgres":  # a database of its own
            base = self.env["IDEM_TEST_POSTGRES_URL"]
            subprocess.run(["psql", base, "-qc", "CREATE DATABASE bench_%d" % self.n], check=True,
                           stdout=subprocess.DEVNULL)
            parts = urllib.parse.urlsplit(base)
            return urllib.parse.urlunsplit(parts._replace(path="/bench_%d" % self.n))
        return self.env["IDEM_TEST_REDIS_URL"] + "/%d" % (self.n % 15 + 1)  # a database of its own

    def sidecar(self, source, store):
        admin = free_port()
        p = subprocess.Popen([self.bin("consume", "idem-consume"), "--source", source, "--deliver", self.handler,
                              "--store", self.store_url(store), "--admin-listen", "127.0.0.1:%d" % admin,
                              "--log-level", "warn"], stderr=open(os.path.join(self.work, "sidecar.log"), "ab"))
        try:
            n = self.args.messages
            deadline = time.time() + 600
            while (metric(admin, "idem_consume_received_total") or 0) == 0:
                if time.time() > deadline or p.poll() is not None:
                    raise RuntimeError("idem-consume did not start consuming")
                time.sleep(0.002)
            t0, cpu0 = time.monotonic(), ticks(p.pid)
            while (metric(admin, "idem_consume_processed_total") or 0) < n:
                if time.time() > deadline:
                    raise RuntimeError("idem-consume did not finish")
                time.sleep(0.01)
            seconds, cpu = time.monotonic() - t0, ticks(p.pid) - cpu0
            return {"msgs_per_s": n / seconds, "cpu_us_per_msg": cpu * 1e6 / n}
        finally:
            p.terminate()
            p.wait()

    def consumer_round(self, broker):
        out = {}
        n = self.args.messages
        out["raw"] = self.tool("raw", self.prepared(broker), n)
        for store in ("memory", "sqlite", "redis", "postgres"):
            out["inprocess/" + store] = self.tool("inprocess", self.prepared(broker), n, self.store_url(store))
        for store in ("sqlite", "redis"):  # a claim and a completion per message, as before batching
            out["inprocess-single/" + store] = self.tool("inprocess", self.prepared(broker), n, self.store_url(store),
                                                         "single")
        out["raw-http"] = self.tool("raw-http", self.prepared(broker), n, self.handler)
        for store in ("memory", "sqlite", "redis", "postgres"):
            out["sidecar/" + store] = self.sidecar(self.prepared(broker), store)
        return out

    # --- the outbox ----------------------------------------------------------------------------

    def payments_pairs(self):
        """The payments pair (payments_pairs): 8 pairs of 3 s loads a round (1 pair of 1 s quick)."""
        work = os.path.join(self.work, "payments")
        os.makedirs(work)
        try:
            return payments_pairs(self.bin("examples", "payments", "idem-payments"), work,
                                  1 if self.args.quick else 8 * self.args.rounds, "1s" if self.args.quick else "3s")
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def relay_rate(self, sink, keys=0):
        """Rows/s of one relay from a SQLite outbox to `sink`; keys > 0: row i has the ordering
        key k(i % keys)."""
        n = self.args.messages
        db = os.path.join(self.work, "outbox-%d.db" % self.n)
        sqlite3.connect(db).close()  # an empty file: the relay creates the table in it
        admin = free_port()
        p = subprocess.Popen([self.bin("relay", "idem-relay"), "--outbox", "sqlite:" + db, "--sink", sink,
                              "--admin-listen", "127.0.0.1:%d" % admin, "--log-level", "warn"],
                             stderr=open(os.path.join(self.work, "relay.log"), "ab"))
        try:
            while metric(admin, "idem_relay_pending") is None:
                time.sleep(0.02)
            # Rows inserted as a service in any language would, the relay stopped meanwhile, so that
            # the clock starts with all of them there.
            p.send_signal(19)  # SIGSTOP
            con = sqlite3.connect(db, timeout=30)
            con.executemany("INSERT INTO idem_outbox (message_id, body, ordering_key) VALUES (?, ?, ?)",
                            (("row-%d-%d" % (self.n, i), b"x" * 300, "k%d" % (i % keys) if keys else None)
                             for i in range(n)))
            con.commit()
            t0, cpu0 = time.monotonic(), ticks(p.pid)
            p.send_signal(18)  # SIGCONT
            # One relay publishes in enqueue order and a failed row holds back the rows after it,
            # so the last row sent means all were. Its state is one lookup on the message-id
            # index; counting the pending rows is a scan of the table (schema 7 has no index of
            # them) that took CPU from the relay on two cores. The count comes once, untimed.
            # With ordering keys the last row is not the last sent: each key's last row is looked
            # up instead (the same index), a few at a time.
            last = ["row-%d-%d" % (self.n, i) for i in range(max(0, n - max(keys, 1)), n)]
            while last:
                state = con.execute("SELECT state FROM idem_outbox WHERE message_id = ?", (last[-1],)).fetchone()[0]
                if state == "pending":
                    time.sleep(0.01)
                else:
                    last.pop()
            seconds, cpu = time.monotonic() - t0, ticks(p.pid) - cpu0
            (pending,), = con.execute("SELECT COUNT(*) FROM idem_outbox WHERE state <> 'sent'").fetchall()
            con.close()
            if pending:
                raise RuntimeError("the relay left %d rows unsent" % pending)
            return {"msgs_per_s": n / seconds, "cpu_us_per_msg": cpu * 1e6 / n}
        finally:
            p.terminate()
            p.wait()

    def ordering_round(self):
        """Issue 36's figures: relay rows/s and in-process consumer messages/s (memory store) with
        ordering keys (10,000 keys, 10 keys) against the same without, on Kafka and RabbitMQ. The
        consumer with keys held behind dead letters (the default: a hold read per message), and
        without holds ("consumer-pass")."""
        out = {}
        for broker in ("kafka", "amqp"):
            for keys in (0, 10000, 10):
                _, sink = self.urls(broker)
                out["%s/relay/%d" % (broker, keys)] = self.relay_rate(sink, keys)
            for keys, what, mode in ((0, "consumer", "none"), (10000, "consumer", "key"), (10, "consumer", "key"),
                                     (10000, "consumer-pass", "key-pass"), (10, "consumer-pass", "key-pass")):
                source, sink = self.urls(broker)
                if broker != "kafka":
                    subprocess.run([self.bin("tests", "tools", "idem-broker-tool"), "take", source, "--idle-ms", "50"],
                                   check=True, stdout=subprocess.DEVNULL)
                self.tool("publish", sink, self.args.messages, 100, keys)
                out["%s/%s/%d" % (broker, what, keys)] = self.tool("inprocess", source, self.args.messages, "memory:",
                                                                   mode)
        return out

    def outbox_round(self):
        out = {}
        for broker in ("amqp", "kafka", "sqs"):
            _, sink = self.urls(broker)
            out[broker + "/publish-raw"] = self.tool("outbox-raw", sink, self.args.messages)
            _, sink = self.urls(broker)
            out[broker + "/relay"] = self.relay_rate(sink)
        return out


def median(rounds, case, field):
    return statistics.median(r[case][field] for r in rounds)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build", required=True)
    parser.add_argument("--messages", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out-dir")
    parser.add_argument("--quick", action="store_true", help="1 round of 2,000 messages: proves the script works")
    parser.add_argument("--outbox-only", action="store_true",
                        help="only the outbox's cases, printed (docs/benchmarks.md is left as it is)")
    parser.add_argument("--consumers-only", action="store_true",
                        help="only the consumers' cases, printed (docs/benchmarks.md is left as it is)")
    parser.add_argument("--brokers", default="amqp,redis_streams,kafka,sqs", help="the consumers' brokers")
    parser.add_argument("--ordering-only", action="store_true",
                        help="only ordering keys' cost (relay and in-process consumer, Kafka and RabbitMQ), printed")
    args = parser.parse_args()
    if args.quick:
        args.messages, args.rounds = 2000, 1
    args.build = os.path.abspath(args.build)
    run = Run(args)
    if args.ordering_only:
        try:
            rounds = [run.ordering_round() for _ in range(args.rounds)]
        finally:
            run.close()
        print("| broker | what | no keys | 10,000 keys | ratio | 10 keys | ratio |\n|---|---|---:|---:|---:|---:|---:|")
        for broker in ("kafka", "amqp"):
            for what in ("relay", "consumer", "consumer-pass"):
                case = lambda k: "%s/%s/%d" % (broker, "consumer" if k == 0 and what == "consumer-pass" else what,  # noqa: E731
                                               k)
                ratio = lambda k: statistics.median(r[case(k)]["msgs_per_s"] / r[case(0)]["msgs_per_s"]  # noqa: E731
                                                    for r in rounds)
                print("| %s | %s | %.0f | %.0f | %.2f | %.0f | %.2f |" % (
                    broker, what, median(rounds, case(0), "msgs_per_s"), median(rounds, case(10000), "msgs_per_s"),
                    ratio(10000), median(rounds, case(10), "msgs_per_s"), ratio(10)))
        return 0
    try:
        consumed = () if args.outbox_only else args.brokers.split(",")
        results = {b: [run.consumer_round(b) for _ in range(args.rounds)] for b in consumed}
        outbox = [] if args.consumers_only else [run.outbox_round() for _ in range(args.rounds)]
        pairs = None if args.consumers_only else run.payments_pairs()
    finally:
        run.close()

    lines = ["| broker | case | messages/s | vs baseline | CPU µs per message |", "|---|---|---:|---:|---:|"]
    plot = []
    for broker, rounds in results.items():
        for case in rounds[0]:
            base = "raw" if not case.startswith("sidecar") and case != "raw-http" else "raw-http"
            rate = median(rounds, case, "msgs_per_s")
            ratio = statistics.median(r[case]["msgs_per_s"] / r[base]["msgs_per_s"] for r in rounds)
            lines.append("| %s | %s | %.0f | %s | %.1f |" % (broker, case, rate, "" if case == base else "%.2f" % ratio,
                                                           median(rounds, case, "cpu_us_per_msg")))
            plot.append('"%s %s" %.0f' % ({"amqp": "rmq", "redis_streams": "redis"}.get(broker, broker), case, rate))
    if args.consumers_only:
        print("\n".join(lines))
        return 0

    def pairs_median(outbox_on, field):
        return statistics.median(r[field] for r in pairs[1 if outbox_on else 0])

    cost = statistics.median(1 - b["payments_per_s"] / a["payments_per_s"] for a, b in zip(*pairs))

    def relay_ratio(broker):
        return statistics.median(r[broker + "/relay"]["msgs_per_s"] / r[broker + "/publish-raw"]["msgs_per_s"]
                                 for r in outbox)
    lines += ["", "| outbox case | rate | ratio | CPU µs per item |", "|---|---:|---:|---:|",
              "| payments, outbox off (in-process, SQLite FULL) | %.0f payments/s | | %.1f |"
              % (pairs_median(False, "payments_per_s"), pairs_median(False, "cpu_us_per_payment")),
              "| payments, outbox on | %.0f payments/s | %.2f (costs %.1f %%) | %.1f |"
              % (pairs_median(True, "payments_per_s"), 1 - cost, cost * 100, pairs_median(True, "cpu_us_per_payment")),
              "| raw publish with confirms to RabbitMQ (batches of 100) | %.0f messages/s | | %.1f |"
              % (median(outbox, "amqp/publish-raw", "msgs_per_s"), median(outbox, "amqp/publish-raw", "cpu_us_per_msg")),
              "| idem-relay, SQLite outbox to RabbitMQ | %.0f rows/s | %.2f | %.1f |"
              % (median(outbox, "amqp/relay", "msgs_per_s"), relay_ratio("amqp"), median(outbox, "amqp/relay", "cpu_us_per_msg")),
              "| raw idempotent produce to Kafka (batches of 100) | %.0f messages/s | | %.1f |"
              % (median(outbox, "kafka/publish-raw", "msgs_per_s"), median(outbox, "kafka/publish-raw", "cpu_us_per_msg")),
              "| idem-relay, SQLite outbox to Kafka | %.0f rows/s | %.2f | %.1f |"
              % (median(outbox, "kafka/relay", "msgs_per_s"), relay_ratio("kafka"), median(outbox, "kafka/relay", "cpu_us_per_msg")),
              "| raw SendMessageBatch to SQS (batches of 100, 10 a call) | %.0f messages/s | | %.1f |"
              % (median(outbox, "sqs/publish-raw", "msgs_per_s"), median(outbox, "sqs/publish-raw", "cpu_us_per_msg")),
              "| idem-relay, SQLite outbox to SQS | %.0f rows/s | %.2f | %.1f |"
              % (median(outbox, "sqs/relay", "msgs_per_s"), relay_ratio("sqs"), median(outbox, "sqs/relay", "cpu_us_per_msg"))]
    table = "\n".join(lines) + "\n"
    print(table)
    if args.outbox_only:
        return 0
    out_dir = args.out_dir or os.path.join(ROOT, "docs", "img")
    os.makedirs(out_dir, exist_ok=True)
    dat = os.path.join(out_dir if args.out_dir else tempfile.gettempdir(), "consumers_bench.dat")
    with open(dat, "w") as f:
        f.write("\n".join(plot) + "\n")
    png = os.path.join(out_dir, "consumers_bench.png")
    subprocess.run(["gnuplot", "-e", "datafile='%s'; outfile='%s'" % (dat, png),
                    os.path.join(ROOT, "bench", "consumers", "plot.gp")], check=True)
    if args.out_dir:
        with open(os.path.join(args.out_dir, "results.md"), "w") as f:
            f.write(table)
    else:
        update_docs(table, args)


def update_docs(table, args):
    path = os.path.join(ROOT, "docs", "benchmarks.md")
    with open(path) as f:
        text = f.read()
    head = "## Consumers and the outbox"
    section = (head + "\n\nMeasured by `bench/consumers/run.py --build build/release --messages %d --rounds %d` "
               "(%s, %d cores). Each figure is the median round (the payments: the median pair of 3 s loads, "
               "both services warm and loaded in turn); ratios are medians of per-round (per-pair) ratios. CPU is the "
               "measured process's only (the bench tool, idem-consume, idem-payments or idem-relay), not the broker's.\n\n"
               % (args.messages, args.rounds, time.strftime("%Y-%m-%d"), os.cpu_count())
               + table + "\n![consumers](img/consumers_bench.png)\n")
    image = "![consumers](img/consumers_bench.png)\n"
    if head in text:
        # The figures are replaced; the notes written under the chart (how to read them, what was
        # tried) are kept.
        start = text.index(head)
        end = text.find("\n## ", start + len(head))
        at_image = text.find(image, start)
        if at_image != -1 and (end == -1 or at_image < end):
            end = at_image + len(image)
        text = text[:start] + section + (text[end:] if end != -1 else "")
    else:
        text = text.rstrip("\n") + "\n\n" + section
    with open(path, "w") as f:
        f.write(text)


if __name__ == "__main__":
    sys.exit(main())
