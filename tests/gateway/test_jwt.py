#!/usr/bin/env python3
"""[tenant] from = "jwt" through the real gateway (issue 22): the tenant is the verified claims of
the bearer token, so a retry with a refreshed token replays, another subject is another tenant,
and every token that would not be accepted now is refused with 401 before anything is claimed,
forwarded or replayed. Also the namespaces of header, credential-hash and JWT tenants (SPEC §12).

Tokens are made by the test itself (jwt_tokens.py: the openssl command and the standard library).

    python3 test_jwt.py --gateway PATH --upstream-bin PATH [--store memory|sqlite]
"""

import hashlib
import json
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import GatewayTestCase, RawClient, new_key, run_concurrently  # noqa: E402
from jwt_tokens import KeyPair, claims, hs256, unsigned, write_jwks  # noqa: E402

HS_SECRET = b"test-hs256-secret-0123456789abcdef-0123456789"


def config(workdir, extra=""):
    return """
max_header = "64KiB"
log_level = "info"

[idempotency]
retention = "1h"
lease = "60s"

[tenant]
from = "jwt"
claims = ["iss", "sub"]
keys = "%(jwks)s"
algorithms = ["RS256", "ES256"]
audience = "payments-api"
issuer = "https://auth.example"
leeway = "60s"

[[route]]
method = "POST"
path = "/echo"

[[route]]
method = "POST"
path = "/echo/optional"
required = false

# The same claims, verified with an HMAC secret instead (a route's own tenant table).
[[route]]
method = "POST"
path = "/echo/hs"
tenant.from = "jwt"
tenant.secret_file = "%(secret)s"
tenant.claims = ["iss", "sub"]

# Tenants from a header and from a credential hash, beside the JWT ones, in one store.
[[route]]
method = "POST"
path = "/echo/header"
tenant.header = "X-Tenant-Id"

[[route]]
method = "POST"
path = "/echo/credential"
tenant.from = "authorization"
%(extra)s
""" % {"jwks": os.path.join(workdir, "jwks.json"), "secret": os.path.join(workdir, "hs256.key"), "extra": extra}


def sha256_hex(text):
    return hashlib.sha256(text.encode()).hexdigest()


class JwtTestCase(GatewayTestCase):
    CONFIG = None  # started once the keys exist

    @classmethod
    def start_class_processes(cls):
        cls.rsa = KeyPair.rsa(cls.workdir, "rsa-1")
        cls.ec = KeyPair.ec(cls.workdir, "ec-1")
        cls.rsa_new = KeyPair.rsa(cls.workdir, "rsa-2")  # not in the set until a rotation
        write_jwks(os.path.join(cls.workdir, "jwks.json"), [cls.rsa.jwk(), cls.ec.jwk()])
        secret = os.path.join(cls.workdir, "hs256.key")
        with open(secret, "wb") as f:
            f.write(HS_SECRET + b"\n")
        os.chmod(secret, 0o600)
        cls.gateway = cls.start_gateway(config(cls.workdir))

    def post(self, path, token=None, key=None, body='{"amount":100}', headers=()):
        hs = [("Content-Type", "application/json")] + list(headers)
        if token is not None:
            hs.append(("Authorization", "Bearer " + token))
        return self.gateway.request("POST", path, body, hs, key=key)

    def assertUnauthorized(self, r, code):
        doc = self.assertProblem(r, 401, code)
        www = r.header("WWW-Authenticate") or ""
        self.assertTrue(www.startswith("Bearer"), r)
        if code == "token_missing":
            self.assertEqual(www, "Bearer", r)
        else:
            self.assertIn('error="invalid_token"', www, r)
        self.assertIsNone(r.header("Idempotent-Replayed"), r)
        return doc


