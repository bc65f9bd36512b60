"""End to end: idem-consume between a real broker (RabbitMQ, a Redis stream, a Kafka topic on
librdkafka's mock cluster, or an SQS queue on the fauxqs emulator) and a real HTTP handler, on a shared SQLite store. Every claim that
something happens once is counted by the handler itself.

    test_consume.py --broker amqp|amqps|redis_streams|kafka|sqs --consume PATH --tool PATH [--idemctl PATH]
                    [unittest args]

  (amqps: RabbitMQ's TLS listener, verified against the test CA: amqps://...&cacertfile=)

  storm     10,000 ids, each published 1-3 times (shuffled), three competing sidecars: every id
            POSTed exactly once; nothing left in the queue
  kills     sidecars SIGKILLed in a loop (IDEM_CONSUME_KILLS, default 20) and the broker restarted
            mid-run (Kafka: a broker down and up, then a partition leader moved; every kill also
            moves partitions between the sidecars; SQS: the endpoint away for 30 s); with on_lease_expiry = "unknown" no id is POSTed twice and the parked ones
            are bounded by kills x in-flight; with a handler deduping by Idempotency-Key, every id
            has exactly one effect and none is lost
  store kills
            the shared store (a private PostgreSQL, a private Redis with appendfsync always)
            SIGKILLed 5 times (IDEM_CONSUME_STORE_KILLS) while three sidecars claim and record
            batches, on_lease_expiry = "unknown": every delivery acked as processed or duplicate
            has its completed record (idemctl list), every id is recorded or parked, none POSTed
            twice
  bad       no id, a bad id, a body over the limit, a handler answering 400, a handler that never
            answers: dead-lettered with their reasons; wrong credentials (SQS: an unknown queue,
            as the emulator takes any credentials): one clear line, exit 1
  sigterm   SIGTERM with deliveries in flight: they finish, are acked, exit 0; the rest come back
  admin     /metrics, /healthz, /readyz
  tls       the storm delivered to an https:// handler that requires a client certificate (mutual
            TLS): the same exact counts; a handler whose certificate names another host, comes
            from an unknown CA or expired: no delivery counted, the reason (and the URL) in the log; a client
            key file other users can read: refused at start, naming the file; an amqps:// source
            whose CA is not trusted: one clear line, exit 1
"""
import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import shutil
import time
import unittest
import urllib.parse

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "common"))
sys.path.insert(0, os.path.join(HERE, "..", "gateway"))
import brokers  # noqa: E402
import history  # noqa: E402
import stores  # noqa: E402
from harness import Process  # noqa: E402
from scratch import run_in_scratch_dir  # noqa: E402

ARGS = None
KILLS = int(os.environ.get("IDEM_CONSUME_KILLS", "20"))
STORE_KILLS = int(os.environ.get("IDEM_CONSUME_STORE_KILLS", "5"))


class Sidecar:
    """One idem-consume process, restartable with the same settings."""

    def __init__(self, workdir, source, deliver, store, settings=None, name="sidecar"):
        self.workdir = workdir
        self.name = name
        self.config = os.path.join(workdir, "%s.toml" % name)
        # `settings` may replace these (log_level = "info": a line per outcome, acks included).
        values = dict({"source": source, "deliver": deliver, "store": store, "log_level": "warn"}, **(settings or {}))
        lines = ["%s = %s" % (key, value if isinstance(value, int) else '"%s"' % value) for key, value in values.items()]
        with open(self.config, "w") as f:
            f.write("\n".join(lines) + "\n")
        self.process = None
        self.admin_port = None
        self.start()

    def start(self):
        self.admin_port = brokers.free_port()
        self.process = Process(self.name, [ARGS.consume, "--config", self.config, "--admin-listen",
                                           "127.0.0.1:%d" % self.admin_port], self.workdir)

    def wait_ready(self, timeout=60):
        def ready():
            if not self.process.alive():
                raise AssertionError("%s exited: %s" % (self.name, self.process.log()[-2000:]))
            try:
                return brokers.http_get(self.admin_port, "/readyz")[0] == 200
            except OSError:
                return False
        brokers.wait_until(ready, timeout, what="%s ready" % self.name)

    def metrics(self):
        return brokers.parse_metrics(brokers.http_get(self.admin_port, "/metrics")[1])

    def kill(self):
        self.process.kill()

    def stop(self):
        return self.process.stop(timeout=40)


