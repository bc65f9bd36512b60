#!/usr/bin/env python3
"""Time and failure through the real gateway (SPEC §4.2–§4.3): retention expiry, lease expiry and
takeover, on_lease_expiry = "unknown", upstream timeout (504, record stays in progress), upstream
unreachable (502, key released), upstream dropping the connection mid-response, and a gateway
crash with a durable store. Durations are seconds, so the waits stay short and bounded.

    python3 test_expiry.py --gateway PATH --upstream-bin PATH [--store memory|sqlite]
"""

import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import GatewayTestCase, Upstream, free_port, new_key, sleep_until  # noqa: E402

UPSTREAM_TIMEOUT = 0.7
LEASE = 2.0
RETENTION = 1.0
MARGIN = 0.4  # added to every expiry before relying on it

CONFIG = """
upstream_timeout = "700ms"
max_body = "1MiB"

[idempotency]
retention = "1h"
lease = "2s"
retry_after = "1s"

[[route]]
method = "POST"
path = "/echo"

[[route]]
method = "POST"
path = "/echo/short-retention"
retention = "1s"

[[route]]
method = "POST"
path = "/hang-first"

[[route]]
method = "POST"
path = "/hang-first/unknown"
on_lease_expiry = "unknown"

[[route]]
method = "POST"
path = "/hang"

[[route]]
method = "POST"
path = "/close-mid-response"

[[route]]
method = "POST"
path = "/slow"
"""


class RetentionTest(GatewayTestCase):
    CONFIG = CONFIG

    def test_completed_record_expires_after_retention(self):
        key = new_key()
        first = self.gateway.request("POST", "/echo/short-retention", "{}", key=key)
        done = time.monotonic()
        self.assertExecuted(first)
        self.assertReplayOf(self.gateway.request("POST", "/echo/short-retention", "{}", key=key), first)
        sleep_until(done + RETENTION + MARGIN)
        second = self.gateway.request("POST", "/echo/short-retention", "{}", key=key)
        self.assertExecuted(second)
        self.assertNotEqual(second.execution_id, first.execution_id)
        self.assertReplayOf(self.gateway.request("POST", "/echo/short-retention", "{}", key=key), second)
        self.assertEqual(self.upstream.executions(key), 2)

    def test_default_retention_still_replays_after_short_route_expiry(self):
        key = new_key()
        first = self.gateway.request("POST", "/echo", "{}", key=key)
        sleep_until(time.monotonic() + RETENTION + MARGIN)
        self.assertReplayOf(self.gateway.request("POST", "/echo", "{}", key=key), first)


class UpstreamTimeoutTest(GatewayTestCase):
    CONFIG = CONFIG

    def test_timeout_is_504_record_in_progress_then_lease_takeover(self):
        key = new_key()
        claimed = time.monotonic()
        r = self.gateway.request("POST", "/hang-first", "{}", key=key)
        elapsed = time.monotonic() - claimed
        self.assertProblem(r, 504, "upstream_timeout")
        self.assertLess(elapsed, UPSTREAM_TIMEOUT + 3, "upstream_timeout not enforced")
        self.assertGreaterEqual(elapsed, UPSTREAM_TIMEOUT - 0.1)

        # The outcome is unknown: the record stays in progress until the lease expires.
        busy = self.gateway.request("POST", "/hang-first", "{}", key=key)
        self.assertLess(time.monotonic() - claimed, LEASE, "test too slow to observe the lease")
        self.assertProblem(busy, 409, "idempotency_key_in_use")
        self.assertIsNotNone(busy.header("Retry-After"))
        self.assertEqual(self.upstream.executions(key), 1)

        takeovers_before = self.takeovers()
        sleep_until(claimed + LEASE + MARGIN)
        second = self.gateway.request("POST", "/hang-first", "{}", key=key)
        self.assertExecuted(second)
        self.assertReplayOf(self.gateway.request("POST", "/hang-first", "{}", key=key), second)
        self.assertEqual(self.upstream.executions(key), 2)
        self.assertGreater(self.takeovers(), takeovers_before, "lease takeover metric did not move")

    def takeovers(self):
        return self.gateway.metrics().get("idem_lease_takeovers_total", 0.0)

    def test_on_lease_expiry_unknown_is_409_outcome_unknown(self):
        key = new_key()
        claimed = time.monotonic()
        r = self.gateway.request("POST", "/hang-first/unknown", "{}", key=key)
        self.assertEqual(r.status, 504, r)
        self.assertProblem(self.gateway.request("POST", "/hang-first/unknown", "{}", key=key),
                           409, "idempotency_key_in_use")
        sleep_until(claimed + LEASE + MARGIN)
        for _ in range(2):
            self.assertProblem(self.gateway.request("POST", "/hang-first/unknown", "{}", key=key),
                               409, "idempotency_outcome_unknown")
        self.assertEqual(self.upstream.executions(key), 1)

    def test_timeout_does_not_block_other_keys(self):
        key = new_key()
        box = {}
        t = threading.Thread(target=lambda: box.setdefault(
            "r", self.gateway.request("POST", "/hang", "{}", key=key)))
        t.start()
        try:
            self.eventually(lambda: self.upstream.executions(key) == 1, 5)
            other = self.gateway.request("POST", "/echo", "{}", key=new_key(), timeout=5)
            self.assertExecuted(other)
        finally:
            t.join(10)
        self.assertEqual(box["r"].status, 504)