class TokenRefreshTest(JwtTestCase):
    def test_a_refreshed_token_replays(self):
        """The issue's reproduction: two bearer tokens of one client, one key, one body. Before,
        two executions; now the second is a replay."""
        key = new_key()
        first = self.post("/echo", self.rsa.token("alice", jti="first"), key)
        self.assertExecuted(first)
        refreshed = self.post("/echo", self.rsa.token("alice", ttl=3600, jti="second"), key)
        self.assertReplayOf(refreshed, first)
        # Another algorithm and key of the same issuer, the same subject: the same client.
        by_ec = self.post("/echo", self.ec.token("alice", jti="third"), key)
        self.assertReplayOf(by_ec, first)
        self.assertEqual(self.upstream.executions(key), 1)

    def test_two_subjects_are_two_tenants(self):
        key = new_key()
        alice = self.post("/echo", self.rsa.token("alice"), key)
        bob = self.post("/echo", self.rsa.token("bob"), key)
        self.assertExecuted(alice)
        self.assertExecuted(bob)
        self.assertNotEqual(alice.execution_id, bob.execution_id)
        again_alice = self.post("/echo", self.ec.token("alice"), key)
        again_bob = self.post("/echo", self.ec.token("bob"), key)
        self.assertReplayOf(again_alice, alice)
        self.assertReplayOf(again_bob, bob)
        self.assertNotEqual(again_alice.body, again_bob.body)
        self.assertEqual(self.upstream.executions(key), 2)

    def test_the_issuer_is_part_of_the_tenant(self):
        """claims = ["iss", "sub"]: a route whose tokens come from another issuer (the HMAC route
        accepts any iss) keeps the same sub of another issuer apart."""
        key = new_key()
        ours = self.post("/echo/hs", hs256({"alg": "HS256"}, claims("alice"), HS_SECRET), key)
        theirs = self.post("/echo/hs", hs256({"alg": "HS256"}, claims("alice", iss="https://other.example"),
                                             HS_SECRET), key)
        self.assertExecuted(ours)
        self.assertExecuted(theirs)
        self.assertEqual(self.upstream.executions(key), 2)

    def test_an_hs256_route(self):
        key = new_key()
        first = self.post("/echo/hs", hs256({"alg": "HS256", "typ": "JWT"}, claims("carol"), HS_SECRET), key)
        self.assertExecuted(first)
        again = self.post("/echo/hs", hs256({"alg": "HS256"}, claims("carol", jti="x"), HS_SECRET), key)
        self.assertReplayOf(again, first)
        # An RS256 token on the HMAC route: its algorithm is not in that route's list.
        r = self.post("/echo/hs", self.rsa.token("carol"), new_key())
        self.assertUnauthorized(r, "token_invalid")
        # The HMAC secret's file ends with a newline, which is not part of the secret.
        r = self.post("/echo/hs", hs256({"alg": "HS256"}, claims("carol"), HS_SECRET + b"\n"), new_key())
        self.assertUnauthorized(r, "token_invalid")

    def test_a_request_without_a_key_needs_no_token(self):
        """Without a key nothing is claimed: the optional route passes it through, the required
        one refuses it for the key; the upstream authenticates it as always."""
        r = self.post("/echo/optional", None, None)
        self.assertEqual(r.status, 200, r)
        self.assertProblem(self.post("/echo", None, None), 400, "idempotency_key_missing")
        # With a key, the optional route needs the token like any other.
        self.assertUnauthorized(self.post("/echo/optional", None, new_key()), "token_missing")


