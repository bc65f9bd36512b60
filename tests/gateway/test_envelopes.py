#!/usr/bin/env python3
"""Every answer the gateway makes itself, in every error envelope (docs/gateway.md, "What happens
to a request"): problem+json, Stripe's error object and a JSON template, each as the top-level
`errors` of its own gateway, for every code a test can provoke through real HTTP: 400 key missing
and invalid, 400 bad_request (before any route is known), 409 in use and outcome unknown, 410 not
stored, 413, 422, 431, 502, 504. The status and the headers that matter (Retry-After,
X-Idempotency-Conflict, Cache-Control, Idempotent-Replayed) are the same in every style; only the
body and its Content-Type differ. A route's own `errors` wins over the top-level one.

    python3 test_envelopes.py --gateway PATH --upstream-bin PATH [--store memory|sqlite]
"""

import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import GatewayTestCase, RawClient, free_port, new_key, sleep_until  # noqa: E402

TEMPLATE = """{"failure": {"status": "{{status}}", "code": "{{code}}", "text": "{{title}}: {{detail}}",
  "retry_after": "{{retry_after}}", "see": "{{type}}"}}"""
TEMPLATE_TYPE = "application/vnd.acme.error+json"

ROUTES = """
upstream_timeout = "700ms"
max_header = "4KiB"
%s

[idempotency]
lease = "2s"
retry_after = "1s"

[[route]]
method = "POST"
path = "/echo/**"

[[route]]
method = "POST"
path = "/hang/**"

[[route]]
method = "POST"
path = "/hang-first/unknown"
on_lease_expiry = "unknown"

[[route]]
method = "POST"
path = "/large/**"
max_stored_response = "1KiB"

[[route]]
method = "POST"
path = "/small-body/**"
max_body = "1KiB"

[[route]]
method = "POST"
path = "/stripe-route/**"
errors = "stripe"
"""

STRIPE_TYPES = {"idempotency_key_in_use": "idempotency_error", "idempotency_outcome_unknown": "idempotency_error",
                "idempotency_key_mismatch": "idempotency_error"}


