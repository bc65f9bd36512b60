#!/usr/bin/env python3
"""SPEC §2–§7 through the real gateway: replay, mismatch, in-use, key rules, methods, routes,
tenants, status classes, fingerprints, problem+json, size limits, metrics and health.

    python3 test_rules.py --gateway PATH --upstream-bin PATH [--store memory|sqlite]
"""

import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import GatewayTestCase, RawClient, new_key  # noqa: E402

MAX_BODY = 64 * 1024
MAX_STORED = 256 * 1024

CONFIG = """
upstream_timeout = "10s"
max_body = "64KiB"
max_stored_response = "256KiB"

[idempotency]
header = "Idempotency-Key"
key_min_length = 16
key_max_length = 256
retention = "1h"
lease = "30s"
retry_after = "1s"
store_server_errors = false
on_lease_expiry = "reexecute"

[tenant]
header = "X-Tenant-Id"

[[route]]
method = "POST"
path = "/echo"

[[route]]
method = "PATCH"
path = "/echo"

[[route]]
method = "POST"
path = "/echo/optional"
required = false

[[route]]
method = "PUT"
path = "/echo/put"

[[route]]
method = "POST"
path = "/echo/ignore-ts"
fingerprint.json_ignore = ["/client_ts"]

[[route]]
method = "POST"
path = "/echo/ct"
fingerprint.headers = ["Content-Type"]

[[route]]
method = "POST"
path = "/slow"

[[route]]
method = "POST"
path = "/large"

[[route]]
method = "POST"
path = "/status/*"

[[route]]
method = "POST"
path = "/status/*/stored"
store_server_errors = true

[[route]]
method = "POST"
path = "/sequence/**"
"""