class RefusalTest(JwtTestCase):
    def refusals(self):
        now = int(time.time())
        rs = {"alg": "RS256", "typ": "JWT", "kid": "rsa-1"}
        forged = KeyPair.rsa(self.workdir, "rsa-1", name="forger")  # claims the set's kid
        return [
            ("forged signature", forged.token("alice"), "token_invalid"),
            ("payload swapped", self._swap_payload(self.rsa.token("alice"), claims("admin")), "token_invalid"),
            ("alg none", unsigned({"alg": "none", "typ": "JWT"}, claims("alice")), "token_invalid"),
            ("alg none with a signature", unsigned({"alg": "none"}, claims("alice"), b"sig"), "token_invalid"),
            ("RS256 key as an HS256 secret (PEM)",
             hs256({"alg": "HS256", "kid": "rsa-1"}, claims("alice"), self.rsa.public_pem), "token_invalid"),
            ("RS256 key as an HS256 secret (DER)",
             hs256({"alg": "HS256", "kid": "rsa-1"}, claims("alice"), self.rsa.public_der), "token_invalid"),
            ("wrong aud", self.rsa.sign(rs, claims("alice", aud="other-api")), "token_invalid"),
            ("wrong iss", self.rsa.sign(rs, claims("alice", iss="https://evil.example")), "token_invalid"),
            ("expired past the leeway", self.rsa.sign(rs, claims("alice", now=now - 1000, ttl=900)), "token_expired"),
            ("not yet valid", self.rsa.sign(rs, claims("alice", nbf=now + 300)), "token_invalid"),
            ("no exp", self.rsa.sign(rs, {"iss": "https://auth.example", "sub": "alice", "aud": "payments-api"}),
             "token_invalid"),
            ("no sub", self.rsa.sign(rs, {"iss": "https://auth.example", "aud": "payments-api", "exp": now + 600}),
             "token_invalid"),
            ("kid not in the set", self.rsa_new.token("alice"), "token_invalid"),
            ("malformed", "not-a-jwt", "token_invalid"),
            ("malformed parts", "a.b.c", "token_invalid"),
            ("a JWE", "a.b.c.d.e", "token_invalid"),
        ]

    @staticmethod
    def _swap_payload(token, new_claims):
        h, _, s = token.split(".")
        from jwt_tokens import b64url
        return h + "." + b64url(json.dumps(new_claims).encode()) + "." + s

    def test_every_refused_token_gets_401_and_nothing_is_forwarded(self):
        total = self.upstream.total()
        for name, token, code in self.refusals():
            with self.subTest(name):
                key = new_key()
                doc = self.assertUnauthorized(self.post("/echo", token, key), code)
                self.assertNotIn(token, json.dumps(doc), "the token echoed in the problem")
                self.assertEqual(self.upstream.executions(key), 0)
        self.assertEqual(self.upstream.total(), total, "a refused request reached the upstream")

    def test_no_token_and_other_schemes(self):
        key = new_key()
        self.assertUnauthorized(self.post("/echo", None, key), "token_missing")
        r = self.gateway.request("POST", "/echo", "{}", [("Authorization", "Basic dXNlcjpwYXNz")], key=key)
        self.assertUnauthorized(r, "token_missing")
        r = self.gateway.request("POST", "/echo", "{}", [("Authorization", "Bearer")], key=key)
        self.assertUnauthorized(r, "token_invalid")
        self.assertEqual(self.upstream.executions(key), 0)

    def test_a_stored_response_is_never_replayed_to_a_token_refused_now(self):
        key = new_key()
        first = self.post("/echo", self.rsa.token("alice"), key)
        self.assertExecuted(first)
        now = int(time.time())
        expired = self.rsa.sign({"alg": "RS256", "kid": "rsa-1"}, claims("alice", now=now - 1000, ttl=900))
        self.assertUnauthorized(self.post("/echo", expired, key), "token_expired")
        forged = KeyPair.ec(self.workdir, "ec-1", name="ec-forger").token("alice")
        self.assertUnauthorized(self.post("/echo", forged, key), "token_invalid")
        self.assertReplayOf(self.post("/echo", self.rsa.token("alice"), key), first)
        self.assertEqual(self.upstream.executions(key), 1)

    def test_two_authorization_headers_are_ambiguous(self):
        key = new_key()
        r = self.gateway.request("POST", "/echo", "{}", [("Authorization", "Bearer " + self.rsa.token("alice")),
                                                         ("Authorization", "Bearer " + self.rsa.token("bob"))], key=key)
        self.assertProblem(r, 400, "tenant_ambiguous")
        self.assertEqual(self.upstream.executions(key), 0)

    def test_hostile_authorization_headers(self):
        """Tokens above 16 KiB, a 1 MB Authorization header, binary garbage: a clear answer, and
        the gateway goes on serving."""
        key = new_key()
        long_token = self.post("/echo", self.rsa.token("alice", pad="x" * 30000), key)
        doc = self.assertUnauthorized(long_token, "token_invalid")
        self.assertIn("longer than 16384 bytes", doc["detail"])
        c = RawClient(self.gateway.port)
        try:
            c.send(b"POST /echo HTTP/1.1\r\nHost: x\r\nIdempotency-Key: " + key.encode() +
                   b"\r\nAuthorization: Bearer " + b"A" * (1024 * 1024) + b"\r\nContent-Length: 2\r\n\r\n{}")
            huge = c.read_response(timeout=10)
        except (BrokenPipeError, ConnectionResetError):
            huge = c.read_response(timeout=10)  # answered and closed while the rest was being sent
        finally:
            c.close()
        self.assertIsNotNone(huge)
        self.assertProblem(huge, 431, "request_header_too_large")
        garbage = bytes(range(1, 9)) + bytes(range(0x80, 0x100))
        c = RawClient(self.gateway.port)
        try:
            c.send(b"POST /echo HTTP/1.1\r\nHost: x\r\nIdempotency-Key: " + key.encode() +
                   b"\r\nAuthorization: Bearer " + garbage + b"\r\nContent-Length: 2\r\n\r\n{}")
            r = c.read_response(timeout=10)
        finally:
            c.close()
        self.assertIsNotNone(r)
        self.assertIn(r.status, (400, 401), r)  # the HTTP parser may refuse control bytes first
        many_dots = self.post("/echo", "." * 5000, key)
        self.assertUnauthorized(many_dots, "token_invalid")
        self.assertEqual(self.upstream.executions(key), 0)
        self.assertExecuted(self.post("/echo", self.rsa.token("alice"), new_key()))

    def test_refusals_are_counted_and_logged_without_the_token(self):
        before = self.gateway.metrics().get('idem_requests_total{outcome="unauthorized"}', 0)
        token = KeyPair.rsa(self.workdir, "rsa-1", name="forger-2").token("mallory")
        key = new_key()
        self.assertUnauthorized(self.post("/echo", token, key), "token_invalid")
        after = self.gateway.metrics()['idem_requests_total{outcome="unauthorized"}']
        self.assertEqual(after, before + 1)

        def logged():
            return ('key="%s"' % key) in self.gateway.process.log()
        self.eventually(logged, timeout=5, msg="(the refusal's key line)")
        line = [l for l in self.gateway.process.log().splitlines() if ('key="%s"' % key) in l][0]
        self.assertIn("verdict=token_invalid", line)
        self.assertIn("status=401", line)
        self.assertIn("signature", line)
        log = self.gateway.process.log()
        self.assertNotIn(token, log)
        self.assertNotIn(token.split(".")[2], log)
        self.assertNotIn("mallory", log)
        for k in (self.rsa, self.ec):
            for v in k.jwk().values():
                if len(v) > 20:
                    self.assertNotIn(v, log, "key material in the log")


