"""End to end: one payment carried all the way (docs/outbox.md). The payments service enqueues
payment.succeeded in its outbox in the ledger write's transaction; idem-relay publishes the outbox
to a sink; idem-notifier sends one receipt per payment. Sinks: a webhook (the notifier's), RabbitMQ,
a Redis stream, a Kafka topic on librdkafka's mock cluster and an SQS queue on the fauxqs emulator
(the notifier consuming them).

    test_outbox.py storm|kills|faults|tls_refused --sink webhook|webhook_tls|amqp|amqps|redis_streams|kafka|sqs

  (webhook_tls: the notifier's webhook behind a TLS terminator that requires a client certificate,
  the relay with webhook_ca_file, webhook_cert_file and webhook_key_file; amqps: RabbitMQ's TLS
  listener, amqps://...&cacertfile=, the notifier consuming it over TLS too)

  storm   2,000 payments from 20 clients through idem-gateway, 30 % of the answers dropped on the
          way back (idem-fault-proxy), retried with their keys: every succeeded payment has exactly
          one receipt, no receipt lacks a payment, the outbox drains to 0 pending, money is conserved
  kills   the payments service (in-process: ledger, key and event in one transaction), the relay
          and the notifier SIGKILLed in turn (IDEM_OUTBOX_KILLS each, default 20) while clients pay,
          the broker restarted halfway (Kafka: a broker down and up, a partition leader moved;
          SQS: the endpoint away):
          the same invariants
  faults  a row larger than the sink takes and (webhook) one it refuses: dead with the reason, the
          rest goes on; a row that cannot be decoded: dead with the reason; the sink away for 30 s
          while payments go on: the outbox grows, then drains, nothing lost
  tls_refused  (webhook_tls) a webhook whose certificate names another host, then one from an
          unknown CA, then an expired one: nothing is delivered, the rows stay pending, the
          relay's log names the URL and the reason; then the right certificate: each row once

Binaries from the environment (set by ctest): IDEM_PAYMENTS_BIN, IDEM_GATEWAY_BIN, IDEM_RELAY_BIN,
IDEM_NOTIFIER_BIN, IDEM_FAULT_PROXY_BIN, IDEM_BROKER_TOOL_BIN (and IDEM_KAFKA_MOCK,
IDEM_SQS_EMULATOR). Brokers from scripts/test's servers, or private to the test (Redis, Kafka, SQS).
"""
import argparse
import os
import random
import sqlite3
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "common"))
sys.path.insert(0, os.path.join(HERE, "..", "payments"))
import brokers  # noqa: E402
import harness as h  # noqa: E402
from procs import Proc  # noqa: E402
from scratch import run_in_scratch_dir  # noqa: E402
from tls_terminator import TlsTerminator  # noqa: E402

RELAY_BIN = os.environ.get("IDEM_RELAY_BIN", "")
NOTIFIER_BIN = os.environ.get("IDEM_NOTIFIER_BIN", "")
FAULT_PROXY_BIN = os.environ.get("IDEM_FAULT_PROXY_BIN", "")
TOOL_BIN = os.environ.get("IDEM_BROKER_TOOL_BIN", "")
KILLS = int(os.environ.get("IDEM_OUTBOX_KILLS", "20"))
BALANCE = 10_000_000