def raw_post(port, path, key_header_lines, body=b"{}", extra=b""):
    """A POST whose key header lines are sent as raw bytes; returns the response or None."""
    c = RawClient(port)
    try:
        c.send(b"POST " + path.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n"
               b"Content-Type: application/json\r\n" + b"".join(key_header_lines) + extra +
               b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        return c.read_response(timeout=10)
    finally:
        c.close()


class ReplayTest(GatewayTestCase):
    CONFIG = CONFIG

    def test_replay_is_byte_for_byte_with_idempotent_replayed(self):
        key = new_key()
        body = '{"amount": 100, "currency": "EUR"}'
        hs = [("Content-Type", "application/json")]
        first = self.gateway.request("POST", "/echo", body, hs, key=key)
        self.assertExecuted(first)
        for _ in range(3):
            again = self.gateway.request("POST", "/echo", body, hs, key=key)
            self.assertReplayOf(again, first)
            self.assertEqual(again.execution_id, first.execution_id)
        self.assertEqual(self.upstream.executions(key), 1)
        for r in (first, again):
            self.assertEqual(r.header("X-Fixture-Route"), "/echo", r)
            self.assertEqual(r.header("Content-Type"), "application/json", r)

    def test_hop_by_hop_response_headers_are_neither_forwarded_nor_stored(self):
        key = new_key()
        first = self.gateway.request("POST", "/echo?hop=1", "{}", key=key)
        again = self.gateway.request("POST", "/echo?hop=1", "{}", key=key)
        self.assertExecuted(first)
        self.assertReplayOf(again, first)
        for name, r in (("forwarded", first), ("replayed", again)):
            with self.subTest(name):
                self.assertNotIn("timeout=30", r.header_all("Keep-Alive"), r)
                self.assertIsNone(r.header("Proxy-Authenticate"), r)
                self.assertIsNone(r.header("X-Fixture-Private"), "header named by Connection passed on")
                self.assertNotIn("X-Fixture-Private", ",".join(r.header_all("Connection")))
                # The issue lists "Proxy-*" as hop-by-hop: any Proxy- header, not only the RFC's.
                self.assertIsNone(r.header("Proxy-Fixture"), "Proxy-* header passed on: %r" % (r,))

    def test_replay_of_created_and_large_bodies(self):
        key = new_key()
        first = self.gateway.request("POST", "/status/201", "{}", key=key)
        self.assertExecuted(first, 201)
        self.assertReplayOf(self.gateway.request("POST", "/status/201", "{}", key=key), first)

        key = new_key()
        first = self.gateway.request("POST", "/large?bytes=200000", "{}", key=key)
        self.assertExecuted(first)
        self.assertEqual(len(first.body), 200000)
        self.assertReplayOf(self.gateway.request("POST", "/large?bytes=200000", "{}", key=key), first)
        self.assertEqual(self.upstream.executions(key), 1)

    def test_response_above_max_stored_response_reaches_client_then_410(self):
        key = new_key()
        size = MAX_STORED + 100000
        before = self.gateway.metrics().get("idem_oversized_responses_total", 0.0)
        first = self.gateway.request("POST", "/large?bytes=%d" % size, "{}", key=key)
        self.assertExecuted(first)
        self.assertEqual(len(first.body), size, "streamed response truncated")
        self.assertEqual(first.body[:26], b"abcdefghijklmnopqrstuvwxyz")
        for _ in range(2):
            r = self.gateway.request("POST", "/large?bytes=%d" % size, "{}", key=key)
            self.assertProblem(r, 410, "idempotency_response_not_stored")
            self.assertEqual(r.header("Idempotent-Replayed"), "true", r)
            self.assertEqual(r.header("Idempotent-Original-Status"), "200", r)
        self.assertEqual(self.upstream.executions(key), 1)
        self.assertGreater(self.gateway.metrics().get("idem_oversized_responses_total", 0.0), before)

    def test_mismatch_is_422_and_does_not_poison(self):
        key = new_key()
        hs = [("Content-Type", "application/json")]
        first = self.gateway.request("POST", "/echo", '{"amount": 1}', hs, key=key)
        self.assertExecuted(first)
        for body, method, path in (('{"amount": 2}', "POST", "/echo"),
                                   ('{"amount": 1}', "PATCH", "/echo"),
                                   ('{"amount": 1}', "POST", "/echo?x=1")):
            with self.subTest(method=method, path=path, body=body):
                r = self.gateway.request(method, path, body, hs, key=key)
                self.assertProblem(r, 422, "idempotency_key_mismatch")
                self.assertEqual(r.header("X-Idempotency-Conflict"), "true", r)
        self.assertReplayOf(self.gateway.request("POST", "/echo", '{"amount": 1}', hs, key=key), first)
        self.assertEqual(self.upstream.executions(key), 1)

    def test_in_progress_is_409_with_retry_after_and_mismatch_still_422(self):
        key = new_key()
        box = {}
        t = threading.Thread(target=lambda: box.setdefault(
            "r", self.gateway.request("POST", "/slow?ms=1500", "{}", key=key)))
        t.start()
        try:
            self.eventually(lambda: self.upstream.executions(key) == 1, 10, msg="slow request reached upstream")
            r = self.gateway.request("POST", "/slow?ms=1500", "{}", key=key)
            self.assertProblem(r, 409, "idempotency_key_in_use")
            self.assertEqual(r.header("Retry-After"), "1", r)
            r = self.gateway.request("POST", "/slow?ms=1500", '{"other": true}', key=key)
            self.assertProblem(r, 422, "idempotency_key_mismatch")
            self.assertEqual(r.header("X-Idempotency-Conflict"), "true", r)
        finally:
            t.join(30)
        first = box["r"]
        self.assertExecuted(first)
        self.assertReplayOf(self.gateway.request("POST", "/slow?ms=1500", "{}", key=key), first)
        self.assertEqual(self.upstream.executions(key), 1)


class KeyRulesTest(GatewayTestCase):
    CONFIG = CONFIG

    def test_missing_key_on_required_route_is_400(self):
        before = self.upstream.total()
        for path in ("/echo", "/status/201", "/sequence/a/b/c"):
            with self.subTest(path=path):
                r = self.gateway.request("POST", path, "{}")
                self.assertProblem(r, 400, "idempotency_key_missing")
        self.assertEqual(self.upstream.total(), before)

    def test_invalid_keys_are_400_and_never_executed(self):
        k = new_key().encode()
        cases = {
            "empty": [b"Idempotency-Key: \r\n"],
            "too short (15)": [b"Idempotency-Key: " + b"a" * 15 + b"\r\n"],
            "too long (257)": [b"Idempotency-Key: " + b"a" * 257 + b"\r\n"],
            "sf-string too short": [b'Idempotency-Key: "abc"\r\n'],
            "space inside": [b"Idempotency-Key: abcdefgh ijklmnopq\r\n"],
            "space inside sf-string": [b'Idempotency-Key: "abcdefgh ijklmnopq"\r\n'],
            "tab inside": [b"Idempotency-Key: abcdefgh\tijklmnopq\r\n"],
            "non-ASCII (UTF-8)": [b"Idempotency-Key: abcdefghijklmnop\xc3\xa9\r\n"],
            "non-ASCII (latin-1)": [b"Idempotency-Key: abcdefghijklmnop\xe9\r\n"],
            "header twice (same value)": [b"Idempotency-Key: " + k + b"\r\n"] * 2,
            "header twice (different values)": [b"Idempotency-Key: " + k + b"\r\n",
                                                b"Idempotency-Key: " + k + b"-2\r\n"],
            "list": [b"Idempotency-Key: " + k + b", " + k + b"-2\r\n"],
            "sf list": [b'Idempotency-Key: "' + k + b'", "' + k + b'-2"\r\n'],
            "unterminated sf-string": [b'Idempotency-Key: "' + k + b"\r\n"],
            "garbage after sf-string": [b'Idempotency-Key: "' + k + b'"x\r\n'],
        }
        before = self.upstream.total()
        for name, lines in cases.items():
            with self.subTest(name):
                r = raw_post(self.gateway.port, "/echo", lines)
                self.assertIsNotNone(r, "gateway closed without answering")
                self.assertProblem(r, 400, "idempotency_key_invalid")
        # Control characters make the header line itself invalid HTTP: a 400 either way.
        for name, line in (("control character", b"Idempotency-Key: abcdefgh\x01ijklmnopq\r\n"),
                           ("DEL", b"Idempotency-Key: abcdefgh\x7fijklmnopq\r\n")):
            with self.subTest(name):
                r = raw_post(self.gateway.port, "/echo", [line])
                self.assertIsNotNone(r, "gateway closed without answering")
                self.assertEqual(r.status, 400, r)
                self.assertIn(r.json()["code"], ("idempotency_key_invalid", "bad_request"))
        self.assertEqual(self.upstream.total(), before, "an invalid key reached the upstream")
        self.assertTrue(self.gateway.alive())

    def test_length_bounds_are_inclusive(self):
        for n in (16, 256):
            with self.subTest(length=n):
                key = (new_key() * 8)[:n]
                self.assertEqual(len(key), n)
                r = self.gateway.request("POST", "/echo", "{}", key=key)
                self.assertExecuted(r)
                self.assertReplayOf(self.gateway.request("POST", "/echo", "{}", key=key), r)

    def test_sf_string_form_is_the_same_key_as_the_bare_form(self):
        key = new_key()
        first = self.gateway.request("POST", "/echo", "{}", key='"%s"' % key)
        self.assertExecuted(first)
        self.assertReplayOf(self.gateway.request("POST", "/echo", "{}", key=key), first)
        self.assertReplayOf(self.gateway.request("POST", "/echo", "{}", key='"%s"' % key), first)
        # An escaped quote inside the sf-string is part of the key.
        esc = new_key() + '\\"q'
        r = self.gateway.request("POST", "/echo", "{}", key='"%s"' % esc)
        self.assertExecuted(r)
        self.assertReplayOf(self.gateway.request("POST", "/echo", "{}", key='"%s"' % esc), r)
        self.assertEqual(self.upstream.executions(key), 1)

    def test_header_name_is_case_insensitive(self):
        key = new_key()
        first = self.gateway.request("POST", "/echo", "{}", [("idempotency-key", key)])
        self.assertExecuted(first)
        self.assertReplayOf(self.gateway.request("POST", "/echo", "{}", [("IDEMPOTENCY-KEY", key)]), first)


class MethodsAndRoutesTest(GatewayTestCase):
    CONFIG = CONFIG

    def test_safe_methods_with_a_key_pass_through_and_are_never_replayed(self):
        key = new_key()
        for method in ("GET", "OPTIONS"):
            with self.subTest(method=method):
                before = self.upstream.executions(key)
                a = self.gateway.request(method, "/echo", key=key)
                b = self.gateway.request(method, "/echo", key=key)
                for r in (a, b):
                    self.assertExecuted(r)
                self.assertNotEqual(a.execution_id, b.execution_id)
                self.assertEqual(self.upstream.executions(key), before + 2)
        # HEAD: answered, never replayed.
        h1 = self.gateway.request("HEAD", "/echo", key=key)
        h2 = self.gateway.request("HEAD", "/echo", key=key)
        self.assertFalse(h1.replayed or h2.replayed)
        # A GET with a key does not claim it: a POST with that key still executes.
        self.assertExecuted(self.gateway.request("POST", "/echo", "{}", key=key))

    def test_get_with_invalid_key_is_not_refused(self):
        r = self.gateway.request("GET", "/echo", key="short")
        self.assertExecuted(r)

    def test_put_passes_through_unless_a_route_opts_in(self):
        key = new_key()
        a = self.gateway.request("PUT", "/echo", "{}", key=key)
        b = self.gateway.request("PUT", "/echo", "{}", key=key)
        self.assertExecuted(a)
        self.assertExecuted(b)
        self.assertNotEqual(a.execution_id, b.execution_id)
        key = new_key()
        a = self.gateway.request("PUT", "/echo/put", "{}", key=key)
        self.assertExecuted(a)
        self.assertReplayOf(self.gateway.request("PUT", "/echo/put", "{}", key=key), a)
        self.assertProblem(self.gateway.request("PUT", "/echo/put", "{}"), 400, "idempotency_key_missing")

    def test_patch_route_is_handled(self):
        key = new_key()
        a = self.gateway.request("PATCH", "/echo", '{"a":1}', [("Content-Type", "application/json")], key=key)
        self.assertExecuted(a)
        self.assertReplayOf(self.gateway.request("PATCH", "/echo", '{"a":1}',
                                                 [("Content-Type", "application/json")], key=key), a)

    def test_optional_route_passes_keyless_requests_through(self):
        a = self.gateway.request("POST", "/echo/optional", "{}")
        b = self.gateway.request("POST", "/echo/optional", "{}")
        self.assertExecuted(a)
        self.assertExecuted(b)
        self.assertNotEqual(a.execution_id, b.execution_id)
        key = new_key()
        c = self.gateway.request("POST", "/echo/optional", "{}", key=key)
        self.assertExecuted(c)
        self.assertReplayOf(self.gateway.request("POST", "/echo/optional", "{}", key=key), c)
        # Optional does not mean lenient: a bad key is still refused.
        self.assertProblem(self.gateway.request("POST", "/echo/optional", "{}", key="short"),
                           400, "idempotency_key_invalid")

    def test_double_star_matches_the_rest_of_the_path(self):
        key = new_key()
        a = self.gateway.request("POST", "/sequence/a/b/c?codes=201", "{}", key=key)
        self.assertExecuted(a, 201)
        self.assertReplayOf(self.gateway.request("POST", "/sequence/a/b/c?codes=201", "{}", key=key), a)

    def test_forwarded_headers_added_and_hop_by_hop_dropped(self):
        key = new_key()
        r = self.gateway.request("POST", "/echo", "{}", [
            ("Connection", "keep-alive, X-Drop-Me"), ("X-Drop-Me", "1"), ("Keep-Alive", "timeout=5"),
            ("TE", "trailers"), ("Upgrade", "websocket"), ("Proxy-Authorization", "Basic Zm9vOmJhcg=="),
            ("X-Kept", "yes")], key=key)
        self.assertExecuted(r)
        seen = {}
        for name, value in r.json()["headers"]:
            seen.setdefault(name.lower(), []).append(value)
        self.assertEqual(seen.get("x-kept"), ["yes"])
        self.assertIn("127.0.0.1", ",".join(seen.get("x-forwarded-for", [])), seen)
        self.assertEqual(seen.get("x-forwarded-proto"), ["http"], seen)
        for hop in ("keep-alive", "te", "upgrade", "proxy-authorization", "transfer-encoding", "x-drop-me"):
            self.assertNotIn(hop, seen, "hop-by-hop request header %r forwarded" % hop)
        self.assertNotIn("websocket", ",".join(seen.get("connection", [])))
        self.assertEqual(seen.get("idempotency-key"), [key])

    def test_forwarded_headers_from_the_client_are_extended_or_replaced(self):
        # The client's own X-Forwarded-For chain (two fields, odd case) is kept and the client
        # appended, in one field; its X-Forwarded-Proto is replaced by the scheme the gateway
        # was reached by; an Expect it sent is not forwarded.
        r = self.gateway.request("POST", "/echo", "{}", [
            ("X-Forwarded-For", "203.0.113.7"), ("x-forwarded-for", "198.51.100.2"),
            ("X-FORWARDED-PROTO", "https"), ("Expect", "100-continue")], key=new_key())
        self.assertExecuted(r)
        seen = {}
        for name, value in r.json()["headers"]:
            seen.setdefault(name.lower(), []).append(value)
        self.assertEqual(seen.get("x-forwarded-for"), ["203.0.113.7, 198.51.100.2, 127.0.0.1"], seen)
        self.assertEqual(seen.get("x-forwarded-proto"), ["http"], seen)
        self.assertNotIn("expect", seen)
        self.assertEqual(len(seen.get("host", [])), 1, seen)

    def test_connection_close_and_http10_requests_get_their_answer(self):
        key = new_key()
        cases = [
            ("proxied, Connection: close", "HTTP/1.1", "Connection: close\r\nIdempotency-Key: %s\r\n" % key, 200),
            ("replayed, Connection: close", "HTTP/1.1", "Connection: close\r\nIdempotency-Key: %s\r\n" % key, 200),
            ("problem, Connection: close", "HTTP/1.1", "Connection: close\r\n", 400),
            ("proxied, HTTP/1.0", "HTTP/1.0", "Idempotency-Key: %s\r\n" % new_key(), 200),
            ("problem, HTTP/1.0", "HTTP/1.0", "", 400),
        ]
        for name, version, headers, status in cases:
            with self.subTest(name):
                c = RawClient(self.gateway.port)
                try:
                    c.send("POST /echo %s\r\nHost: x\r\n%sContent-Length: 2\r\n\r\n{}" % (version, headers))
                    r = c.read_response(timeout=5)
                    self.assertIsNotNone(r, "closed without an answer")
                    self.assertEqual(r.status, status, r)
                    self.assertTrue(c.closed_by_peer(5), "connection not closed after the answer")
                finally:
                    c.close()

    def test_keep_alive_on_the_client_side(self):
        import http.client
        conn = http.client.HTTPConnection("127.0.0.1", self.gateway.port, timeout=10)
        try:
            ids = []
            for i in range(5):
                key = new_key()
                conn.request("POST", "/echo", body="{}", headers={"Idempotency-Key": key})
                r = conn.getresponse()
                r.read()
                self.assertEqual(r.status, 200)
                ids.append(r.getheader("X-Execution-Id"))
            self.assertEqual(len(set(ids)), 5)
        finally:
            conn.close()


class TenantTest(GatewayTestCase):
    CONFIG = CONFIG

    def test_same_key_in_two_tenants_is_two_operations(self):
        key = new_key()
        a = self.gateway.request("POST", "/echo", "{}", [("X-Tenant-Id", "tenant-a")], key=key)
        b = self.gateway.request("POST", "/echo", "{}", [("X-Tenant-Id", "tenant-b")], key=key)
        none = self.gateway.request("POST", "/echo", "{}", key=key)
        for r in (a, b, none):
            self.assertExecuted(r)
        self.assertEqual(len({a.execution_id, b.execution_id, none.execution_id}), 3)
        ra = self.gateway.request("POST", "/echo", "{}", [("X-Tenant-Id", "tenant-a")], key=key)
        rb = self.gateway.request("POST", "/echo", "{}", [("X-Tenant-Id", "tenant-b")], key=key)
        self.assertReplayOf(ra, a)
        self.assertReplayOf(rb, b)
        self.assertIn(["X-Tenant-Id", "tenant-a"], ra.json()["headers"])
        self.assertIn(["X-Tenant-Id", "tenant-b"], rb.json()["headers"])
        self.assertEqual(self.upstream.executions(key), 3)
        # Another tenant's differing body is not a mismatch: it is another operation.
        c = self.gateway.request("POST", "/echo", '{"x":1}', [("X-Tenant-Id", "tenant-c")], key=key)
        self.assertExecuted(c)

    def test_a_repeated_tenant_header_is_refused_not_guessed(self):
        """A proxy in front that appends its X-Tenant-Id instead of replacing the client's must
        not let a client pick another tenant's scope: two values, whichever order, are refused,
        and the victim's record is neither replayed nor touched."""
        key = new_key()
        victim = self.gateway.request("POST", "/echo", "{}", [("X-Tenant-Id", "victim")], key=key)
        self.assertExecuted(victim)
        for pair in (("victim", "attacker"), ("attacker", "victim")):
            r = self.gateway.request("POST", "/echo", "{}", [("X-Tenant-Id", pair[0]), ("X-Tenant-Id", pair[1])],
                                     key=key)
            self.assertProblem(r, 400, "tenant_ambiguous")
            self.assertIn("X-Tenant-Id", r.json()["detail"])
        self.assertEqual(self.upstream.executions(key), 1)
        self.assertReplayOf(self.gateway.request("POST", "/echo", "{}", [("X-Tenant-Id", "victim")], key=key), victim)


class AuthorizationTenantTest(GatewayTestCase):
    CONFIG = CONFIG.replace('[tenant]\nheader = "X-Tenant-Id"', '[tenant]\nfrom = "authorization"')
    SECRET_A = "Bearer secret-token-AAAA-7f3e9c"
    SECRET_B = "Bearer secret-token-BBBB-1d2c4b"

    def test_credential_hash_scopes_keys(self):
        key = new_key()
        a = self.gateway.request("POST", "/status/201", "{}", [("Authorization", self.SECRET_A)], key=key)
        b = self.gateway.request("POST", "/status/201", "{}", [("Authorization", self.SECRET_B)], key=key)
        self.assertExecuted(a, 201)
        self.assertExecuted(b, 201)
        self.assertNotEqual(a.execution_id, b.execution_id)
        self.assertReplayOf(self.gateway.request("POST", "/status/201", "{}",
                                                 [("Authorization", self.SECRET_A)], key=key), a)
        self.assertReplayOf(self.gateway.request("POST", "/status/201", "{}",
                                                 [("Authorization", self.SECRET_B)], key=key), b)
        self.assertEqual(self.upstream.executions(key), 2)

    def test_two_credentials_are_refused(self):
        key = new_key()
        r = self.gateway.request("POST", "/status/201", "{}",
                                 [("Authorization", self.SECRET_A), ("Authorization", self.SECRET_B)], key=key)
        self.assertProblem(r, 400, "tenant_ambiguous")
        self.assertNotIn("secret", r.body.decode(), "a credential in the answer")
        self.assertEqual(self.upstream.executions(key), 0)

    def test_raw_credentials_are_never_stored(self):
        if harness.ARGS.store != "sqlite":
            self.skipTest("needs a store with a file to inspect (runs under --store sqlite)")
        key = new_key()
        self.assertExecuted(self.gateway.request("POST", "/status/201", "{}",
                                                 [("Authorization", self.SECRET_A)], key=key), 201)
        blob = b""
        for name in os.listdir(self.workdir):
            if name.startswith("idem.db"):
                with open(os.path.join(self.workdir, name), "rb") as f:
                    blob += f.read()
        self.assertIn(key.encode(), blob, "the key should be in the store file (wrong file?)")
        for secret in (self.SECRET_A, self.SECRET_A.split(" ", 1)[1]):
            self.assertNotIn(secret.encode(), blob, "raw credential stored")


class StatusClassesTest(GatewayTestCase):
    CONFIG = CONFIG

    def test_5xx_re_executes(self):
        for code in (500, 502, 503):
            with self.subTest(code=code):
                key = new_key()
                a = self.gateway.request("POST", "/status/%d" % code, "{}", key=key)
                b = self.gateway.request("POST", "/status/%d" % code, "{}", key=key)
                self.assertEqual(a.status, code, a)
                self.assertEqual(b.status, code, b)
                self.assertFalse(a.replayed or b.replayed)
                self.assertNotEqual(a.execution_id, b.execution_id)
                self.assertEqual(self.upstream.executions(key), 2)

    def test_5xx_then_success_then_replay(self):
        key = new_key()
        a = self.gateway.request("POST", "/sequence/x?codes=500,201", "{}", key=key)
        self.assertEqual(a.status, 500, a)
        b = self.gateway.request("POST", "/sequence/x?codes=500,201", "{}", key=key)
        self.assertExecuted(b, 201)
        self.assertReplayOf(self.gateway.request("POST", "/sequence/x?codes=500,201", "{}", key=key), b)
        self.assertEqual(self.upstream.executions(key), 2)

    def test_5xx_stored_when_the_route_says_so(self):
        key = new_key()
        a = self.gateway.request("POST", "/status/500/stored", "{}", key=key)
        self.assertEqual(a.status, 500, a)
        self.assertReplayOf(self.gateway.request("POST", "/status/500/stored", "{}", key=key), a)
        self.assertEqual(self.upstream.executions(key), 1)

    def test_2xx_3xx_4xx_are_replayed(self):
        for code in (200, 202, 303, 400, 403, 404, 410, 422):
            with self.subTest(code=code):
                key = new_key()
                a = self.gateway.request("POST", "/status/%d" % code, "{}", key=key)
                self.assertExecuted(a, code)
                self.assertReplayOf(self.gateway.request("POST", "/status/%d" % code, "{}", key=key), a)
                self.assertEqual(self.upstream.executions(key), 1)

    def test_408_409_425_429_release_the_key(self):
        for code in (408, 409, 425, 429):
            with self.subTest(code=code):
                key = new_key()
                path = "/sequence/released?codes=%d,201" % code
                a = self.gateway.request("POST", path, "{}", key=key)
                self.assertEqual(a.status, code, a)
                self.assertFalse(a.replayed)
                b = self.gateway.request("POST", path, "{}", key=key)
                self.assertExecuted(b, 201)
                self.assertReplayOf(self.gateway.request("POST", path, "{}", key=key), b)
                self.assertEqual(self.upstream.executions(key), 2)


class FingerprintTest(GatewayTestCase):
    CONFIG = CONFIG
    JSON = [("Content-Type", "application/json")]

    def same(self, path, a, b, ha=JSON, hb=JSON):
        key = new_key()
        first = self.gateway.request("POST", path, a, ha, key=key)
        self.assertExecuted(first)
        self.assertReplayOf(self.gateway.request("POST", path, b, hb, key=key), first)

    def differs(self, path, a, b, ha=JSON, hb=JSON):
        key = new_key()
        self.assertExecuted(self.gateway.request("POST", path, a, ha, key=key))
        r = self.gateway.request("POST", path, b, hb, key=key)
        self.assertProblem(r, 422, "idempotency_key_mismatch")
        self.assertEqual(r.header("X-Idempotency-Conflict"), "true")

    def test_json_key_order_and_whitespace_do_not_matter(self):
        self.same("/echo", '{"a":1,"b":[1,2],"c":{"x":1,"y":"z"}}',
                  '{ "c" : { "y" : "z", "x" : 1 },\n  "b": [1, 2],\t"a": 1 }')
        self.same("/echo", '{"a":1,"b":2}', '{"b":2,"a":1}',
                  [("Content-Type", "application/merge-patch+json")],
                  [("Content-Type", "application/merge-patch+json")])
        self.same("/echo", '{"a":1,"b":2}', '{"b":2,"a":1}',
                  [("Content-Type", "application/json; charset=utf-8")],
                  [("Content-Type", "application/json; charset=utf-8")])

    def test_json_canonical_forms_rfc8785(self):
        self.same("/echo", '{"n":1.0,"s":"A"}', '{"s":"\\u0041","n":1}')
        self.same("/echo", '{"n":1e2}', '{"n":100}')

    def test_json_values_do_matter(self):
        self.differs("/echo", '{"a":1}', '{"a":2}')
        self.differs("/echo", '{"a":[1,2]}', '{"a":[2,1]}')
        self.differs("/echo", '{"a":"1"}', '{"a":1}')

    def test_invalid_json_and_other_types_hash_raw(self):
        self.differs("/echo", '{"a":1,', '{"a": 1,')
        self.differs("/echo", "hello world", "hello  world", [("Content-Type", "text/plain")],
                     [("Content-Type", "text/plain")])

    def test_form_bodies_are_sorted(self):
        form = [("Content-Type", "application/x-www-form-urlencoded")]
        self.same("/echo", "a=1&b=2", "b=2&a=1", form, form)
        self.differs("/echo", "a=1&b=2", "a=1&b=3", form, form)

    def test_query_is_canonical(self):
        key = new_key()
        first = self.gateway.request("POST", "/echo?a=1&b=2", "{}", key=key)
        self.assertExecuted(first)
        self.assertReplayOf(self.gateway.request("POST", "/echo?b=2&a=1", "{}", key=key), first)
        r = self.gateway.request("POST", "/echo?a=1&b=3", "{}", key=key)
        self.assertProblem(r, 422, "idempotency_key_mismatch")

    def test_json_ignore_leaves_out_pointers(self):
        self.same("/echo/ignore-ts", '{"amount":5,"client_ts":"2026-01-01T00:00:00Z"}',
                  '{"client_ts":"2026-01-01T00:00:09Z","amount":5}')
        self.differs("/echo/ignore-ts", '{"amount":5,"client_ts":"t1"}', '{"amount":6,"client_ts":"t1"}')

    def test_headers_only_when_configured(self):
        text = [("Content-Type", "text/plain")]
        octet = [("Content-Type", "application/octet-stream")]
        self.same("/echo", "payload", "payload", text, octet)
        self.differs("/echo/ct", "payload", "payload", text, octet)
        self.same("/echo/ct", "payload", "payload", text, text)

    def test_volatile_headers_never_count(self):
        self.same("/echo", "{}", "{}",
                  [("Content-Type", "application/json"), ("User-Agent", "a/1"), ("X-Request-Id", "1"),
                   ("Date", "Mon, 01 Jan 2026 00:00:00 GMT"), ("traceparent",
                                                               "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")],
                  [("Content-Type", "application/json"), ("User-Agent", "b/2"), ("X-Request-Id", "2"),
                   ("Date", "Mon, 01 Jan 2026 00:00:09 GMT"), ("traceparent",
                                                               "00-1af7651916cd43dd8448eb211c80319c-c7ad6b7169203331-01")])


class LimitsTest(GatewayTestCase):
    CONFIG = CONFIG

    def test_body_over_max_body_is_413_and_does_not_claim(self):
        key = new_key()
        r = self.gateway.request("POST", "/echo", b"x" * (MAX_BODY + 1), key=key)
        self.assertProblem(r, 413, "request_too_large")
        self.assertEqual(self.upstream.executions(key), 0)
        ok = self.gateway.request("POST", "/echo", b"x" * MAX_BODY, key=key)
        self.assertExecuted(ok)
        self.assertEqual(len(ok.json()["body"]), MAX_BODY)

    def test_announced_oversized_body_answered_without_reading_it(self):
        c = RawClient(self.gateway.port)
        try:
            c.send("POST /echo HTTP/1.1\r\nHost: x\r\nIdempotency-Key: %s\r\nContent-Length: %d\r\n\r\n"
                   % (new_key(), 100 * 1024 * 1024))
            r = c.read_response(timeout=5)
            self.assertIsNotNone(r, "closed without a 413")
            self.assertProblem(r, 413, "request_too_large")
        finally:
            c.close()


class AdminTest(GatewayTestCase):
    CONFIG = CONFIG

    def test_healthz_and_readyz(self):
        self.assertEqual(self.gateway.admin("/healthz").status, 200)
        self.assertEqual(self.gateway.admin("/readyz").status, 200)

    def test_admin_is_not_on_the_data_listener(self):
        r = self.gateway.request("GET", "/metrics")
        self.assertNotIn(b"# TYPE", r.body)

    def test_metrics_counters_move(self):
        r = self.gateway.admin("/metrics")
        self.assertEqual(r.status, 200)
        self.assertTrue((r.header("Content-Type") or "").startswith("text/plain"), r)

        def outcome(name):  # SPEC §9: requests by outcome
            return self.gateway.metrics().get('idem_requests_total{outcome="%s"}' % name, 0.0)

        words = ("executed", "replayed", "mismatch", "missing", "invalid", "in_use", "passed_through",
                 "too_large")
        before = {w: outcome(w) for w in words}
        key = new_key()
        self.gateway.request("POST", "/echo", "{}", key=key)
        self.gateway.request("POST", "/echo", "{}", key=key)
        self.gateway.request("POST", "/echo", '{"x":1}', key=key)
        self.gateway.request("POST", "/echo", "{}")
        self.gateway.request("POST", "/echo", "{}", key="short")
        self.gateway.request("GET", "/echo")
        self.gateway.request("POST", "/echo", b"x" * (MAX_BODY + 1), key=new_key())
        slow = new_key()
        t = threading.Thread(target=lambda: self.gateway.request("POST", "/slow?ms=800", "{}", key=slow))
        t.start()
        self.eventually(lambda: self.upstream.executions(slow) == 1, 10)
        self.gateway.request("POST", "/slow?ms=800", "{}", key=slow)
        t.join(30)
        after = {w: outcome(w) for w in words}
        for w in words:
            self.assertGreater(after[w], before[w], 'idem_requests_total{outcome="%s"} did not move' % w)
        text = self.gateway.admin("/metrics").body.decode()
        for family in ("idem_store_call_duration_seconds_bucket", "idem_upstream_duration_seconds_bucket",
                       "idem_lease_takeovers_total", "idem_requests_in_flight", "idem_reaper_deleted_total"):
            self.assertIn(family, text)


if __name__ == "__main__":
    harness.main()