class NamespaceTest(JwtTestCase):
    """SPEC §12: a header value cannot name a JWT or credential-hash tenant."""

    def test_header_values_cannot_reach_jwt_or_credential_tenants(self):
        key = new_key()
        body = '{"amount":100}'
        # The tenants a JWT client and an API-key client get (recomputed as the docs say).
        alice = self.post("/echo", self.rsa.token("alice"), key, body)
        self.assertExecuted(alice)
        jwt_tenant = "jwt:" + sha256_hex('{"iss":"https://auth.example","sub":"alice"}')
        credential = "Bearer sk_live_0123456789"
        by_credential = self.gateway.request("POST", "/echo/credential", body,
                                             [("Content-Type", "application/json"), ("Authorization", credential)],
                                             key=key)
        self.assertExecuted(by_credential)
        credential_tenant = "auth:" + sha256_hex(credential)
        # A client setting the tenant header to those names, with the same key: were the tenants
        # one, the different path would make this a 422 mismatch (or a replay); it executes.
        for forged in (jwt_tenant, credential_tenant, jwt_tenant.upper(), "sha256:" + sha256_hex("x y")):
            with self.subTest(forged):
                r = self.gateway.request("POST", "/echo/header", body,
                                         [("Content-Type", "application/json"), ("X-Tenant-Id", forged)], key=key)
                self.assertExecuted(r)
        self.assertEqual(self.upstream.executions(key), 6)

    def test_the_documented_jwt_tenant_formula(self):
        """docs/gateway.md: the tenant is "jwt:" + SHA-256 of the RFC 8785 form of the claims,
        so an operator can find a client's keys. The SQLite store shows what was stored; a
        header route given that value gets a tenant of its own."""
        key = new_key()
        first = self.post("/echo", self.rsa.token("dave"), key)
        self.assertExecuted(first)
        expected = "jwt:" + sha256_hex('{"iss":"https://auth.example","sub":"dave"}')
        if harness.ARGS.store == "sqlite":
            import sqlite3
            db = sqlite3.connect("file:%s?mode=ro" % os.path.join(self.workdir, "idem.db"), uri=True)
            try:
                tenants = [row[0] for row in db.execute("SELECT tenant_id FROM idempotency_keys WHERE key = ?", (key,))]
            finally:
                db.close()
            self.assertEqual(tenants, [expected])
        tampered = self.gateway.request("POST", "/echo/header", "{}", [("X-Tenant-Id", expected)], key=key)
        self.assertExecuted(tampered)
        self.assertReplayOf(self.post("/echo", self.ec.token("dave"), key), first)


