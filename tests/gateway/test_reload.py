#!/usr/bin/env python3
"""SIGHUP reloads the configuration without a failed request (docs/gateway.md, "Reloading"):
50 reloads, alternating two valid files and an invalid one, under wrk load (fresh keyed POSTs) while
four clients keep sending keyed requests (new keys and replays of old ones). Every one of their answers is a 200 (executed or
replayed); after each valid reload a probe sees the new policy (a route's `required`, its error
envelope); after each invalid one the running configuration stays, with one log line saying why.

    python3 test_reload.py --gateway PATH --upstream-bin PATH [--store memory|sqlite]
"""

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import GatewayTestCase, new_key  # noqa: E402

RELOADS = 50

BASE = """
upstream_timeout = "10s"

[idempotency]
lease = "30s"

[[route]]
method = "POST"
path = "/echo/load"
"""

# A: /echo/opt requires a key, problem+json errors.
CONFIG_A = BASE + """
[[route]]
method = "POST"
path = "/echo/opt"
required = true
"""

# B: /echo/opt takes requests without a key; its errors are Stripe's; more logging.
CONFIG_B = 'log_level = "debug"\n' + BASE + """
[[route]]
method = "POST"
path = "/echo/opt"
required = false
errors = "stripe"
key_max_length = 20
"""

# Not loadable: the running configuration must stay.
CONFIG_BAD = BASE + """
[[route]]
method = "POST"
path = "/echo/opt"
lease = "-1s"
"""


class ReloadTest(GatewayTestCase):
    CONFIG = CONFIG_A

    def write(self, text):
        with open(self.gateway.config_path, "w") as f:
            f.write(text)

    def reload_lines(self):
        log = self.gateway.process.log()
        return log.count("reload: configuration "), log.count("reload failed, keeping the running configuration")

    def probe(self):
        """Which configuration is in force, as a client sees it: "A" or "B"."""
        r = self.gateway.request("POST", "/echo/opt", "{}")
        if r.status == 200:
            # B: no key needed; and its errors are Stripe's (a key longer than key_max_length).
            bad = self.gateway.request("POST", "/echo/opt", "{}", key="k" * 30)
            self.assertEqual(bad.status, 400, bad)
            self.assertIn("error", bad.json(), bad)
            self.assertEqual(bad.json()["error"]["type"], "invalid_request_error", bad)
            return "B"
        self.assertProblem(r, 400, "idempotency_key_missing")
        return "A"

    def test_fifty_reloads_under_load_fail_no_request_and_apply_each_policy(self):
        self.assertEqual(self.probe(), "A")
        stop = threading.Event()
        lock = threading.Lock()
        answers = {"ok": 0, "bad": []}

        def client(i):
            keys = []
            sent = 0
            while not stop.is_set():
                sent += 1
                if keys and sent % 3 == 0:
                    key = keys[len(keys) // 2]  # a replay of an earlier key
                else:
                    key = new_key("reload%d" % i)
                    keys.append(key)
                try:
                    r = self.gateway.request("POST", "/echo/load", '{"n":1}', key=key, timeout=15)
                    good = r.status == 200
                except OSError as e:
                    good, r = False, e
                with lock:
                    if good:
                        answers["ok"] += 1
                    else:
                        answers["bad"].append(repr(r))
        # wrk alongside: fresh keyed POSTs at full speed for the whole loop (bench/gateway/post.lua).
        wrk = shutil.which("wrk")
        self.assertIsNotNone(wrk, "wrk is not installed (scripts/deps installs it)")
        lua = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "gateway", "post.lua")
        load = subprocess.Popen([wrk, "-t1", "-c8", "-d10s", "-s", lua,
                                 "http://127.0.0.1:%d/echo/load" % self.gateway.port],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        in_force = "A"
        try:
            for n in range(RELOADS):
                text, expect = [(CONFIG_B, "B"), (CONFIG_BAD, None), (CONFIG_A, "A")][n % 3]
                before = self.reload_lines()
                self.write(text)
                self.gateway.process.signal(signal.SIGHUP)
                if expect is None:
                    self.eventually(lambda: self.reload_lines()[1] > before[1], 10,
                                    msg="no line for failed reload %d" % n)
                else:
                    self.eventually(lambda: self.reload_lines()[0] > before[0], 10, msg="reload %d not in force" % n)
                    in_force = expect
                self.assertEqual(self.probe(), in_force, "after reload %d" % n)
        finally:
            stop.set()
            for t in threads:
                t.join(30)
        out, _ = load.communicate(timeout=60)
        self.assertEqual(load.returncode, 0, out)
        self.assertNotIn("Non-2xx", out, "wrk got answers other than 2xx during the reloads:\n" + out)
        self.assertNotIn("Socket errors", out, "wrk's connections failed during the reloads:\n" + out)
        wrk_requests = int(re.search(r"(\d+) requests in", out).group(1))
        self.assertGreater(wrk_requests, 1000, out)
        self.assertTrue(self.gateway.alive())
        self.assertEqual(answers["bad"], [], "requests failed during reloads")
        self.assertGreater(answers["ok"], 200, "too little load to prove anything")
        log = self.gateway.process.log()
        self.assertTrue('[[route]] #2: lease: "-1s"' in log, "the failed reload's line names the reason")
        failed = sum(1 for n in range(RELOADS) if n % 3 == 1)
        self.assertEqual(self.reload_lines(), (RELOADS - failed, failed))
        print("reloads=%d answers=%d wrk_requests=%d" % (RELOADS, answers["ok"], wrk_requests))


if __name__ == "__main__":
    harness.main()
