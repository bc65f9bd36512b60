#!/usr/bin/env python3
"""on_lease_expiry = "ask" through the real gateway (docs/gateway.md, "Asking the upstream"): a
key whose holder vanished (here: the 504 path, an upstream that took the request and never
answered) is resolved by the upstream's lookup on the client's next retry after the lease, and
every keyed request tells the upstream its attempt number and tenant.

  - the lookup says it happened: the retry gets the committed response as a replay, one execution
  - it says it never happened: the retry executes, as attempt 2
  - lookup faults (a 404 without the marker, a 500, a hang, an answer without the key, an answer
    for another key): 409 idempotency_outcome_unknown with Retry-After, nothing executed, and the
    next retry asks again
  - 50 retries of one stuck key at once: one lookup in flight, one outcome
  - the attempt and tenant headers: set by the gateway, a client's own never reach the upstream

    python3 test_ask.py --gateway PATH --upstream-bin PATH [--store memory|sqlite]
"""

import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import GatewayTestCase, new_key, sleep_until  # noqa: E402

LEASE = 2.0
MARGIN = 0.4

FAULTS = ("nomarker", "error", "hang", "malformed", "otherkey")

CONFIG = """
upstream_timeout = "700ms"
lookup_timeout = "1s"

[tenant]
header = "X-Tenant"

[idempotency]
lease = "2s"
retry_after = "1s"

[[route]]
method = "POST"
path = "/hang-first/ok"
on_lease_expiry = "ask"
ask = "GET /lookup/ok/{key}"

[[route]]
method = "POST"
path = "/hang-first/never"
on_lease_expiry = "ask"
ask = "GET /lookup/never/{key}"

[[route]]
method = "POST"
path = "/hang-first/slow"
on_lease_expiry = "ask"
ask = "GET /lookup/ok/{key}?ms=800"

[[route]]
method = "POST"
path = "/echo/**"
""" + "".join("""
[[route]]
method = "POST"
path = "/hang-first/%s"
on_lease_expiry = "ask"
ask = "GET /lookup/%s/{key}"
""" % (mode, mode) for mode in FAULTS)


def header_of(echo, name):
    """The value of a request header as the fixture upstream saw it (None when absent)."""
    values = [v for k, v in echo["headers"] if k.lower() == name.lower()]
    return values[0] if len(values) == 1 else (values or None)