class Chain:
    """The outbox's way out: idem-relay on the ledger's file to `sink`, idem-notifier at the end."""

    def __init__(self, sink, workdir, ledger_db, server_cert="server"):
        self.sink, self.workdir, self.ledger_db = sink, workdir, ledger_db
        self.notifier_db = os.path.join(workdir, "notifier.db")
        self.kind = {"webhook_tls": "webhook", "amqps": "amqp"}.get(sink, sink)
        self.private = brokers.private_server(self.kind, workdir)
        self.broker = None
        self.terminator = None
        tls_settings = ""
        if self.kind == "webhook":
            self.notifier_port = brokers.free_port()
            notifier_args = ["--listen", "127.0.0.1:%d" % self.notifier_port]
            sink_url = "http://127.0.0.1:%d/events" % self.notifier_port
            if sink == "webhook_tls":
                # https:// in front of the notifier, a client certificate required (mutual TLS).
                ca = brokers.env("IDEM_TEST_TLS_CA")
                self.terminator = TlsTerminator(self.notifier_port, *brokers.test_pki(server_cert), client_ca=ca)
                sink_url = self.terminator.url("/events")
                cert, key = brokers.test_pki("client-a")
                tls_settings = 'webhook_ca_file = "%s"\nwebhook_cert_file = "%s"\nwebhook_key_file = "%s"\n' % (
                    ca, cert, key)
        else:
            self.broker = brokers.Broker(self.kind, private=self.private, tls=sink == "amqps")
            if self.kind not in ("kafka", "sqs"):  # declare the queue or group (Broker made topics and queues)
                brokers.BrokerTool(TOOL_BIN).take(self.broker.source_url(group="notifier"), idle_ms=50)
            notifier_args = ["--source", self.broker.source_url(group="notifier")]
            sink_url = self.broker.sink_url()
        self.admin_port = brokers.free_port()
        config = os.path.join(workdir, "relay.toml")
        # Retries every second at most, so max_attempts must outlast the notifier's lease (30 s):
        # a notifier killed mid-receipt leaves its key in progress that long, and the webhook answers
        # 409 until then (20 attempts gave up after ~15 s and dead-lettered a payment's receipt).
        with open(config, "w") as f:
            f.write('outbox = "sqlite:%s"\nsink = "%s"\nadmin_listen = "127.0.0.1:%d"\nlog_level = "warn"\n'
                    'poll_interval = "20ms"\nretry_min = "100ms"\nretry_max = "1s"\nmax_attempts = 100\n%s'
                    % (ledger_db, sink_url, self.admin_port, tls_settings))
        self.notifier = Proc("notifier", [NOTIFIER_BIN, "--db", self.notifier_db] + notifier_args, workdir)
        self.relay = Proc("relay", [RELAY_BIN, "--config", config], workdir)
        if self.kind == "webhook":
            brokers.wait_until(lambda: self._answers(self.notifier_port, "/healthz"), 20, what="notifier up")
        brokers.wait_until(lambda: self._answers(self.admin_port, "/healthz"), 20, what="relay up")

    @staticmethod
    def _answers(port, path):
        try:
            return brokers.http_get(port, path, timeout=1)[0] == 200
        except OSError:
            return False

    def restart_broker(self, down_seconds=0.0):
        if self.kind != "webhook":
            brokers.restart_broker(self.kind, self.private, down_seconds)

    def sink_away(self):
        if self.kind == "webhook":
            self.notifier.kill()
        elif self.kind == "amqp":
            subprocess.run(["bash", brokers.SERVERS_SH, "stop-rabbitmq", brokers.env("IDEM_TEST_SERVERS_DIR")],
                           check=True, timeout=120)
        elif self.sink == "kafka":
            self.private.all_brokers("down")
        elif self.sink == "sqs":
            self.private.away()
        else:
            self.private.stop()

    def sink_back(self):
        if self.kind == "webhook":
            self.notifier.start()
        elif self.kind == "amqp":
            subprocess.run(["bash", brokers.SERVERS_SH, "start-rabbitmq", brokers.env("IDEM_TEST_SERVERS_DIR")],
                           check=True, timeout=180)
        elif self.kind == "kafka":
            self.private.all_brokers("up")
        else:
            self.private.start()

    def receipts(self):
        """payment id -> receipts sent."""
        if not os.path.exists(self.notifier_db):
            return {}
        db = sqlite3.connect(self.notifier_db, timeout=30)
        try:
            return dict(db.execute("SELECT payment_id, COUNT(*) FROM receipts GROUP BY payment_id"))
        except sqlite3.OperationalError:
            return {}
        finally:
            db.close()

    def outbox(self):
        """(pending, dead rows as (message_id, last_error))."""
        db = sqlite3.connect(self.ledger_db, timeout=30)
        try:
            (pending,), = db.execute("SELECT COUNT(*) FROM idem_outbox WHERE state = 'pending'")
            dead = db.execute("SELECT message_id, last_error FROM idem_outbox WHERE state = 'dead'").fetchall()
            return pending, dead
        finally:
            db.close()

    def stop(self):
        codes = {"relay": self.relay.stop(), "notifier": self.notifier.stop()}
        if self.private:
            self.private.stop()
        if self.terminator:
            self.terminator.stop()
        return codes


def payments_in(ledger_db):
    db = sqlite3.connect("file:%s?mode=ro" % ledger_db, uri=True, timeout=30)
    try:
        return {row[0] for row in db.execute("SELECT id FROM payments")}
    finally:
        db.close()


