#!/usr/bin/env python3
"""What the gateway tells clients and operators beyond the answer itself (issue 21 §2, §3, §5):

  - Idempotency-Key-Expires on executed and replayed keyed responses whose record is kept (the
    retention, as an HTTP-date), none on a response whose record is not kept, none where a route
    says advertise_expiry = false;
  - multipart/form-data from `curl -F`, which draws a new boundary on every run: its retry is a
    replay, not a 422; a changed field is a 422;
  - log_format = "json": every line one JSON object; a key line has time, level, event, tenant,
    key, verdict, status, upstream_ms, request_id (the client's X-Request-Id) and trace_id (of a
    W3C traceparent).

    python3 test_advertise.py --gateway PATH --upstream-bin PATH [--store memory|sqlite]
"""

import email.utils
import json
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import GatewayTestCase, new_key  # noqa: E402

CONFIG = """
log_format = "json"

[idempotency]
retention = "2h"

[tenant]
header = "X-Tenant"

[[route]]
method = "POST"
path = "/echo/quiet/**"
advertise_expiry = false

[[route]]
method = "POST"
path = "/echo/**"

[[route]]
method = "POST"
path = "/status/**"
"""

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


class AdvertiseTest(GatewayTestCase):
    CONFIG = CONFIG

    def expires_of(self, r):
        value = r.header("Idempotency-Key-Expires")
        self.assertIsNotNone(value, r)
        return email.utils.parsedate_to_datetime(value).timestamp()

    def test_executed_and_replayed_responses_say_until_when_the_key_is_kept(self):
        key = new_key()
        before = time.time()
        first = self.gateway.request("POST", "/echo/a", "{}", key=key)
        self.assertExecuted(first)
        expires = self.expires_of(first)
        self.assertGreaterEqual(expires, int(before) + 2 * 3600 - 1)
        self.assertLessEqual(expires, time.time() + 2 * 3600 + 1)
        replay = self.gateway.request("POST", "/echo/a", "{}", key=key)
        self.assertEqual(replay.header("Idempotent-Replayed"), "true", replay)
        self.assertLessEqual(abs(self.expires_of(replay) - expires), 2)

    def test_no_expiry_where_nothing_is_kept_or_the_route_says_so(self):
        # A 5xx marks the key failed_retryable: a retry executes again, nothing is replayed.
        failed = self.gateway.request("POST", "/status/503", "{}", key=new_key())
        self.assertEqual(failed.status, 503, failed)
        self.assertIsNone(failed.header("Idempotency-Key-Expires"), failed)
        # 409 releases the key.
        released = self.gateway.request("POST", "/status/409", "{}", key=new_key())
        self.assertIsNone(released.header("Idempotency-Key-Expires"), released)
        quiet = self.gateway.request("POST", "/echo/quiet/x", "{}", key=new_key())
        self.assertExecuted(quiet)
        self.assertIsNone(quiet.header("Idempotency-Key-Expires"), quiet)
        # Passed through (no key on a POST no route requires a key for): nothing to advertise.
        self.assertIsNone(self.gateway.request("GET", "/echo/a").header("Idempotency-Key-Expires"))

    def curl_form(self, key, fields):
        argv = ["curl", "-s", "-o", "-", "-w", "\n%{http_code}", "-H", "Idempotency-Key: " + key,
                "-H", "X-Tenant: acme"]
        for f in fields:
            argv += ["-F", f]
        argv.append("http://127.0.0.1:%d/echo/form" % self.gateway.port)
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True).stdout
        body, _, status = out.rpartition("\n")
        return int(status), body

    def test_a_curl_form_retry_is_a_replay_whatever_boundary_curl_draws(self):
        if shutil.which("curl") is None:
            self.fail("curl is not installed (scripts/deps installs it)")
        upload = os.path.join(self.workdir, "receipt.txt")
        with open(upload, "w") as f:
            f.write("amount=100\n")
        key = new_key()
        fields = ["amount=100", "currency=EUR", "receipt=@%s;type=text/plain" % upload]
        status, first = self.curl_form(key, fields)
        self.assertEqual(status, 200, first)
        boundary = json.loads(first)["body"].split("\r\n", 1)[0]
        status, second = self.curl_form(key, fields)
        self.assertEqual(status, 200, second)
        self.assertEqual(second, first, "the retry must replay the first response")
        self.assertEqual(self.upstream.executions(key), 1)
        # curl drew another boundary for the retry (the reason a raw fingerprint would say 422).
        status, third = self.curl_form(new_key(), fields)
        self.assertNotEqual(json.loads(third)["body"].split("\r\n", 1)[0], boundary)
        # A different field value is another request: 422.
        status, changed = self.curl_form(key, ["amount=999", "currency=EUR", "receipt=@%s;type=text/plain" % upload])
        self.assertEqual(status, 422, changed)

    def test_json_log_lines(self):
        key = new_key()
        request_id = "req-" + new_key()
        r = self.gateway.request("POST", "/echo/logged", "{}", key=key, headers=[
            ("X-Tenant", "acme"), ("X-Request-Id", request_id),
            ("traceparent", "00-%s-00f067aa0ba902b7-01" % TRACE)])
        self.assertExecuted(r)
        line = None
        deadline = time.monotonic() + 5
        while line is None and time.monotonic() < deadline:
            for text in self.gateway.process.log().splitlines():
                if not text.strip():
                    continue
                try:
                    doc = json.loads(text)
                except ValueError:
                    self.fail("a log line that is not JSON: %r" % text)
                if doc.get("event") == "key" and doc.get("key") == key:
                    line = doc
            time.sleep(0.1)  # key lines are buffered up to 250 ms
        self.assertIsNotNone(line, "no key line for the request")
        self.assertEqual(line["level"], "info")
        self.assertRegex(line["time"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
        self.assertEqual(line["tenant"], "acme")
        self.assertEqual(line["verdict"], "execute")
        self.assertEqual(line["status"], 200)
        self.assertEqual(line["record"], "stored")
        self.assertEqual(line["request_id"], request_id)
        self.assertEqual(line["trace_id"], TRACE)
        self.assertIsInstance(line["upstream_ms"], (int, float))
        self.assertEqual(line["method"], "POST")
        self.assertEqual(line["path"], "/echo/logged")
        # Start-up lines are JSON too ("event": "log").
        first = json.loads(self.gateway.process.log().splitlines()[0])
        self.assertEqual(first["event"], "log")
        self.assertIn("message", first)


if __name__ == "__main__":
    harness.main()