class UpstreamDropTest(GatewayTestCase):
    CONFIG = CONFIG

    def test_upstream_closing_mid_response_is_5xx_and_outcome_unknown(self):
        key = new_key()
        claimed = time.monotonic()
        r = self.gateway.request("POST", "/close-mid-response", "{}", key=key)
        self.assertProblem(r, 504, "upstream_timeout")  # docs/gateway.md: sent, answer incomplete
        self.assertNotIn(b"xxxxxxxxxx", r.body, "a truncated upstream body was passed on")
        # Sent but not answered: in doubt, so not released and not re-executed within the lease.
        self.assertProblem(self.gateway.request("POST", "/close-mid-response", "{}", key=key),
                           409, "idempotency_key_in_use")
        self.assertEqual(self.upstream.executions(key), 1)
        sleep_until(claimed + LEASE + MARGIN)
        r = self.gateway.request("POST", "/close-mid-response", "{}", key=key)
        self.assertProblem(r, 504, "upstream_timeout")
        self.assertEqual(self.upstream.executions(key), 2)
        # Everyone else is still served.
        self.assertExecuted(self.gateway.request("POST", "/echo", "{}", key=new_key()))


class UpstreamUnreachableTest(GatewayTestCase):
    CONFIG = None  # the gateway points at a port nobody listens on

    def test_unreachable_upstream_is_502_and_releases_the_key(self):
        for attempt in range(3):
            port = free_port()
            gw = self.start_gateway(CONFIG, upstream_url="http://127.0.0.1:%d" % port)
            key = new_key()
            for _ in range(2):  # released: the retry tries again instead of 409
                r = gw.request("POST", "/echo", "{}", key=key, timeout=10)
                self.assertProblem(r, 502, "upstream_unreachable")
            try:
                up = Upstream(self.workdir, port=port)
            except RuntimeError:
                continue  # someone took the port meanwhile; try another
            self._owned.append(up)
            r = gw.request("POST", "/echo", "{}", key=key)
            self.assertExecuted(r)
            self.assertReplayOf(gw.request("POST", "/echo", "{}", key=key), r)
            self.assertEqual(up.executions(key), 1)
            return
        self.fail("could not get a port for the late upstream")

    def test_unresolvable_host_starts_answers_502_and_is_not_ready(self):
        # .invalid never resolves (RFC 6761): the gateway starts anyway, says why it is not
        # ready, and answers 502 without executing anything until the host resolves.
        gw = self.start_gateway(CONFIG, upstream_url="http://idem-e2e-upstream.invalid:%d" % self.upstream.port)
        ready = gw.admin("/readyz")
        self.assertEqual(ready.status, 503, ready)
        self.assertIn(b"does not resolve", ready.body)
        key = new_key()
        for _ in range(2):  # released each time: never 409 in use
            doc = self.assertProblem(gw.request("POST", "/echo", "{}", key=key), 502, "upstream_unreachable")
            self.assertIn("idem-e2e-upstream.invalid does not resolve", doc["detail"])
        self.assertProblem(gw.request("GET", "/echo"), 502, "upstream_unreachable")
        self.assertEqual(self.upstream.executions(key), 0)
        self.assertTrue(gw.alive())

    def test_host_name_is_resolved_again_while_running(self):
        gw = self.start_gateway('upstream_resolve_interval = "1s"\n' + CONFIG,
                                upstream_url="http://localhost:%d" % self.upstream.port)
        self.assertExecuted(gw.request("POST", "/echo", "{}", key=new_key()))
        time.sleep(2.5)  # two more lookups of the same addresses: nothing changes
        key = new_key()
        self.assertExecuted(gw.request("POST", "/echo", "{}", key=key))
        self.assertEqual(self.upstream.executions(key), 1)
        self.assertEqual(gw.admin("/readyz").status, 200)