def check_delivered(chain, ledger, context, allow_dead=()):
    """Waits for the outbox to drain and every payment's receipt, then checks the invariants."""
    def drained():
        pending, _ = chain.outbox()
        return pending == 0 and set(chain.receipts()) >= payments_in(chain.ledger_db)
    brokers.wait_until(drained, 180, interval=0.3, what="outbox drained and every receipt sent (%s)" % context)
    time.sleep(1.0)  # a redelivery in flight would show as a second receipt
    ledger.check(context=context)
    payments = payments_in(chain.ledger_db)
    receipts = chain.receipts()
    twice = {p: n for p, n in receipts.items() if n != 1}
    if twice:
        h.fail("payments with more than one receipt (%s): %s" % (context, list(twice.items())[:10]))
    strays = set(receipts) - payments
    if strays:
        h.fail("receipts for payments that do not exist (%s): %s" % (context, sorted(strays)[:10]))
    missing = payments - set(receipts)
    if missing:
        h.fail("payments without a receipt (%s): %s" % (context, sorted(missing)[:10]))
    _, dead = chain.outbox()
    unexpected = [d for d in dead if d[0] not in allow_dead]
    if unexpected:
        h.fail("dead outbox rows (%s): %s" % (context, unexpected[:5]))
    return len(payments)


def pay(port, accounts, count, seed, deadline, results, lock):
    rng = random.Random(seed)
    for _ in range(count):
        a, b = rng.sample(accounts, 2)
        r = h.send_until_final(port, "/v1/payments", {"from": a, "to": b, "amount": rng.randint(1, 500),
                                                        "currency": "EUR"}, h.new_key(), deadline)
        with lock:
            results.append(r.status)


def storm(args, tmp):
    db = os.path.join(tmp, "payments.db")
    svc_port, gw_port = h.free_port(), h.free_port()
    service = h.start_service(svc_port, db, "off", log_path=os.path.join(tmp, "svc.log"))
    config = os.path.join(tmp, "gateway.toml")
    h.write_gateway_config(config, gw_port, svc_port, os.path.join(tmp, "idem.db"))
    gateway = h.start_gateway(config, gw_port, log_path=os.path.join(tmp, "gw.log"))
    port_file = os.path.join(tmp, "proxy.port")
    proxy = subprocess.Popen([FAULT_PROXY_BIN, "--listen", "127.0.0.1:0", "--target", "127.0.0.1:%d" % gw_port,
                              "--port-file", port_file, "--drop-rate", "0.3", "--seed", "18"],
                             stdout=subprocess.DEVNULL, stderr=open(os.path.join(tmp, "proxy.log"), "ab"))
    chain = None
    try:
        brokers.wait_until(lambda: os.path.exists(port_file) and open(port_file).read().strip(), 10, what="proxy")
        proxy_port = int(open(port_file).read().strip())
        accounts = h.open_accounts(gw_port, 20, BALANCE)
        ledger = h.Ledger(db)
        chain = Chain(args.sink, tmp, db)
        results, lock = [], threading.Lock()
        deadline = time.monotonic() + 300
        clients = [threading.Thread(target=pay, args=(proxy_port, accounts, 100, i, deadline, results, lock))
                   for i in range(20)]
        for c in clients:
            c.start()
        for c in clients:
            c.join()
        if len(results) != 2000 or set(results) != {201}:
            h.fail("expected 2,000 payments answered 201: %d answers, statuses %s" % (len(results), sorted(set(results))))
        n = check_delivered(chain, ledger, "storm over " + args.sink)
        if n != 2000:
            h.fail("expected 2,000 payments in the ledger, found %d" % n)
        if chain.terminator:
            # Every connection the relay made presented its client certificate.
            subjects = chain.terminator.client_subjects
            if len(subjects) != 1 or "commonName=payments-a" not in next(iter(subjects)):
                h.fail("the webhook's client certificates: %s" % subjects)
        codes = chain.stop()
        if set(codes.values()) != {0}:
            h.fail("relay/notifier exit codes %s" % codes)
        chain = None
        h.log("storm over %s: 2,000 payments, 30%% of answers dropped, one receipt each, outbox drained" % args.sink)
    finally:
        if chain:
            chain.stop()
        for p in (proxy, gateway, service):
            h.stop(p)