class KeyRotationTest(JwtTestCase):
    def test_a_kid_not_in_the_set_is_accepted_once_the_set_has_it(self):
        key = new_key()
        before = self.post("/echo", self.rsa.token("erin"), key)
        self.assertExecuted(before)
        r = self.post("/echo", self.rsa_new.token("erin"), key)
        self.assertUnauthorized(r, "token_invalid")
        self.assertIn('kid "rsa-2" is not in the key set', r.json()["detail"])
        # The provider rotates: the set lists the old and the new key, and a reload (SIGHUP) reads
        # it again: no restart, nothing forgotten.
        write_jwks(os.path.join(self.workdir, "jwks.json"), [self.rsa.jwk(), self.rsa_new.jwk(), self.ec.jwk()])
        reloads = self.gateway.process.log().count("reload: configuration ")
        self.gateway.process.signal(signal.SIGHUP)
        self.eventually(lambda: self.gateway.process.log().count("reload: configuration ") > reloads, 10,
                        msg="the reload was not put in force")
        after = self.post("/echo", self.rsa_new.token("erin"), key)
        # The client's retry with a token of the new key replays, on either store.
        self.assertReplayOf(after, before)
        self.assertEqual(self.upstream.executions(key), 1)
        self.assertEqual(self.post("/echo", self.rsa.token("erin"), new_key()).status, 200)
        # And a restart reads the set too (the record survives it on a durable store).
        self.gateway.restart()
        self.assertEqual(self.post("/echo", self.rsa_new.token("erin"), new_key()).status, 200)