class StoreUnavailableTest(GatewayTestCase):
    """The store cannot be written at claim: 503 idempotency_store_unavailable with Retry-After,
    and nothing executes (SPEC §6, fail closed)."""
    CONFIG = None

    def test_locked_sqlite_is_503_and_not_executed(self):
        if harness.ARGS.store != "sqlite":
            self.skipTest("needs a store another process can lock; runs under --store sqlite")
        import sqlite3
        gw = self.start_gateway(CONFIG, store=self.store_url("locked.db"))
        self.assertExecuted(gw.request("POST", "/echo", "{}", key=new_key()))  # schema exists
        locker = sqlite3.connect(os.path.join(self.workdir, "locked.db"), isolation_level=None, timeout=10)
        key = new_key()
        try:
            locker.execute("BEGIN IMMEDIATE")  # holds the write lock
            start = time.monotonic()
            r = gw.request("POST", "/echo", "{}", key=key, timeout=30)
            self.assertProblem(r, 503, "idempotency_store_unavailable")
            self.assertIsNotNone(r.header("Retry-After"), r)
            self.assertLess(time.monotonic() - start, 20)
            self.assertEqual(self.upstream.executions(key), 0, "executed without a claim")
        finally:
            locker.execute("ROLLBACK")
            locker.close()
        r = gw.request("POST", "/echo", "{}", key=key)
        self.assertExecuted(r)
        self.assertReplayOf(gw.request("POST", "/echo", "{}", key=key), r)

    def test_store_silent_past_store_timeout_is_503_and_its_late_claim_released(self):
        """A store that does not answer (here SQLite waiting for a lock, for up to 8 s) gets
        store_timeout: 503 after 300 ms, nothing executed. When the lock goes, the store makes the
        claim after all; the gateway releases it, so the retry executes at once instead of
        meeting 409 until the 60 s lease runs out."""
        if harness.ARGS.store != "sqlite":
            self.skipTest("needs a store another process can lock; runs under --store sqlite")
        import sqlite3
        config = 'store_timeout = "300ms"\n' + CONFIG.replace('lease = "2s"', 'lease = "60s"')
        gw = self.start_gateway(config, store=self.store_url("silent.db") + "?busy_timeout_ms=8000")
        self.assertExecuted(gw.request("POST", "/echo", "{}", key=new_key()))  # schema exists
        locker = sqlite3.connect(os.path.join(self.workdir, "silent.db"), isolation_level=None, timeout=10)
        key = new_key()
        try:
            locker.execute("BEGIN IMMEDIATE")
            start = time.monotonic()
            r = gw.request("POST", "/echo", "{}", key=key, timeout=30)
            waited = time.monotonic() - start
            self.assertProblem(r, 503, "idempotency_store_unavailable")
            self.assertEqual(r.header("Retry-After"), "1", r)
            self.assertGreaterEqual(waited, 0.3)
            self.assertLess(waited, 4, "answered by the store's busy_timeout, not store_timeout")
            self.assertEqual(self.upstream.executions(key), 0, "executed without a claim")
            self.assertEqual(gw.metrics().get("idem_store_timeouts_total"), 1)
        finally:
            locker.execute("ROLLBACK")
            locker.close()
        self.eventually(lambda: gw.metrics().get("idem_store_late_claims_released_total") == 1, 10)
        r = gw.request("POST", "/echo", "{}", key=key)
        self.assertExecuted(r)
        self.assertEqual(self.upstream.executions(key), 1)
        self.assertReplayOf(gw.request("POST", "/echo", "{}", key=key), r)
        self.assertTrue(gw.alive())


class CrashTakeoverTest(GatewayTestCase):
    """A gateway killed mid-request leaves an in-progress record; after the lease, a new gateway
    on the same store takes over (SPEC §4.2 'the holder crashed')."""
    CONFIG = None

    def test_kill_9_mid_request_then_takeover_after_lease(self):
        if harness.ARGS.store != "sqlite":
            self.skipTest("a crash loses a memory store; runs under --store sqlite")
        config = CONFIG.replace('upstream_timeout = "700ms"', 'upstream_timeout = "10s"').replace(
            'lease = "2s"', 'lease = "3s"\nallow_short_lease = true')
        gw = self.start_gateway(config)
        key = new_key()
        t = threading.Thread(target=lambda: self._swallow(gw, key))
        t.start()
        self.eventually(lambda: self.upstream.executions(key) == 1, 5)
        claimed = time.monotonic()
        gw.process.kill()
        t.join(10)
        gw2 = self.start_gateway(config, store=gw.store)
        r = gw2.request("POST", "/hang-first", "{}", key=key)
        if time.monotonic() - claimed < 3.0 - 0.2:
            self.assertProblem(r, 409, "idempotency_key_in_use")
        sleep_until(claimed + 3.0 + MARGIN)
        r = gw2.request("POST", "/hang-first", "{}", key=key)
        self.assertExecuted(r)
        self.assertReplayOf(gw2.request("POST", "/hang-first", "{}", key=key), r)
        self.assertEqual(self.upstream.executions(key), 2)

    @staticmethod
    def _swallow(gw, key):
        try:
            gw.request("POST", "/hang-first", "{}", key=key, timeout=10)
        except OSError:
            pass


if __name__ == "__main__":
    harness.main()