def kills(args, tmp):
    db = os.path.join(tmp, "payments.db")
    port = h.free_port()
    svc_argv = [h.PAYMENTS_BIN, "--listen", "127.0.0.1:%d" % port, "--db", db, "--idempotency", "inprocess",
                "--lease-ms", "2000"]
    service = Proc("payments", svc_argv, tmp)
    h.wait_http(port, "/healthz", service.proc, "idem-payments")
    chain = None
    stop = threading.Event()
    try:
        accounts = h.open_accounts(port, 16, BALANCE)
        ledger = h.Ledger(db)
        chain = Chain(args.sink, tmp, db)
        results, lock = [], threading.Lock()
        deadline = time.monotonic() + 400

        def client(i):
            rng = random.Random(100 + i)
            while not stop.is_set():
                a, b = rng.sample(accounts, 2)
                r = h.send_until_final(port, "/v1/payments", {"from": a, "to": b, "amount": rng.randint(1, 500),
                                                                "currency": "EUR"}, h.new_key(), deadline)
                with lock:
                    results.append(r.status)
        clients = [threading.Thread(target=client, args=(i,)) for i in range(6)]
        for c in clients:
            c.start()
        rng = random.Random(5)
        victims = {"payments": service, "relay": chain.relay, "notifier": chain.notifier}
        done = {name: 0 for name in victims}
        restarted = False
        while min(done.values()) < KILLS:
            time.sleep(rng.uniform(0.15, 0.4))
            name = rng.choice([n for n in victims if done[n] < KILLS])
            victims[name].kill()
            done[name] += 1
            victims[name].start()
            if name == "payments":
                h.wait_http(port, "/healthz", service.proc, "idem-payments")
            if not restarted and sum(done.values()) >= 3 * KILLS // 2:
                restarted = True
                chain.restart_broker(down_seconds=brokers.outage_seconds(chain.kind))
        stop.set()
        for c in clients:
            c.join()
        if not results or set(results) != {201}:
            h.fail("every payment should end 201: statuses %s" % sorted(set(results)))
        n = check_delivered(chain, ledger, "kills over " + args.sink)
        codes = chain.stop()
        if set(codes.values()) != {0}:
            h.fail("relay/notifier exit codes %s" % codes)
        chain = None
        h.log("kills over %s: %d payments, %s kills, broker restarted: one receipt each, outbox drained"
              % (args.sink, n, done))
    finally:
        stop.set()
        if chain:
            chain.stop()
        service.kill()


def insert_raw(db_path, message_id, body, headers="{}"):
    """A row as a service in another language would insert it. The table takes an id or header
    values no relay can publish (docs/outbox.md): the relay makes such a row dead."""
    db = sqlite3.connect(db_path, timeout=30)
    try:
        db.execute("INSERT INTO idem_outbox (message_id, body, headers) VALUES (?, ?, ?)", (message_id, body, headers))
        db.commit()
    finally:
        db.close()