class ConcurrencyTest(JwtTestCase):
    def test_200_fresh_tokens_of_one_subject_and_one_key_execute_once(self):
        key = new_key()
        tokens = [self.rsa.token("frank", jti="t%d" % i) for i in range(200)]
        self.assertEqual(len(set(tokens)), 200)
        results = run_concurrently(200, lambda i: self.post("/echo", tokens[i], key), timeout=120)
        errors = [r for r in results if not isinstance(r, harness.Response)]
        self.assertEqual(errors, [])
        statuses = sorted({r.status for r in results})
        self.assertTrue(set(statuses) <= {200, 409}, statuses)
        executed = [r for r in results if r.status == 200 and not r.replayed]
        self.assertEqual(len(executed), 1, [r.status for r in results])
        for r in results:
            if r.status == 200:
                self.assertEqual(r.execution_id, executed[0].execution_id)
            else:
                self.assertProblem(r, 409, "idempotency_key_in_use")
        self.assertEqual(self.upstream.executions(key), 1)
        self.assertReplayOf(self.post("/echo", self.ec.token("frank"), key), executed[0])


class BadConfigTest(GatewayTestCase):
    CONFIG = None

    def start(self, toml):
        path = os.path.join(self.workdir, "bad.%d.toml" % time.monotonic_ns())
        with open(path, "w") as f:
            f.write(toml)
        p = subprocess.run([harness.ARGS.gateway, "--config", path, "--listen", "127.0.0.1:0", "--admin-listen",
                            "off", "--store", "memory:"], stdin=subprocess.DEVNULL, capture_output=True,
                           timeout=30)
        return p.returncode, p.stderr.decode("utf-8", "replace")

    def test_bad_tenant_tables_exit_2_with_one_line(self):
        rsa = KeyPair.rsa(self.workdir, "cfg-rsa")
        garbage = os.path.join(self.workdir, "garbage.json")
        with open(garbage, "wb") as f:
            f.write(os.urandom(4096))
        private = rsa.private_path
        with open(private, "rb") as f:
            private_pem = f.read().decode()
        short_secret = os.path.join(self.workdir, "short.key")
        with open(short_secret, "w") as f:
            f.write("short-secret\n")
        unsupported = os.path.join(self.workdir, "okp.json")
        write_jwks(unsupported, [{"kty": "OKP", "crv": "Ed25519", "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo",
                                  "kid": "ed"}])
        cases = [
            ('keys = "%s/missing.json"' % self.workdir, "cannot read the file"),
            ('keys = "%s"' % garbage, "neither a JWK Set (JSON) nor PEM"),
            ('keys = "%s"' % private, "is a private key"),
            ('keys = "%s"' % unsupported, "no key can verify"),
            ('keys = "%s"\nalgorithms = ["none"]' % rsa.public_path, 'never "none"'),
            ('keys = "%s"\nalgorithms = ["HS256"]' % rsa.public_path, "HS256 is an HMAC"),
            ('secret_file = "%s"' % short_secret, "needs at least 32"),
            ('secret_file = "%s"' % rsa.private_path, "larger than 512 bytes"),
            ("", "needs keys"),
        ]
        for table, expected in cases:
            with self.subTest(table):
                code, err = self.start('[tenant]\nfrom = "jwt"\n' + table + "\n")
                self.assertEqual(code, 2, err)
                lines = err.strip().splitlines()
                self.assertEqual(len(lines), 1, err)
                self.assertTrue(lines[0].startswith("idem-gateway: "), err)
                self.assertIn("[tenant]", lines[0])
                self.assertIn(expected, lines[0])
                for chunk in private_pem.splitlines()[1:3]:
                    self.assertNotIn(chunk, err, "key material in the error")

    def test_skipped_keys_are_warnings_at_start(self):
        rsa = KeyPair.rsa(self.workdir, "warn-rsa")
        path = os.path.join(self.workdir, "mixed.json")
        write_jwks(path, [{"kty": "OKP", "crv": "Ed25519", "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo",
                           "kid": "ed"}, rsa.jwk()])
        g = self.start_gateway('[tenant]\nfrom = "jwt"\nkeys = "%s"\n' % path)
        self.eventually(lambda: 'key #1 (kid "ed")' in g.process.log(), timeout=5)
        self.assertIn("skipped", g.process.log())
        self.assertNotIn(rsa.jwk()["n"][:40], g.process.log())


if __name__ == "__main__":
    harness.main()
