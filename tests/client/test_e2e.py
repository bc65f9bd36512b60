"""Client end to end: retries that survive lost responses and a crash of the client itself.

    client (idem::client / idemctl) -> idem-fault-proxy -> idem-gateway (SQLite) -> fixture upstream

The proxy loses 30 % of the responses after the gateway executed the request and recorded it: the
exact failure idempotency keys exist for. The fixture upstream counts executions per key and stamps
each one with an X-Execution-Id, so the tests prove "exactly one execution per operation" and
"every operation ends with its first response" (the client's final X-Execution-Id is the one the
gateway stored for the key, and the upstream ran the key once).

    python3 tests/client/test_e2e.py --gateway PATH --upstream-bin PATH --proxy-bin PATH \
        --driver PATH --idemctl PATH [unittest args]

IDEM_E2E_KEEP=1 keeps the temp dir (configs, SQLite files, journals, logs).
"""

import argparse
import base64
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "gateway"))
import harness  # noqa: E402  (the gateway e2e machinery: processes, upstream, gateway)

ARGS = None
OPS = 500
DROP_RATE = 0.3
THREADS = 5

GATEWAY_CONFIG = """
[idempotency]
lease = "60s"

[[route]]
method = "POST"
path = "/**"
required = true
"""


class FaultProxy:
    """idem-fault-proxy in front of a port; stats read through SIGUSR1 and a stats file."""

    def __init__(self, workdir, target_port, drop_rate, seed):
        self.workdir = workdir
        name = "proxy.%d.%s" % (target_port, uuid.uuid4().hex[:8])
        port_file = os.path.join(workdir, name + ".port")
        self.stats_file = os.path.join(workdir, name + ".stats")
        self.process = harness.Process("fault-proxy", [
            ARGS.proxy_bin, "--listen", "127.0.0.1:0", "--port-file", port_file,
            "--target", "127.0.0.1:%d" % target_port, "--drop-rate", str(drop_rate),
            "--seed", str(seed), "--stats-file", self.stats_file], workdir)
        deadline = time.monotonic() + harness.STARTUP_TIMEOUT
        while not os.path.exists(port_file):
            if not self.process.alive() or time.monotonic() > deadline:
                raise RuntimeError("fault proxy did not start: " + self.process.log())
            time.sleep(0.01)
        with open(port_file) as f:
            self.port = int(f.read())
        self.url = "http://127.0.0.1:%d" % self.port

    def stats(self):
        """The counts now: connections, responses, forwarded, dropped."""
        if os.path.exists(self.stats_file):
            os.remove(self.stats_file)
        self.process.signal(signal.SIGUSR1)
        deadline = time.monotonic() + 5
        while not os.path.exists(self.stats_file):
            if time.monotonic() > deadline:
                raise RuntimeError("fault proxy wrote no stats")
            time.sleep(0.01)
        with open(self.stats_file) as f:
            return json.load(f)

    def stop(self):
        return self.process.stop()


def idemctl(*args, stdin=None, timeout=60):
    """Runs idemctl; returns (exit code, stdout bytes, stderr text)."""
    env = {k: v for k, v in os.environ.items() if k not in ("IDEM_STORE", "IDEM_JOURNAL")}
    p = subprocess.run([ARGS.idemctl] + list(args), input=stdin, capture_output=True, timeout=timeout, env=env)
    return p.returncode, p.stdout, p.stderr.decode("utf-8", "replace")


def idemctl_json(*args):
    rc, out, err = idemctl(*args, "--json")
    if rc != 0:
        raise AssertionError("idemctl %s: exit %d: %s" % (" ".join(args), rc, err))
    return json.loads(out)