class AskTest(GatewayTestCase):
    CONFIG = CONFIG

    def stuck(self, path, key, tenant="acme"):
        """The 504 path: the upstream takes the request (one execution) and never answers. Returns
        when the retry may take the key over."""
        claimed = time.monotonic()
        r = self.gateway.request("POST", path, "{}", key=key, headers=[("X-Tenant", tenant)])
        self.assertProblem(r, 504, "upstream_timeout")
        self.assertEqual(self.upstream.executions(key), 1)
        return claimed + LEASE + MARGIN

    def lookups(self, key):
        return self.upstream.get_json("/lookups?key=%s" % key)

    def lookup_metric(self, answer):
        return self.gateway.metrics().get('idem_lookups_total{answer="%s"}' % answer, 0.0)

    def test_the_504_path_then_the_lookup_answers_the_committed_outcome_as_a_replay(self):
        key = new_key()
        happened_before = self.lookup_metric("happened")
        after_lease = self.stuck("/hang-first/ok", key)
        # Still held: no lookup while the lease runs.
        busy = self.gateway.request("POST", "/hang-first/ok", "{}", key=key, headers=[("X-Tenant", "acme")])
        self.assertProblem(busy, 409, "idempotency_key_in_use")
        self.assertEqual(self.lookups(key)["count"], 0)

        sleep_until(after_lease)
        r = self.gateway.request("POST", "/hang-first/ok", "{}", key=key, headers=[("X-Tenant", "acme")])
        self.assertEqual(r.status, 201, r)  # the original status, from Idempotency-Original-Status
        self.assertEqual(r.header("Idempotent-Replayed"), "true", r)
        self.assertTrue(r.json()["looked_up"])
        first_execution = r.json()["execution_id"]
        self.assertIsNone(r.header("Idempotency-Original-Status"), "the contract's own headers are not stored")
        self.assertIsNotNone(r.header("Idempotency-Key-Expires"), r)
        lookup = self.lookups(key)
        self.assertEqual(lookup["count"], 1)
        self.assertEqual(lookup["attempt"], "2", "the lookup fences the lost holder out with a higher attempt")
        self.assertEqual(lookup["tenant"], "acme")

        # Recorded: later retries replay it without asking again, and nothing executed twice.
        again = self.gateway.request("POST", "/hang-first/ok", "{}", key=key, headers=[("X-Tenant", "acme")])
        self.assertEqual((again.status, again.body, harness.stored_headers(again)),
                         (r.status, r.body, harness.stored_headers(r)))
        self.assertEqual(again.header("Idempotent-Replayed"), "true", again)
        self.assertEqual(again.json()["execution_id"], first_execution)
        self.assertEqual(self.lookups(key)["count"], 1)
        self.assertEqual(self.upstream.executions(key), 1)
        self.assertEqual(self.lookup_metric("happened"), happened_before + 1)

    def test_a_lookup_that_finds_nothing_lets_the_retry_execute_as_attempt_two(self):
        key = new_key()
        sleep_until(self.stuck("/hang-first/never", key))
        r = self.gateway.request("POST", "/hang-first/never", "{}", key=key, headers=[("X-Tenant", "acme")])
        self.assertExecuted(r)
        self.assertEqual(r.json()["execution"], 2)
        self.assertReplayOf(self.gateway.request("POST", "/hang-first/never", "{}", key=key,
                                                 headers=[("X-Tenant", "acme")]), r)
        self.assertEqual(self.upstream.executions(key), 2)
        attempts = [line["attempt"] for line in self.history() if line["key"] == key]
        self.assertEqual(attempts, ["1", "2"], "each execution carries its attempt number")

    def history(self):
        r = harness.request(self.upstream.port, "GET", "/history")
        self.assertEqual(r.status, 200, r)
        text = r.body.decode() if isinstance(r.body, bytes) else r.body
        return [json.loads(line) for line in text.splitlines() if line]

    def test_lookup_faults_are_409_outcome_unknown_nothing_executed_and_asked_again(self):
        keys = {mode: new_key(mode) for mode in FAULTS}
        results = {}

        def one(mode):
            key = keys[mode]
            path = "/hang-first/" + mode
            try:
                sleep_until(self.stuck(path, key))
                answers = []
                for _ in range(2):
                    answers.append(self.gateway.request("POST", path, "{}", key=key,
                                                        headers=[("X-Tenant", "acme")], timeout=10))
                results[mode] = answers
            except BaseException as e:  # reported by the main thread
                results[mode] = e
        threads = [threading.Thread(target=one, args=(m,)) for m in FAULTS]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        for mode in FAULTS:
            with self.subTest(lookup=mode):
                answers = results.get(mode)
                if isinstance(answers, BaseException):
                    raise answers
                self.assertIsNotNone(answers, "no result")
                for r in answers:
                    self.assertProblem(r, 409, "idempotency_outcome_unknown")
                    self.assertIsNotNone(r.header("Retry-After"), r)
                self.assertEqual(self.upstream.executions(keys[mode]), 1, "a fault must never execute")
                self.assertEqual(self.lookups(keys[mode])["count"], 2, "each retry asks again")
        metrics = self.gateway.metrics()
        for answer in ("unknown", "malformed", "mismatch", "failed"):
            self.assertGreater(metrics.get('idem_lookups_total{answer="%s"}' % answer, 0.0), 0, answer)

    def test_fifty_retries_of_one_stuck_key_make_one_lookup_and_one_outcome(self):
        key = new_key()
        sleep_until(self.stuck("/hang-first/slow", key))
        answers = []
        lock = threading.Lock()
        start = threading.Event()

        def retry():
            start.wait()
            r = self.gateway.request("POST", "/hang-first/slow", "{}", key=key, headers=[("X-Tenant", "acme")],
                                     timeout=15)
            with lock:
                answers.append(r)
        threads = [threading.Thread(target=retry) for _ in range(50)]
        for t in threads:
            t.start()
        start.set()
        for t in threads:
            t.join(30)
        self.assertEqual(len(answers), 50)
        replays = [r for r in answers if r.status == 201]
        for r in answers:
            if r.status != 201:
                self.assertProblem(r, 409, "idempotency_key_in_use")
        self.assertGreaterEqual(len(replays), 1)
        self.assertEqual({r.body for r in replays}, {replays[0].body}, "one outcome")
        lookup = self.lookups(key)
        self.assertEqual(lookup["count"], 1)
        self.assertEqual(lookup["max_in_flight"], 1)
        final = self.gateway.request("POST", "/hang-first/slow", "{}", key=key, headers=[("X-Tenant", "acme")])
        self.assertEqual(final.status, 201, final)
        self.assertEqual(final.body, replays[0].body)
        self.assertEqual(self.upstream.executions(key), 1)

    def test_idemctl_reconcile_resolves_a_key_nobody_retried(self):
        if harness.ARGS.store != "sqlite":
            self.skipTest("idemctl opens the gateway's store from another process: runs under --store sqlite")
        import subprocess
        idemctl = os.path.normpath(os.path.join(os.path.dirname(harness.ARGS.gateway), "..", "cli", "idemctl"))
        store = self.gateway.store
        found, never = new_key("found"), new_key("never")
        after = max(self.stuck("/hang-first/ok", found), self.stuck("/hang-first/never", never))
        sleep_until(after)
        run = subprocess.run([idemctl, "reconcile", "--store", store, "--upstream", self.upstream.url, "--json"],
                             capture_output=True, text=True, timeout=60)
        self.assertEqual(run.returncode, 0, run.stderr + run.stdout)
        report = json.loads(run.stdout)
        text = json.dumps(report)
        self.assertIn(found, text)
        self.assertIn(never, text)
        self.assertEqual(self.lookups(found)["count"], 1)
        self.assertEqual(self.lookups(found)["attempt"], "2")
        # The found key replays the committed outcome without asking again; the other executes.
        r = self.gateway.request("POST", "/hang-first/ok", "{}", key=found, headers=[("X-Tenant", "acme")])
        self.assertEqual((r.status, r.header("Idempotent-Replayed")), (201, "true"), r)
        self.assertEqual(self.lookups(found)["count"], 1, "reconciled: the gateway does not ask again")
        n = self.gateway.request("POST", "/hang-first/never", "{}", key=never, headers=[("X-Tenant", "acme")])
        self.assertExecuted(n)
        self.assertEqual(self.upstream.executions(found), 1)
        self.assertEqual(self.upstream.executions(never), 2)

    def test_keyed_requests_carry_their_attempt_and_tenant_and_clients_cannot_set_them(self):
        key = new_key()
        forged = [("X-Tenant", "acme"), ("Idempotency-Attempt", "99"), ("Idempotency-Tenant", "someone-else")]
        r = self.gateway.request("POST", "/echo/attempt", "{}", key=key, headers=forged)
        self.assertExecuted(r)
        echo = r.json()
        self.assertEqual(header_of(echo, "Idempotency-Attempt"), "1")
        self.assertEqual(header_of(echo, "Idempotency-Tenant"), "acme")
        # Passed through (no key on a GET): the client's own values are removed, none are added.
        g = self.gateway.request("GET", "/echo/attempt", headers=forged)
        self.assertEqual(g.status, 200, g)
        self.assertIsNone(header_of(g.json(), "Idempotency-Attempt"))
        self.assertIsNone(header_of(g.json(), "Idempotency-Tenant"))


if __name__ == "__main__":
    harness.main()