def faults(args, tmp):
    db = os.path.join(tmp, "payments.db")
    port = h.free_port()
    service = h.start_service(port, db, "inprocess", log_path=os.path.join(tmp, "svc.log"))
    chain = None
    try:
        accounts = h.open_accounts(port, 4, BALANCE)
        ledger = h.Ledger(db)
        chain = Chain(args.sink, tmp, db)
        results, lock = [], threading.Lock()
        deadline = time.monotonic() + 300
        expected_dead = {"headers/1": "is not a string", "has space/1": "not visible ASCII"}
        insert_raw(db, "headers/1", b"{}", headers='{"n": 1}')
        insert_raw(db, "has space/1", b"{}")
        if args.sink in ("webhook", "amqp", "kafka", "sqs"):
            # RabbitMQ's limit in the test node is 1 MiB (max_message_size), the notifier's body 1 MiB,
            # a Kafka producer's message.max.bytes 1,000,000, an SQS message 256 KiB.
            insert_raw(db, "huge/1", b"x" * (2 * 1024 * 1024))
            expected_dead["huge/1"] = ""
        if args.sink == "webhook":
            insert_raw(db, "garbage/1", b"not an event")
            expected_dead["garbage/1"] = "422"
        pay(port, accounts, 20, 1, deadline, results, lock)
        n = check_delivered(chain, ledger, "faults over " + args.sink, allow_dead=set(expected_dead))
        _, dead = chain.outbox()
        dead = dict(dead)
        for message_id, words in expected_dead.items():
            if message_id not in dead or words not in (dead[message_id] or ""):
                h.fail("row %s should be dead with %r in its reason: %s" % (message_id, words, dead.get(message_id)))

        # The sink away for 30 s while payments go on: the outbox grows, then drains.
        chain.sink_away()
        away_since = time.monotonic()
        pay(port, accounts, 30, 2, deadline, results, lock)
        pending, _ = chain.outbox()
        if pending < 30:
            h.fail("with the sink away the outbox should hold the new events: %d pending" % pending)
        time.sleep(max(0.0, 30 - (time.monotonic() - away_since)))
        chain.sink_back()
        n = check_delivered(chain, ledger, "after the sink was away", allow_dead=set(expected_dead))
        if n != 50:
            h.fail("expected 50 payments, found %d" % n)
        _, dead = chain.outbox()
        if len(dead) != len(expected_dead):
            h.fail("rows dead after the outage: %s" % dead)
        codes = chain.stop()
        if set(codes.values()) != {0}:
            h.fail("relay/notifier exit codes %s" % codes)
        chain = None
        h.log("faults over %s: %s dead with their reasons; 30 s outage drained, 50 receipts" % (args.sink, sorted(expected_dead)))
    finally:
        if chain:
            chain.stop()
        h.stop(service)


def tls_refused(args, tmp):
    """A webhook whose certificate the relay must not accept: another host's, then one from an
    unknown CA. Nothing is delivered, nothing marked sent, the log says which URL and why; with
    the right certificate, every row goes once."""
    if args.sink != "webhook_tls":
        h.fail("tls_refused runs against --sink webhook_tls")
    db = os.path.join(tmp, "payments.db")
    port = h.free_port()
    service = h.start_service(port, db, "inprocess", log_path=os.path.join(tmp, "svc.log"))
    chain = None
    try:
        accounts = h.open_accounts(port, 4, BALANCE)
        ledger = h.Ledger(db)
        results, lock = [], threading.Lock()
        pay(port, accounts, 10, 3, time.monotonic() + 120, results, lock)
        for server_cert, reason in (("wrong-host", "no alternative certificate subject name matches target host name"),
                                    ("unknown-ca", "unable to get local issuer certificate"),
                                    ("expired", "certificate has expired")):
            chain = Chain(args.sink, tmp, db, server_cert=server_cert)
            where = "TLS with https://127.0.0.1:%d failed" % chain.terminator.port
            brokers.wait_until(lambda: where in chain.relay.log() and reason in chain.relay.log(), 30,
                               what="the relay's log naming %s and why" % server_cert)
            time.sleep(1.0)  # some retries more
            pending, dead = chain.outbox()
            if pending != 10 or dead:
                h.fail("%s: rows should stay pending: %d pending, dead %s" % (server_cert, pending, dead))
            if chain.receipts():
                h.fail("%s: receipts sent through a refused webhook: %s" % (server_cert, chain.receipts()))
            if chain.terminator.bytes_forwarded:
                h.fail("%s: %d bytes of requests went through" % (server_cert, chain.terminator.bytes_forwarded))
            codes = chain.stop()
            chain = None
            if set(codes.values()) != {0}:
                h.fail("relay/notifier exit codes %s" % codes)
        chain = Chain(args.sink, tmp, db)
        n = check_delivered(chain, ledger, "tls after refusals")
        if n != 10:
            h.fail("expected 10 payments, found %d" % n)
        codes = chain.stop()
        chain = None
        if set(codes.values()) != {0}:
            h.fail("relay/notifier exit codes %s" % codes)
        h.log("tls_refused: another host's and an unknown CA's certificates refused with their reasons, "
              "nothing delivered; then 10 receipts over mutual TLS")
    finally:
        if chain:
            chain.stop()
        h.stop(service)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario", choices=["storm", "kills", "faults", "tls_refused"])
    parser.add_argument("--sink", choices=["webhook", "webhook_tls", "amqp", "amqps", "redis_streams", "kafka", "sqs"],
                        required=True)
    args = parser.parse_args()
    run_in_scratch_dir("idem-outbox-", lambda tmp: globals()[args.scenario](args, tmp))


if __name__ == "__main__":
    main()