def read_rows(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [line.split() for line in f if line.strip()]


def report(name, figures):
    """The run's figures, on stderr (ctest -V or --output-on-failure shows them)."""
    print("\n[%s] %s" % (name, ", ".join("%s=%s" % kv for kv in figures.items())), file=sys.stderr)


class ClientTestCase(harness.GatewayTestCase):
    """A fixture upstream and a gateway on SQLite (harness.ARGS.store), whose store idemctl reads
    as `self.store`."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.store = cls.store_url()


class LostResponsesTest(ClientTestCase):
    """One fixture upstream, one gateway on SQLite, proxies in front of them."""

    CONFIG = GATEWAY_CONFIG

    def proxy(self, target_port, drop_rate, seed):
        p = FaultProxy(self.workdir, target_port, drop_rate, seed)
        self._owned.append(p)
        self.addCleanup(p.stop)
        return p

    def run_dir(self, name):
        d = os.path.join(self.workdir, name)
        os.makedirs(d)
        return d

    def driver(self, url, d, resume=False, tag="e2e"):
        argv = [ARGS.driver, "--url", url, "--ops", str(OPS), "--threads", str(THREADS),
                "--journal", os.path.join(d, "journal.db"), "--intents", os.path.join(d, "intents"),
                "--results", os.path.join(d, "results"), "--attempts", "12", "--base-delay-ms", "5",
                "--max-delay-ms", "50", "--attempt-timeout-ms", "10000", "--deadline-ms", "60000",
                "--tag", tag]
        if resume:
            argv.append("--resume")
        return argv

    def stored_execution_ids(self):
        """key -> X-Execution-Id of the response the gateway stored for it (None if none stored),
        read with `idemctl list` from the gateway's store."""
        listing = idemctl_json("list", "--store", self.store, "--all", "--limit", "1000")
        out = {}
        for r in listing["records"]:
            headers = r["response"]["headers"] if r["response"] else []
            ids = [v for k, v in headers if k.lower() == "x-execution-id"]
            out[r["key"]] = ids[0] if r["state"] == "completed" and ids else None
        return out

    def assertExactlyOncePerOperation(self, d):
        """Every op 0..OPS-1 has one final 2xx result; the upstream ran each op's key exactly once,
        and nothing else; each final answer carries the execution id the gateway stored."""
        rows = read_rows(os.path.join(d, "results"))
        by_op = {}
        for row in rows:
            op, key, status, attempts, replayed, exec_id, stop, phase = row
            self.assertNotIn(int(op), by_op, "op %s has two results: %s" % (op, row))
            by_op[int(op)] = row
        self.assertEqual(sorted(by_op), list(range(OPS)))
        counts = self.upstream.get_json("/counts")
        keys = {row[1] for row in by_op.values()}
        self.assertEqual(len(keys), OPS, "one key per operation")
        self.assertEqual(counts["total"], OPS, "upstream executions")
        self.assertEqual(set(counts["keys"]), keys)
        self.assertEqual(set(counts["keys"].values()), {1}, "each key executed exactly once")
        stored = self.stored_execution_ids()
        for op, (_, key, status, attempts, replayed, exec_id, stop, phase) in by_op.items():
            self.assertEqual(stop, "success", by_op[op])
            self.assertEqual(status, "200", by_op[op])
            self.assertEqual(exec_id, stored[key], "op %d did not end with its first response" % op)
        return by_op

    def assertJournalEmpty(self, d):
        journal = os.path.join(d, "journal.db")
        self.assertEqual(idemctl_json("dead-letters", "--journal", journal), {"dead_letters": []})
        self.assertEqual(idemctl_json("pending", "--journal", journal), {"pending": []})

    # -----------------------------------------------------------------------------------------

    def test_0_the_proxy_loses_answers_after_execution(self):
        key = harness.new_key()
        lossy = self.proxy(self.upstream.port, 1.0, 1)
        with self.assertRaises((ConnectionError, harness.http.client.HTTPException, OSError)):
            harness.request(lossy.port, "POST", "/echo", "{}", [("Idempotency-Key", key)], timeout=10)
        self.assertEqual(self.upstream.executions(key), 1, "executed, answer lost")
        clean = self.proxy(self.upstream.port, 0.0, 1)
        r = harness.request(clean.port, "POST", "/echo", "{}", [("Idempotency-Key", key)], timeout=10)
        self.assertEqual(r.status, 200)
        self.assertEqual(self.upstream.executions(key), 2)
        self.assertEqual(lossy.stats()["dropped"], 1)
        self.assertEqual(clean.stats()["forwarded"], 1)

    def test_1_500_operations_at_30_percent_loss(self):
        self.upstream.reset()
        proxy = self.proxy(self.gateway.port, DROP_RATE, 20240501)
        d = self.run_dir("run1")
        started = time.monotonic()
        p = subprocess.run(self.driver(proxy.url + "/echo", d), capture_output=True, timeout=240)
        elapsed = time.monotonic() - started
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        summary = json.loads(p.stdout)
        self.assertEqual(summary["succeeded"], OPS, summary)
        self.assertEqual(summary["dead_letters"], 0, summary)
        self.assertEqual(summary["pending"], 0, summary)
        by_op = self.assertExactlyOncePerOperation(d)
        self.assertJournalEmpty(d)
        stats = proxy.stats()
        self.assertGreater(stats["dropped"], 0.2 * stats["responses"], stats)
        self.assertLess(stats["dropped"], 0.4 * stats["responses"], stats)
        # Every lost answer was replayed on a later attempt (the client's, or libcurl's own silent
        # retry on a reused connection), never re-executed: the replays make up for the drops.
        replays = sum(1 for row in by_op.values() if row[4] == "1")
        self.assertGreater(replays, 0)
        report("500 ops, 30% loss", {
            "executions": self.upstream.total(), "responses_seen_by_proxy": stats["responses"],
            "dropped": stats["dropped"], "client_attempts": summary["attempts"],
            "ended_with_replay": replays, "dead_letters": summary["dead_letters"],
            "seconds": "%.1f" % elapsed})

    def test_2_client_killed_mid_run_then_resumed(self):
        self.upstream.reset()
        proxy = self.proxy(self.gateway.port, DROP_RATE, 20240502)
        d = self.run_dir("run2")
        results = os.path.join(d, "results")
        # /slow keeps each operation in flight for 20 ms, so the kill finds some of them pending.
        url = proxy.url + "/slow?ms=20"
        log = open(os.path.join(d, "driver1.log"), "wb")
        first = subprocess.Popen(self.driver(url, d, tag="killed"), stdout=log, stderr=subprocess.STDOUT,
                                 preexec_fn=harness._die_with_parent)
        try:
            deadline = time.monotonic() + 120
            while len(read_rows(results)) < OPS * 0.4:
                self.assertIsNone(first.poll(), "the driver ended before it was killed")
                self.assertLess(time.monotonic(), deadline, "the driver made no progress")
                time.sleep(0.01)
            first.send_signal(signal.SIGKILL)
        finally:
            first.wait()
            log.close()
        done_before = len(read_rows(results))
        pending = idemctl_json("pending", "--journal", os.path.join(d, "journal.db"))["pending"]
        self.assertGreater(len(pending), 0, "the kill found nothing in flight")
        self.assertLess(done_before, OPS)

        started = time.monotonic()
        p = subprocess.run(self.driver(url, d, resume=True, tag="killed"), capture_output=True, timeout=240)
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        summary = json.loads(p.stdout)
        self.assertEqual(summary["resumed"], len(pending), summary)
        self.assertEqual(summary["failed"], 0, summary)
        self.assertEqual(summary["dead_letters"], 0, summary)
        by_op = self.assertExactlyOncePerOperation(d)
        self.assertJournalEmpty(d)
        resumed_rows = [row for row in by_op.values() if row[7] == "resume"]
        self.assertEqual({row[1] for row in resumed_rows}, {op["key"] for op in pending})
        stats = proxy.stats()
        report("killed and resumed", {
            "executions": self.upstream.total(), "results_before_kill": done_before,
            "pending_at_kill": len(pending), "resumed": summary["resumed"],
            "resent_from_intents": summary["resent_from_intents"],
            "resumed_that_were_replays": sum(1 for row in resumed_rows if row[4] == "1"),
            "dropped": stats["dropped"], "responses_seen_by_proxy": stats["responses"],
            "seconds_after_restart": "%.1f" % (time.monotonic() - started)})

    def test_3_idemctl_send_through_lost_answers(self):
        self.upstream.reset()
        proxy = self.proxy(self.gateway.port, DROP_RATE, 20240503)
        journal = os.path.join(self.run_dir("run3"), "journal.db")
        results = [None] * 20
        lock = threading.Lock()

        def send(i):
            rc, out, err = idemctl("send", "--journal", journal, "--attempts", "12", "--retry-delay", "10ms",
                                   "-H", "Content-Type: application/json", "-d", '{"n":%d}' % i,
                                   proxy.url + "/echo")
            with lock:
                results[i] = (rc, out, err)

        threads = [threading.Thread(target=send, args=(i,)) for i in range(len(results))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        lines = []
        for rc, out, err in results:
            self.assertEqual(rc, 0, err)
            line = err.strip().splitlines()[0]
            self.assertRegex(line, r"^idemctl: key=[0-9a-f-]{36} attempts=\d+ replayed=(true|false) "
                                   r"status=200 stop=success$")
            key = line.split()[1][len("key="):]
            body = json.loads(out)
            self.assertEqual(body["key"], key)
            self.assertEqual(body["execution"], 1, "the first execution's answer")
            self.assertEqual(self.upstream.executions(key), 1)
            lines.append(line)
        self.assertEqual(self.upstream.total(), len(results))
        self.assertEqual(idemctl_json("dead-letters", "--journal", journal), {"dead_letters": []})

        # The operator's view of the same keys, from the gateway's store.
        key = lines[0].split()[1][len("key="):]
        record = idemctl_json("get", "--store", self.store, "", key)
        self.assertEqual(record["state"], "completed")
        rc, body, err = idemctl("get", "--store", self.store, "", key, "--body")
        self.assertEqual(rc, 0, err)
        self.assertEqual(json.loads(body)["key"], key)
        stats = idemctl_json("stats", "--store", self.store)
        self.assertGreaterEqual(stats["completed"], len(results))
        report("idemctl send x20", {"dropped": proxy.stats()["dropped"],
                                    "attempts": sum(int(l.split()[2][len("attempts="):]) for l in lines)})


class OperatorResolvesUnknownOutcomesTest(ClientTestCase):
    """A route that refuses to guess after a lost outcome (on_lease_expiry = "unknown"): idemctl send
    stops with outcome_unknown and keeps a dead letter; an operator resolves or releases the key on
    the gateway's store; `dead-letters retry` then gets the resolved answer, or executes again."""

    # The upstream gets 1.5 s to answer: the released key's second execution must finish in time
    # on a machine that also runs the sanitizer lanes (300 ms once timed out there in CI).
    CONFIG = """
upstream_timeout = "1500ms"

[idempotency]
lease = "2s"
on_lease_expiry = "unknown"
"""


    def send_unknown(self, journal, key):
        """/hang-first never answers a key's first execution: the gateway times out (504), the key
        stays in progress, its lease runs out, and the retries meet 409 idempotency_outcome_unknown
        (the attempts cover the lease several times over; the first outcome_unknown ends them)."""
        rc, out, err = idemctl("send", "--journal", journal, "--key", key, "--attempts", "40",
                               "--retry-delay", "200ms", "-d", "{}", self.gateway_url + "/hang-first")
        self.assertEqual(rc, 1, err)
        self.assertRegex(err.splitlines()[0], r"^idemctl: key=%s attempts=\d+ replayed=false status=409 "
                                              r"stop=outcome_unknown$" % key)
        self.assertIn("an operator decides", err)
        self.assertEqual(self.upstream.executions(key), 1)
        letters = idemctl_json("dead-letters", "--journal", journal)["dead_letters"]
        self.assertIn(key, [l["key"] for l in letters])
        record = idemctl_json("get", "--store", self.store, "", key)
        self.assertEqual(record["state"], "in_progress")

    @property
    def gateway_url(self):
        return "http://127.0.0.1:%d" % self.gateway.port

    def test_resolve_then_retry_replays_the_operators_answer(self):
        journal = os.path.join(self.workdir, "resolve.db")
        key = harness.new_key("resolve")
        self.send_unknown(journal, key)
        body_file = os.path.join(self.workdir, "answer.json")
        with open(body_file, "w") as f:
            f.write('{"id":"pay_1","resolved":true}')
        rc, out, err = idemctl("resolve", "--store", self.store, "", key, "--status", "201",
                               "--body", "@" + body_file, "-H", "Content-Type: application/json")
        self.assertEqual(rc, 0, err)
        rc, out, err = idemctl("dead-letters", "--journal", journal, "retry", key, "--retry-delay", "10ms")
        self.assertEqual(rc, 0, err)
        self.assertEqual(out, b'{"id":"pay_1","resolved":true}')
        self.assertRegex(err.splitlines()[0], r"key=%s attempts=1 replayed=true status=201 stop=success" % key)
        self.assertEqual(self.upstream.executions(key), 1, "resolved, not executed again")

    def test_release_then_retry_executes_again(self):
        journal = os.path.join(self.workdir, "release.db")
        key = harness.new_key("release")
        self.send_unknown(journal, key)
        rc, out, err = idemctl("release", "--store", self.store, "", key)
        self.assertEqual(rc, 0, err)
        rc, out, err = idemctl("dead-letters", "--journal", journal, "retry", key, "--retry-delay", "10ms")
        self.assertEqual(rc, 0, err)
        self.assertRegex(err.splitlines()[0], r"key=%s attempts=1 replayed=false status=200 stop=success" % key)
        self.assertEqual(self.upstream.executions(key), 2, "released: the operator said it did not run")
        rc, out, err = idemctl("release", "--store", self.store, "", key)
        self.assertEqual(rc, 1, "a completed key cannot be released")


def main():
    global ARGS
    parser = argparse.ArgumentParser(add_help=False)
    for name in ("--gateway", "--upstream-bin", "--proxy-bin", "--driver", "--idemctl"):
        parser.add_argument(name, required=True)
    ARGS, rest = parser.parse_known_args()
    harness.ARGS = argparse.Namespace(gateway=ARGS.gateway, upstream_bin=ARGS.upstream_bin, store="sqlite")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    for path in (ARGS.gateway, ARGS.upstream_bin, ARGS.proxy_bin, ARGS.driver, ARGS.idemctl):
        if not os.access(path, os.X_OK):
            print("not an executable: %s" % path, file=sys.stderr)
            sys.exit(2)
    harness.run_tests(rest, dump=("gateway", "fault-proxy"))


if __name__ == "__main__":
    main()
