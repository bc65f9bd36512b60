#!/usr/bin/env python3
"""The SQLite store cannot write (a full disk, a file-size limit): new keys fail closed with 503
and are not executed, stored answers still replay, the gateway keeps running, and once writes
succeed again the same keys execute, once. An outcome that cannot be recorded still reaches its
client, and the key stays in progress.

The write failures come from the gateway's own file-size limit (RLIMIT_FSIZE, set from outside
with prlimit): SQLite's writes to its WAL beyond the limit fail with EFBIG, as they would fail
with ENOSPC on a full disk, while the gateway's log, far below the limit, is still written.

    python3 test_sqlite_write_failures.py --gateway PATH --upstream-bin PATH --store sqlite
"""

import os
import resource
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import GatewayTestCase, new_key  # noqa: E402

CONFIG = """
upstream_timeout = "10s"

[idempotency]
lease = "30s"
retry_after = "1s"
on_lease_expiry = "unknown"

[[route]]
method = "POST"
path = "/echo"

[[route]]
method = "POST"
path = "/slow"
"""

# The WAL is grown past this before writes are limited to half of it (see limit_writes).
WAL_BEFORE_LIMIT = 512 * 1024


class SqliteWriteFailuresTest(GatewayTestCase):
    CONFIG = CONFIG

    @classmethod
    def start_class_processes(cls):
        cls.db_path = cls.store_url()[len("sqlite:"):]

    def setUp(self):
        self.addCleanup(self.lift_limit)

    # -- the file-size limit --------------------------------------------------------------------

    def grow_wal(self):
        """Executes requests until the WAL reaches WAL_BEFORE_LIMIT (it is not checkpointed that
        early), so that its next frames are written far beyond the limit limit_writes sets."""
        while os.path.getsize(self.db_path + "-wal") < WAL_BEFORE_LIMIT:
            r = self.gateway.request("POST", "/echo", '{"fill": true}', key=new_key("fill"))
            self.assertExecuted(r)

    def limit_writes(self):
        """Lowers the gateway's file-size limit below the WAL's end and above its log's, so that
        every commit fails to write its WAL frames while log lines are still written."""
        self.assertGreaterEqual(os.path.getsize(self.db_path + "-wal"), WAL_BEFORE_LIMIT)
        log_size = os.path.getsize(self.gateway.process.log_path)
        limit = WAL_BEFORE_LIMIT // 2
        self.assertLess(log_size + 64 * 1024, limit, "the gateway's log is too large for this test")
        _, hard = resource.prlimit(self.gateway.process.pid, resource.RLIMIT_FSIZE)
        resource.prlimit(self.gateway.process.pid, resource.RLIMIT_FSIZE, (limit, hard))

    def lift_limit(self):
        if self.gateway.alive():
            _, hard = resource.prlimit(self.gateway.process.pid, resource.RLIMIT_FSIZE)
            resource.prlimit(self.gateway.process.pid, resource.RLIMIT_FSIZE, (hard, hard))

    def metric(self, name):
        return self.gateway.metrics().get(name, 0.0)

    # -- tests ------------------------------------------------------------------------------------

    def test_new_keys_fail_closed_stored_answers_replay_and_writes_resume(self):
        original_key = new_key("before")
        original = self.gateway.request("POST", "/echo", '{"n": 1}', key=original_key)
        self.assertExecuted(original)
        unavailable = 'idem_requests_total{outcome="store_unavailable"}'
        unavailable_before = self.metric(unavailable)

        self.grow_wal()
        self.limit_writes()
        keys = [new_key("limited") for _ in range(3)]
        refused = 0
        for key in keys + keys[:1]:
            r = self.gateway.request("POST", "/echo", '{"n": 2}', key=key)
            self.assertProblem(r, 503, "idempotency_store_unavailable")
            self.assertIsNotNone(r.header("Retry-After"), r)
            refused += 1
        for key in keys:
            self.assertEqual(self.upstream.executions(key), 0, "a request executed without its claim: " + key)
        # Reads still work: a stored answer replays, a request without a key passes through.
        self.assertReplayOf(self.gateway.request("POST", "/echo", '{"n": 1}', key=original_key), original)
        self.assertEqual(self.gateway.request("GET", "/echo").status, 200)
        self.assertTrue(self.gateway.alive(), "the gateway died at the file-size limit")
        self.assertEqual(self.metric(unavailable) - unavailable_before, refused)
        # The per-key line says why the store refused (info lines are flushed every 250 ms).
        self.eventually(lambda: any("verdict=store_unavailable" in l and 'store_error="sqlite:' in l
                                    for l in self.gateway.process.log().splitlines()),
                        5, msg="no per-key line gives the store's error")

        self.lift_limit()
        for key in keys:
            first = self.gateway.request("POST", "/echo", '{"n": 2}', key=key)
            self.assertExecuted(first)
            self.assertReplayOf(self.gateway.request("POST", "/echo", '{"n": 2}', key=key), first)
            self.assertEqual(self.upstream.executions(key), 1, key)
        self.assertReplayOf(self.gateway.request("POST", "/echo", '{"n": 1}', key=original_key), original)

    def test_an_outcome_that_cannot_be_recorded_still_reaches_its_client(self):
        key = new_key("unrecorded")
        finish_errors = 'idem_finish_total{result="error"}'
        finish_errors_before = self.metric(finish_errors)
        self.grow_wal()
        box = {}
        # Claimed while the store can write; the upstream takes long enough for the limit to be
        # in place before the outcome is recorded.
        t = threading.Thread(target=lambda: box.setdefault(
            "r", self.gateway.request("POST", "/slow?ms=1500", "{}", key=key, timeout=15)))
        t.start()
        self.eventually(lambda: self.upstream.executions(key) == 1, 5, msg="the slow request did not start")
        self.limit_writes()
        t.join(15)
        r = box.get("r")
        self.assertIsNotNone(r, "the client got no answer")
        self.assertExecuted(r)
        self.assertEqual(self.metric(finish_errors) - finish_errors_before, 1)

        self.lift_limit()
        # The record stayed in progress: a retry neither executes nor gets a made-up answer.
        retry = self.gateway.request("POST", "/slow?ms=1500", "{}", key=key)
        self.assertProblem(retry, 409, "idempotency_key_in_use")
        self.assertEqual(self.upstream.executions(key), 1)
        self.assertTrue(self.gateway.alive())


if __name__ == "__main__":
    harness.main()