class EnvelopeTest(GatewayTestCase):
    CONFIG = None

    @classmethod
    def start_class_processes(cls):
        template = os.path.join(cls.workdir, "error.json")
        with open(template, "w") as f:
            f.write(TEMPLATE)
        styles = {
            "problem+json": "",
            "stripe": 'errors = "stripe"',
            "template": 'errors = { template = "%s", content_type = "%s" }' % (template, TEMPLATE_TYPE),
        }
        cls.gateways = {}
        cls.dead_upstream = {}
        dead = "http://127.0.0.1:%d" % free_port()  # nothing listens there: 502
        for name, line in styles.items():
            cls.gateways[name] = cls.start_gateway(ROUTES % line)
            cls.dead_upstream[name] = cls.start_gateway(ROUTES % line, upstream_url=dead)

    # -- the body of one refusal, in the style of the gateway that made it --------------------------

    def assertEnvelope(self, style, r, status, code):
        self.assertEqual(r.status, status, r)
        self.assertEqual(r.header("Cache-Control"), "no-store", r)
        ctype = (r.header("Content-Type") or "").split(";")[0].strip()
        if style == "problem+json":
            self.assertProblem(r, status, code)
            return
        doc = r.json()
        if style == "stripe":
            self.assertEqual(ctype, "application/json", r)
            self.assertEqual(set(doc), {"error"}, r)
            err = doc["error"]
            self.assertEqual(err["code"], code, r)
            expected = STRIPE_TYPES.get(code, "api_error" if status >= 500 else "invalid_request_error")
            self.assertEqual(err["type"], expected, r)
            self.assertTrue(err["message"], r)
            return
        self.assertEqual(ctype, TEMPLATE_TYPE, r)
        failure = doc["failure"]
        self.assertEqual(failure["status"], status, r)  # a whole-string placeholder: a JSON number
        self.assertEqual(failure["code"], code, r)
        self.assertIn(": ", failure["text"], r)
        self.assertEqual(failure["see"], "https://idem.dev/problems/" + code, r)
        retry_after = r.header("Retry-After")
        self.assertEqual(failure["retry_after"], int(retry_after) if retry_after else None, r)

    def each_style(self, fn):
        for style in self.gateways:
            with self.subTest(style=style):
                fn(style, self.gateways[style])

    # -- the codes ---------------------------------------------------------------------------------

    def test_400_missing_and_invalid_keys(self):
        def check(style, gw):
            self.assertEnvelope(style, gw.request("POST", "/echo/a", "{}"), 400, "idempotency_key_missing")
            self.assertEnvelope(style, gw.request("POST", "/echo/a", "{}", key="k" * 300), 400,
                                "idempotency_key_invalid")
        self.each_style(check)

    def test_400_bad_request_before_any_route_is_known(self):
        def check(style, gw):
            c = RawClient(gw.port)
            try:
                c.send(b"POST /echo/a HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n"
                       b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
                r = c.read_response()
            finally:
                c.close()
            self.assertEnvelope(style, r, 400, "bad_request")
        self.each_style(check)

    def test_409_in_use_and_504_timeout(self):
        def check(style, gw):
            key = new_key()
            box = {}
            t = threading.Thread(target=lambda: box.setdefault("r", gw.request("POST", "/hang/x", "{}", key=key)))
            t.start()
            self.eventually(lambda: self.upstream.executions(key) == 1, 5)
            busy = gw.request("POST", "/hang/x", "{}", key=key)
            self.assertEnvelope(style, busy, 409, "idempotency_key_in_use")
            self.assertEqual(busy.header("Retry-After"), "1", busy)
            t.join(10)
            self.assertEnvelope(style, box["r"], 504, "upstream_timeout")
        self.each_style(check)

    def test_409_outcome_unknown(self):
        keys = {style: new_key() for style in self.gateways}
        claimed = {}
        for style, gw in self.gateways.items():
            claimed[style] = time.monotonic()
            self.assertEqual(gw.request("POST", "/hang-first/unknown", "{}", key=keys[style]).status, 504)

        def check(style, gw):
            sleep_until(claimed[style] + 2.0 + 0.5)  # the lease, and a margin
            r = gw.request("POST", "/hang-first/unknown", "{}", key=keys[style])
            self.assertEnvelope(style, r, 409, "idempotency_outcome_unknown")
        self.each_style(check)

    def test_410_not_stored_is_replayed_in_the_style_it_was_stored_in(self):
        def check(style, gw):
            key = new_key()
            first = gw.request("POST", "/large/x?bytes=4096", "{}", key=key)
            self.assertEqual(first.status, 200, first)
            replay = gw.request("POST", "/large/x?bytes=4096", "{}", key=key)
            self.assertEqual(replay.header("Idempotent-Replayed"), "true", replay)
            self.assertEqual(replay.header("Idempotent-Original-Status"), "200", replay)
            self.assertEnvelope(style, replay, 410, "idempotency_response_not_stored")
        self.each_style(check)

    def test_413_and_431(self):
        def check(style, gw):
            self.assertEnvelope(style, gw.request("POST", "/small-body/x", "x" * 2048, key=new_key()), 413,
                                "request_too_large")
            big = gw.request("POST", "/echo/a", "{}", key=new_key(), headers=[("X-Big", "b" * 6000)])
            self.assertEnvelope(style, big, 431, "request_header_too_large")
        self.each_style(check)

    def test_422_mismatch_keeps_its_conflict_header(self):
        def check(style, gw):
            key = new_key()
            self.assertEqual(gw.request("POST", "/echo/a", '{"amount":1}', key=key).status, 200)
            r = gw.request("POST", "/echo/a", '{"amount":2}', key=key)
            self.assertEnvelope(style, r, 422, "idempotency_key_mismatch")
            self.assertEqual(r.header("X-Idempotency-Conflict"), "true", r)
        self.each_style(check)

    def test_502_unreachable(self):
        for style, gw in self.dead_upstream.items():
            with self.subTest(style=style):
                self.assertEnvelope(style, gw.request("POST", "/echo/a", "{}", key=new_key()), 502,
                                    "upstream_unreachable")

    def test_a_routes_own_errors_win(self):
        for style, gw in self.gateways.items():
            with self.subTest(top_level=style):
                self.assertEnvelope("stripe", gw.request("POST", "/stripe-route/x", "{}"), 400, "idempotency_key_missing")


if __name__ == "__main__":
    harness.main()
