#!/usr/bin/env python3
"""Races through the real gateway: 200 concurrent requests with one key on a slow route execute
exactly once (the rest get 409 or the replay), with one gateway and with two gateway processes
sharing one SQLite file.

    python3 test_concurrency.py --gateway PATH --upstream-bin PATH [--store memory|sqlite]
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import GatewayTestCase, new_key, run_concurrently  # noqa: E402

N = 200
SLOW_MS = 2000

CONFIG = """
upstream_timeout = "30s"

[idempotency]
lease = "60s"
retry_after = "1s"

[[route]]
method = "POST"
path = "/slow"

[[route]]
method = "POST"
path = "/echo"
"""


class OneKeyManyClients(GatewayTestCase):
    CONFIG = CONFIG

    def check_exactly_once(self, key, results):
        errors = [r for r in results if isinstance(r, Exception) or r is None]
        self.assertEqual(errors, [], "requests failed at the transport level")
        executed = [r for r in results if r.status == 200 and not r.replayed]
        replayed = [r for r in results if r.status == 200 and r.replayed]
        in_use = [r for r in results if r.status == 409]
        others = [r for r in results if r.status not in (200, 409)]
        self.assertEqual(others, [], "unexpected answers")
        self.assertEqual(len(executed), 1, "executions seen by clients: %d" % len(executed))
        for r in in_use:
            self.assertProblem(r, 409, "idempotency_key_in_use")
            self.assertIsNotNone(r.header("Retry-After"))
        for r in replayed:
            self.assertReplayOf(r, executed[0])
        self.assertEqual(self.upstream.executions(key), 1, "upstream executed more than once")
        self.assertEqual(len(executed) + len(replayed) + len(in_use), len(results))
        return len(in_use), len(replayed)

    def test_200_concurrent_requests_one_key_one_execution(self):
        key = new_key()
        gw = self.gateway
        results = run_concurrently(N, lambda i: gw.request("POST", "/slow?ms=%d" % SLOW_MS, "{}", key=key,
                                                           timeout=60))
        in_use, replayed = self.check_exactly_once(key, results)
        self.assertGreater(in_use, 0, "no request overlapped the slow one")
        # Afterwards, everyone replays.
        after = gw.request("POST", "/slow?ms=%d" % SLOW_MS, "{}", key=key)
        self.assertTrue(after.replayed)

    def test_concurrent_distinct_keys_each_execute_once(self):
        keys = [new_key("d%d" % i) for i in range(100)]
        gw = self.gateway
        results = run_concurrently(len(keys), lambda i: gw.request("POST", "/echo", "{}", key=keys[i]))
        for k, r in zip(keys, results):
            self.assertFalse(isinstance(r, Exception), r)
            self.assertExecuted(r)
            self.assertEqual(r.json()["key"], k)
        counts = self.upstream.get_json("/counts")["keys"]
        for k in keys:
            self.assertEqual(counts.get(k), 1, k)


class TwoGatewaysOneSqliteFile(OneKeyManyClients):
    CONFIG = None

    @classmethod
    def start_class_processes(cls):
        if harness.ARGS.store == "sqlite":
            store = cls.store_url("shared.db")
            cls.gateways = [cls.start_gateway(CONFIG, store=store), cls.start_gateway(CONFIG, store=store)]

    def setUp(self):
        if harness.ARGS.store != "sqlite":
            self.skipTest("two processes share a store only with --store sqlite")

    def test_200_concurrent_requests_one_key_one_execution(self):
        key = new_key()
        gws = self.gateways
        results = run_concurrently(N, lambda i: gws[i % 2].request("POST", "/slow?ms=%d" % SLOW_MS, "{}",
                                                                   key=key, timeout=60))
        self.check_exactly_once(key, results)
        for gw in gws:
            self.assertTrue(gw.request("POST", "/slow?ms=%d" % SLOW_MS, "{}", key=key).replayed)
            self.assertTrue(gw.alive())

    def test_concurrent_distinct_keys_each_execute_once(self):
        keys = [new_key("d%d" % i) for i in range(100)]
        gws = self.gateways
        results = run_concurrently(len(keys), lambda i: gws[i % 2].request("POST", "/echo", "{}", key=keys[i]))
        for r in results:
            self.assertFalse(isinstance(r, Exception), r)
            self.assertExecuted(r)
        # Each key replays from the other process.
        for i, k in enumerate(keys[:10]):
            self.assertReplayOf(gws[(i + 1) % 2].request("POST", "/echo", "{}", key=k), results[i])

    def test_mismatch_across_processes(self):
        key = new_key()
        a = self.gateways[0].request("POST", "/echo", '{"a":1}', [("Content-Type", "application/json")], key=key)
        self.assertExecuted(a)
        r = self.gateways[1].request("POST", "/echo", '{"a":2}', [("Content-Type", "application/json")], key=key)
        self.assertProblem(r, 422, "idempotency_key_mismatch")


if __name__ == "__main__":
    harness.main()