class ConsumeTest(unittest.TestCase):
    """Each test gets a scratch directory, a fresh queue, stream or topic and (Redis, Kafka) a
    private server it may restart."""

    def run(self, result=None):
        def body(path):
            self.dir = path
            self.private = brokers.private_server(ARGS.broker, path)
            try:
                super(ConsumeTest, self).run(result)
            finally:
                if self.private:
                    self.private.stop()
        run_in_scratch_dir("idem-consume-", body)
        return result

    def setUp(self):
        self.tool = brokers.BrokerTool(ARGS.tool)
        self.broker = brokers.Broker(broker_kind(), private=self.private, tls=ARGS.broker == "amqps")
        self.broker.declare(self.tool)
        self.store = "sqlite:%s" % os.path.join(self.dir, "consume.db")
        self.sidecars = []
        self.handler = None

    def tearDown(self):
        for s in self.sidecars:
            s.process.kill()
        if self.handler:
            self.handler.stop()
        if self._outcome_failed():
            for s in self.sidecars:
                sys.stderr.write("---- %s log (tail)\n%s\n" % (s.name, s.process.log()[-4000:]))

    def _outcome_failed(self):
        outcome = getattr(self, "_outcome", None)
        errors = getattr(outcome, "errors", None)
        if errors is None:
            result = getattr(outcome, "result", None)
            return bool(result and (result.failures or result.errors))
        return any(err for _, err in errors)

    def sidecar(self, settings=None, **kw):
        s = Sidecar(self.dir, self.broker.source_url(), self.handler.url, self.store, settings,
                    name="sidecar-%d" % len(self.sidecars), **kw)
        self.sidecars.append(s)
        return s

    def left_in_queue(self):
        return self.broker.take_left(self.tool)

    def dead_letters(self):
        out = {}
        for m in self.broker.take_dead_letters(self.tool):
            h = {k.lower(): v for k, v in m["headers"].items()}
            reason = h.get("x-idem-reason") or h.get("reason")
            out.setdefault(reason, []).append(m)
        return out

    # -----------------------------------------------------------------------------------------

    def test_storm_three_sidecars_post_each_of_ten_thousand_ids_once(self):
        self._storm(brokers.Handler())

    def _storm(self, handler, settings=None, ids=10_000):
        """`ids` ids, each published 1-3 times (shuffled), three competing sidecars: every id POSTed
        exactly once, nothing left in the queue."""
        self.handler = handler
        rng = random.Random(7)
        messages = []
        for i in range(ids):
            for _ in range(rng.randint(1, 3)):
                messages.append({"id": "storm-%05d" % i, "body": '{"n":%d}' % i})
        rng.shuffle(messages)
        for _ in range(3):
            self.sidecar(dict({"workers": 8, "prefetch": 64}, **(settings or {})))
        for s in self.sidecars:
            s.wait_ready()
        if ARGS.broker == "amqps":
            # Each sidecar's connection is TLS with its client certificate, as RabbitMQ saw it.
            peers = [p for p in brokers.rabbitmq_tls_peers() if "CN=payments-a" in p]
            self.assertGreaterEqual(len(peers), 3, peers)
        self.assertEqual(self.tool.publish(self.broker.sink_url(), messages), len(messages))

        def settled():
            total = 0
            for s in self.sidecars:
                m = s.metrics()
                total += m.get("idem_consume_processed_total", 0) + m.get("idem_consume_duplicates_total", 0)
            # Counts alone cannot end the wait: a Kafka rebalance hands a partition's unacked
            # messages to another sidecar, which counts them again as duplicates.
            return total >= len(messages) and len(self.handler.call_counts()) >= ids and self.broker.settled()
        brokers.wait_until(settled, 240, interval=0.5, what="every delivery settled")
        for s in self.sidecars:
            self.assertEqual(s.stop(), 0, s.process.log()[-2000:])
        calls = self.handler.call_counts()
        self.assertEqual(len(calls), ids)
        twice = {k: n for k, n in calls.items() if n != 1}
        self.assertEqual(twice, {}, "ids POSTed more than once")
        self.assertEqual(self.left_in_queue(), [])

    # ---- TLS to the handler ---------------------------------------------------------------

    def _client_tls(self):
        """The sidecar's settings for the test CA and client certificate client-a."""
        cert, key = brokers.test_pki("client-a")
        return {"handler_ca_file": brokers.env("IDEM_TEST_TLS_CA"), "handler_cert_file": cert, "handler_key_file": key}

    def test_tls_storm_to_an_https_handler_requiring_a_client_certificate(self):
        cert, key = brokers.test_pki("server")
        handler = brokers.Handler(tls={"cert": cert, "key": key, "client_ca": brokers.env("IDEM_TEST_TLS_CA")})
        self.assertTrue(handler.url.startswith("https://"))
        self._storm(handler, self._client_tls())
        # Every POST came over a connection with the sidecars' client certificate.
        subjects = handler.client_subjects
        self.assertEqual(len(subjects), 1, subjects)
        self.assertIn("commonName=payments-a", next(iter(subjects)))

    def _undeliverable(self, server_cert, expected_reason):
        """A handler serving `server_cert`, which the sidecar must not accept: three messages are
        retried, then dead-lettered as poison, none reaches the handler, none counts as
        processed, and the log says which URL and why."""
        cert, key = brokers.test_pki(server_cert)
        self.handler = brokers.Handler(tls={"cert": cert, "key": key})
        s = self.sidecar(dict(self._client_tls(), max_attempts=2, retry_min="50ms", retry_max="100ms"))
        s.wait_ready()
        ids = ["%s-%d" % (server_cert, i) for i in range(3)]
        self.tool.publish(self.broker.sink_url(), [{"id": i, "body": "{}"} for i in ids])
        brokers.wait_until(lambda: s.metrics().get('idem_consume_dead_lettered_total{reason="poison"}', 0) >= 3, 60,
                           what="three poison dead letters")
        m = s.metrics()
        self.assertEqual(s.stop(), 0, s.process.log()[-2000:])
        self.assertEqual(m.get("idem_consume_processed_total", 0), 0, m)
        self.assertEqual(self.handler.call_counts(), {})
        dead = self.dead_letters()
        self.assertEqual(sorted(d["id"] for d in dead.get("poison", [])), ids, dead)
        log = s.process.log()
        port = self.handler.server.server_address[1]
        self.assertIn("TLS with https://127.0.0.1:%d failed" % port, log)
        self.assertIn(expected_reason, log)

    def test_tls_handler_certificate_for_another_host_is_never_delivered_to(self):
        self._undeliverable("wrong-host", "no alternative certificate subject name matches target host name '127.0.0.1'")

    def test_tls_handler_certificate_from_an_unknown_ca_is_never_delivered_to(self):
        self._undeliverable("unknown-ca", "unable to get local issuer certificate")

    def test_tls_handler_certificate_that_expired_is_never_delivered_to(self):
        self._undeliverable("expired", "certificate has expired")

    def test_tls_client_key_file_others_can_read_is_refused_at_start(self):
        self.handler = brokers.Handler()
        settings = self._client_tls()
        loose = os.path.join(self.dir, "loose.key")
        shutil.copyfile(settings["handler_key_file"], loose)
        os.chmod(loose, 0o644)
        cert = settings["handler_cert_file"]
        url = "https://127.0.0.1:%d/messages" % self.handler.server.server_address[1]

        def start(name, **tls):
            config = os.path.join(self.dir, name + ".toml")
            with open(config, "w") as f:
                f.write('source = "%s"\ndeliver = "%s"\nstore = "%s"\nadmin_listen = "off"\n' %
                        (self.broker.source_url(), url, self.store))
                f.write("".join('%s = "%s"\n' % kv for kv in dict(settings, **tls).items()))
            p = Process(name, [ARGS.consume, "--config", config], self.dir)
            self.assertEqual(p.wait(30), 2, p.log())
            self.assertEqual(len(p.log().strip().splitlines()), 1, p.log())
            self.assertNotIn("BEGIN", p.log())  # no key material, whatever went wrong
            return p.log()
        log = start("loose-key", handler_key_file=loose)
        self.assertIn(loose, log)
        self.assertIn("mode 0644", log)
        # The key of another certificate: refused at start too, not at every delivery.
        log = start("other-key", handler_key_file=brokers.test_pki("client-b")[1])
        self.assertIn("does not hold the key of " + cert, log)
        # An encrypted key without its passphrase file.
        enc_cert, enc_key = brokers.test_pki("encrypted-key")
        log = start("no-passphrase", handler_cert_file=enc_cert, handler_key_file=enc_key)
        self.assertIn("needs key_passphrase_file", log)

    def test_amqps_source_whose_ca_is_not_trusted_is_one_clear_line(self):
        self.handler = brokers.Handler()
        tls_broker = brokers.Broker("amqp", tls=True)
        # Trusting another CA than the one that signed the node's certificate.
        other_ca = os.path.join(brokers.env("IDEM_TEST_TLS_DIR"), "other-ca.pem")
        source = tls_broker.source_url().replace(urllib.parse.quote(brokers.env("IDEM_TEST_TLS_CA"), safe=""),
                                                 urllib.parse.quote(other_ca, safe=""))
        self.assertNotEqual(source, tls_broker.source_url())
        p = Process("amqps-unknown-ca", [ARGS.consume, "--source", source, "--deliver", self.handler.url,
                                         "--store", self.store, "--admin-listen", "off"], self.dir)
        self.assertEqual(p.wait(30), 1, p.log())
        log = p.log()
        self.assertEqual(len(log.strip().splitlines()), 1, log)
        self.assertIn("certificate verify failed", log)
        self.assertIn("amqps://idem:***@127.0.0.1:", log)
        self.assertNotIn(brokers.env("IDEM_TEST_AMQP_PASSWORD"), log)

    def _kill_loop(self, settings, handler, ids, kills):
        """Publishes `ids` (a third of them twice), runs three sidecars, SIGKILLs one at random
        every 0.3-0.7 s (restarting it) `kills` times, restarts the broker once halfway, then lets
        them finish. Returns the parked (outcome_unknown) ids."""
        self.handler = handler
        rng = random.Random(11)
        messages = [{"id": i, "body": '{"id":"%s"}' % i} for i in ids]
        messages += [{"id": i, "body": '{"id":"%s"}' % i} for i in ids[::3]]
        rng.shuffle(messages)
        for _ in range(3):
            self.sidecar(settings)
        for s in self.sidecars:
            s.wait_ready()
        self.record = history.History(os.path.join(self.dir, "history.jsonl"))

        def publish():
            sent = time.monotonic()
            self.tool.publish(self.broker.sink_url(), messages)
            # Confirmed by the broker: each message is an acknowledged operation.
            for m in messages:
                self.record.op(m["id"], sent, 200)
        publisher = threading.Thread(target=publish)
        publisher.start()
        done = 0
        restarted = False
        while done < kills:
            time.sleep(rng.uniform(0.3, 0.7))
            victim = rng.choice(self.sidecars)
            self.record.event("kill", sidecar=victim.name)
            victim.kill()
            done += 1
            if done == kills // 2 and not restarted:
                restarted = True
                brokers.restart_broker(broker_kind(), self.private, down_seconds=brokers.outage_seconds(broker_kind()))
            victim.start()
        publisher.join()
        for s in self.sidecars:
            s.wait_ready(120)
        return done

    def _check_history(self, policy, parked=()):
        """Every effect the handler kept is an execution, every parked id is accounted for: the
        history checker must find nothing. (A deduping handler keeps one effect per key however
        often it is POSTed: POSTs after a takeover are its business, and harmless.)"""
        for key, n in self.handler.effect_counts().items():
            for i in range(n):
                self.record.execution(key, "%s#%d" % (key, i))
        for key in parked:
            self.record.parked(key)
        self.record.close()
        ok, text = history.report(history.load(self.record.path), policy)
        print(text)
        self.assertTrue(ok, text)

    def _wait_all_accounted(self, ids, parked=None):
        """Waits until every id had its effect, or (when `parked` is a set) was parked: dead-lettered
        as outcome_unknown, collected into `parked` as they arrive."""
        def collect_parked():
            if parked is not None:
                for m in self.broker.take_dead_letters(self.tool, idle_ms=200):
                    h = {k.lower(): v for k, v in m["headers"].items()}
                    reason = h.get("x-idem-reason") or h.get("reason")
                    self.assertEqual(reason, "outcome_unknown", m)
                    parked.add(m["id"])

        def accounted():
            collect_parked()
            done = set(self.handler.call_counts()) | (parked or set())
            return all(i in done for i in ids)
        brokers.wait_until(accounted, 240, interval=0.5, what="every id processed (or parked)")
        # Copies a killed sidecar held are redelivered (after claim_idle, on Redis) and retried
        # until its lease on their key expires: then answered as duplicates, or parked (unknown).
        # The queue is drained only once they are settled too.
        brokers.wait_until(self.broker.settled, 60, interval=0.5, what="every delivery acknowledged")
        collect_parked()

    def test_kills_with_unknown_never_post_twice_and_park_a_bounded_few(self):
        ids = ["unk-%05d" % i for i in range(3000)]
        settings = {"workers": 4, "prefetch": 16, "on_lease_expiry": "unknown", "lease": "3s",
                    "handler_timeout": "1s", "retry_min": "50ms", "retry_max": "500ms", "claim_idle": "2s",
                    "drain_timeout": "5s"}
        kills = self._kill_loop(settings, brokers.Handler(), ids, KILLS)
        parked = set()
        self._wait_all_accounted(ids, parked)
        for s in self.sidecars:
            self.assertEqual(s.stop(), 0)
        calls = self.handler.call_counts()
        self.assertEqual({k: n for k, n in calls.items() if n > 1}, {}, "ids POSTed twice")
        # A parked id may have had its effect (the sidecar died after the handler's 2xx) or not
        # (it died before the POST): an operator decides (idemctl). At most one per worker per kill.
        self.assertLessEqual(len(parked), kills * 4, "more parked than kills x in-flight")
        self.assertEqual(self.left_in_queue(), [])
        self._check_history("unknown", parked)
        print("kills=%d parked=%d posted=%d" % (kills, len(parked), len(calls)))

    def test_kills_with_a_deduping_handler_lose_nothing_and_run_each_once(self):
        ids = ["dedupe-%05d" % i for i in range(3000)]
        settings = {"workers": 4, "prefetch": 16, "lease": "3s", "handler_timeout": "1s",
                    "retry_min": "50ms", "retry_max": "500ms", "claim_idle": "2s", "drain_timeout": "5s"}
        self._kill_loop(settings, brokers.Handler(dedupe=True), ids, KILLS)
        self._wait_all_accounted(ids)
        for s in self.sidecars:
            self.assertEqual(s.stop(), 0)
        effects = self.handler.effect_counts()
        self.assertEqual(sorted(effects), sorted(ids))
        self.assertEqual({k: n for k, n in effects.items() if n != 1}, {})
        self.assertEqual(self.left_in_queue(), [])
        self._check_history("unknown")

    # ---- the shared store killed mid-batch ---------------------------------------------------

    def test_store_kills_postgres_leave_no_message_acked_and_unrecorded(self):
        server = stores.PrivatePostgres("store-kills")
        self.addCleanup(server.stop)
        self._store_kills(server)

    def test_store_kills_redis_leave_no_message_acked_and_unrecorded(self):
        server = brokers.PrivateRedis(self.dir)  # AOF, appendfsync always: a reply means on disk
        self.addCleanup(server.stop)
        self._store_kills(server)

    def _store_kills(self, server):
        """Three sidecars share `server` (PrivatePostgres, PrivateRedis) as their store: each
        receive claimed with one store call, completions recorded in batches. 3,000 ids, each
        published 1-3 times, go out in chunks: before each of STORE_KILLS kills a chunk
        starts going out and the sidecars are seen settling deliveries again, then the store is
        SIGKILLed 0-150 ms later, mid-flow, and started again 0.3-1.5 s after (same port, same
        data).
        on_lease_expiry = "unknown" and a handler counting POSTs, as in
        test_kills_with_unknown_never_post_twice_and_park_a_bounded_few. Afterwards, from the
        sidecars' own lines (log_level info: one per outcome, acks included), the broker's
        dead-letter queue and the store's records (idemctl list):
          - every delivery acked as processed or duplicate has its id's completed record (200):
            no message both acked and unrecorded;
          - every id is completed, or parked (dead-lettered as outcome_unknown: a claim the kill
            left in doubt, its lease run out), or both: a sidecar whose completion the store did
            not take writes it again with the same claim, while another copy of the id may meet
            that claim in progress until its lease runs out and be parked (replayed, it is then a
            duplicate); nothing left in the queue;
          - no id POSTed twice; each completed id POSTed exactly once; the parked are at most
            kills x sidecars x prefetch (the deliveries a sidecar holds claimed at once);
          - the history checker finds nothing (policy unknown)."""
        self.assertTrue(ARGS.idemctl, "--idemctl is required for the store kill tests")
        name = "store-kills"
        kills = STORE_KILLS
        sidecars, prefetch = 3, 32
        self.store = server.url
        self.handler = brokers.Handler()
        ids = ["sk-%05d" % i for i in range(3000)]
        rng = random.Random(37)
        messages = [{"id": i, "body": '{"id":"%s"}' % i} for i in ids for _ in range(rng.randint(1, 3))]
        rng.shuffle(messages)
        pieces = kills + 3
        size = -(-len(messages) // pieces)
        chunks = [messages[k * size:(k + 1) * size] for k in range(pieces)]
        settings = {"name": name, "workers": 8, "prefetch": prefetch, "on_lease_expiry": "unknown", "lease": "3s",
                    "handler_timeout": "1s", "retry_min": "50ms", "retry_max": "500ms", "claim_idle": "2s",
                    "drain_timeout": "5s", "log_level": "info"}
        for _ in range(sidecars):
            self.sidecar(settings)
        for s in self.sidecars:
            s.wait_ready()
        self.record = history.History(os.path.join(self.dir, "history.jsonl"))
        started = time.monotonic()

        def publish(chunk):
            sent = time.monotonic()
            self.assertEqual(self.tool.publish(self.broker.sink_url(), chunk), len(chunk))
            for m in chunk:  # confirmed by the broker: each message is an acknowledged operation
                self.record.op(m["id"], sent, 200)

        def metric(name):
            return sum(s.metrics().get(name, 0) for s in self.sidecars)

        def settled_so_far():
            return metric("idem_consume_processed_total") + metric("idem_consume_duplicates_total")

        in_flight_at_kills = []
        for k in range(kills):
            # The chunk goes out while the store is killed: the sidecars keep up with a publisher,
            # so a kill after the publish would often find them idle.
            before = settled_so_far()
            failed = []

            def publish_in_background(chunk=chunks[k]):
                try:
                    publish(chunk)
                except BaseException as e:  # raised again in the test's thread, after join()
                    failed.append(e)
            publisher = threading.Thread(target=publish_in_background)
            publisher.start()
            brokers.wait_until(lambda: failed or settled_so_far() > before, 120, interval=0.02,
                               what="the sidecars settling deliveries again (kill %d)" % (k + 1))
            if failed:
                publisher.join()
                raise failed[0]
            time.sleep(rng.uniform(0.0, 0.15))
            in_flight_at_kills.append(int(metric("idem_consume_in_flight")))
            self.record.event("store_kill", n=k + 1)
            server.kill()
            publisher.join()
            if failed:
                raise failed[0]
            time.sleep(rng.uniform(0.3, 1.5))
            server.start()
            self.record.event("store_up", n=k + 1)
        for chunk in chunks[kills:]:
            publish(chunk)
        parked = set()
        self._wait_all_accounted(ids, parked)
        dropped = metric("idem_log_lines_dropped_total")
        for s in self.sidecars:
            self.assertEqual(s.stop(), 0, s.process.log()[-2000:])
        wall = time.monotonic() - started
        self.assertEqual(self.left_in_queue(), [])
        self.assertEqual(dropped, 0, "log lines dropped: the acks read from the logs would be incomplete")

        # What each sidecar settled, by its own lines.
        acked, parked_logged = set(), set()
        completion_failures = claim_failures = 0
        line = re.compile(r'message id="([^"]*)" outcome=(\S+)(.*)$')
        for s in self.sidecars:
            for text in s.process.log().splitlines():
                m = line.search(text)
                if not m:
                    continue
                key, outcome, rest = m.groups()
                if outcome in ("processed", "duplicate"):
                    acked.add(key)
                elif outcome == "dead_letter:outcome_unknown":
                    parked_logged.add(key)
                elif outcome == "retry:store_error":
                    if "recording the message failed after its effect" in rest:
                        completion_failures += 1
                    else:
                        claim_failures += 1
        self.assertEqual(parked_logged, parked, "the dead letters and the sidecars' lines disagree")

        # The store's records, as an operator reads them.
        out = subprocess.run([ARGS.idemctl, "list", "--store", server.url, "--tenant", "consumer " + name, "--all",
                              "--limit", "1000", "--json"], capture_output=True, text=True, timeout=120)
        self.assertEqual(out.returncode, 0, out.stderr)
        records = {r["key"]: r for r in json.loads(out.stdout)["records"]}
        completed = {k for k, r in records.items() if r["state"] == "completed"}
        calls = self.handler.call_counts()

        def none(found, what):  # the first 20 offenders and how many there are
            found = sorted(found)
            self.assertEqual(found[:20], [], "%d %s" % (len(found), what))

        none(set(records) - set(ids), "records of ids never published")
        none([k for k in completed if (records[k].get("response") or {}).get("status") != 200],
             "completed records without the handler's 200")
        none(acked - completed, "ids acked as processed or duplicate, but not recorded as completed")
        none(set(ids) - completed - parked, "ids neither recorded nor parked")
        parked_and_recorded = completed & parked  # see above: allowed, and each still POSTed once
        none(set(ids) - acked - parked, "ids the sidecars' lines show neither acked nor parked")
        self.assertEqual({k: n for k, n in calls.items() if n > 1}, {}, "ids POSTed twice")
        none([k for k in completed if calls.get(k) != 1], "ids recorded as completed, but not POSTed exactly once")
        self.assertLessEqual(len(parked), kills * sidecars * prefetch, "more parked than kills x held claims")
        # The kills met batches in flight: deliveries found the store gone.
        self.assertGreater(completion_failures + claim_failures, 0, "no delivery met a store outage")
        self._check_history("unknown", parked)
        print("store kills=%d in flight at the kills=%s failed claims=%d failed completions=%d parked=%d "
              "(of them recorded=%d) completed=%d posted=%d wall=%.1fs"
              % (kills, in_flight_at_kills, claim_failures, completion_failures, len(parked),
                 len(parked_and_recorded), len(completed), len(calls), wall))

    def test_bad_messages_are_dead_lettered_with_their_reasons(self):
        def answer(key, body):
            if key == "reject-me":
                return (400, {"Content-Type": "application/json"}, b'{"error":"amount must be positive"}')
            if key == "hang-me":
                return "hang"
            return None
        self.handler = brokers.Handler(answer=answer)
        s = self.sidecar({"max_message_bytes": "64KiB", "handler_timeout": "1s", "max_attempts": 2,
                          "retry_min": "50ms", "retry_max": "200ms", "lease": "10s"})
        s.wait_ready()
        self.tool.publish(self.broker.sink_url(), [
            {"id": None, "body": "no id"},
            {"id": "has space", "body": "bad id"},
            {"id": "big-one", "body_bytes": 64 * 1024 + 1},
            {"id": "reject-me", "body": "{}"},
            {"id": "hang-me", "body": "{}"},
            {"id": "fine", "body": "{}"},
        ])
        brokers.wait_until(lambda: s.metrics().get("idem_consume_dead_lettered_total{reason=\"poison\"}", 0) >= 1 and
                           s.metrics().get("idem_consume_processed_total", 0) >= 1, 60, what="all settled")
        self.assertEqual(s.stop(), 0)
        dead = self.dead_letters()
        self.assertEqual([m["body"] for m in dead.get("missing_id", [])], ["no id"])
        self.assertEqual([m["id"] for m in dead.get("invalid_id", [])], ["has space"])
        self.assertEqual([m["id"] for m in dead.get("too_large", [])], ["big-one"])
        self.assertEqual([m["id"] for m in dead.get("rejected", [])], ["reject-me"])
        self.assertEqual([m["id"] for m in dead.get("poison", [])], ["hang-me"])
        self.assertEqual(self.handler.call_counts().get("fine"), 1)
        self.assertNotIn("big-one", self.handler.call_counts())
        self.assertEqual(self.left_in_queue(), [])

    def test_wrong_credentials_are_one_clear_line(self):
        self.handler = brokers.Handler()
        if ARGS.broker == "sqs":
            # fauxqs accepts any signature (brokers/sqs's unit tests map AWS's refusals); what
            # it can refuse is a queue that does not exist.
            source = self.broker.source_url().replace(self.broker.name, "no-such-queue")
            p = Process("unknown-queue", [ARGS.consume, "--source", source, "--deliver", self.handler.url,
                                          "--store", self.store, "--admin-listen", "off"], self.dir)
            self.assertEqual(p.wait(30), 1, p.log())
            self.assertEqual(len(p.log().strip().splitlines()), 1, p.log())
            self.assertIn("no-such-queue", p.log())
            self.assertNotIn(brokers.PrivateSqs.CREDENTIALS.partition(":")[2], p.log())
            return
        secret = "Wr0ngPassw0rd-%d" % os.getpid()
        url = urllib.parse.urlsplit(self.broker.source_url())
        user = "idem" if broker_kind() == "amqp" else "nobody"
        source = url._replace(netloc="%s:%s@%s" % (user, secret, url.netloc.rpartition("@")[2])).geturl()
        if ARGS.broker == "kafka":
            # The mock cluster has no SASL: it fails the handshake, which a client reports as a
            # failed authentication, as a real cluster's refusal of the password.
            source += "&security_protocol=sasl_plaintext"
        p = Process("bad-credentials", [ARGS.consume, "--source", source, "--deliver", self.handler.url,
                                        "--store", self.store, "--admin-listen", "off"], self.dir)
        code = p.wait(30)
        self.assertEqual(code, 1, p.log())
        log = p.log()
        self.assertEqual(len(log.strip().splitlines()), 1, log)
        self.assertIn("refused", log)
        self.assertNotIn(secret, log)

    def test_sigterm_finishes_in_flight_deliveries_and_acks_them(self):
        started = threading.Event()

        def answer(key, body):
            started.set()
            time.sleep(1.0)
            return None
        self.handler = brokers.Handler(answer=answer)
        s = self.sidecar({"workers": 2, "prefetch": 4, "drain_timeout": "10s"})
        s.wait_ready()
        self.tool.publish(self.broker.sink_url(), [{"id": "slow-%d" % i, "body": "{}"} for i in range(8)])
        self.assertTrue(started.wait(20))
        time.sleep(0.2)
        s.process.signal(signal.SIGTERM)
        self.assertEqual(s.process.wait(20), 0, s.process.log())
        calls = self.handler.call_counts()
        self.assertGreaterEqual(len(calls), 2)
        self.assertEqual({k: n for k, n in calls.items() if n != 1}, {})
        # What was posted was acked; the rest is still there for the next consumer.
        rest = {m["id"] for m in self.left_in_queue()}
        self.assertEqual(set(calls) & rest, set())
        self.assertEqual(set(calls) | rest, {"slow-%d" % i for i in range(8)})

    def test_admin_endpoints(self):
        self.handler = brokers.Handler()
        s = self.sidecar()
        s.wait_ready()
        self.tool.publish(self.broker.sink_url(), [{"id": "a-1", "body": "{}"}, {"id": "a-1", "body": "{}"}])
        brokers.wait_until(lambda: s.metrics().get("idem_consume_duplicates_total", 0) >= 1, 30, what="duplicate")
        self.assertEqual(brokers.http_get(s.admin_port, "/healthz")[0], 200)
        self.assertEqual(brokers.http_get(s.admin_port, "/readyz")[0], 200)
        m = s.metrics()
        for name in ["idem_consume_received_total", "idem_consume_processed_total", "idem_consume_duplicates_total",
                     "idem_consume_retried_total", 'idem_consume_dead_lettered_total{reason="poison"}',
                     "idem_consume_in_flight", "idem_consume_reconnects_total", "idem_consume_handler_seconds_count",
                     "idem_consume_ready"]:
            self.assertIn(name, m)
        self.assertEqual(m["idem_consume_processed_total"], 1)
        self.assertEqual(m["idem_consume_ready"], 1)
        self.assertEqual(brokers.http_get(s.admin_port, "/nope")[0], 404)
        self.assertEqual(s.stop(), 0)


def broker_kind():
    """The broker under test: amqps is RabbitMQ (amqp) over its TLS listener."""
    return "amqp" if ARGS.broker == "amqps" else ARGS.broker


def main():
    global ARGS
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--broker", choices=["amqp", "amqps", "redis_streams", "kafka", "sqs"], required=True)
    parser.add_argument("--consume", required=True)
    parser.add_argument("--tool", required=True)
    parser.add_argument("--idemctl", help="idemctl, to read the store's records (the store kill tests)")
    ARGS, rest = parser.parse_known_args()
    program = unittest.main(argv=[sys.argv[0]] + rest, verbosity=2, exit=False)
    # A pattern that matches nothing must not pass as a green test that tested nothing.
    if program.result.testsRun == 0:
        sys.exit("test_consume.py: no test matched %s" % rest)
    sys.exit(0 if program.result.wasSuccessful() else 1)


if __name__ == "__main__":
    main()
