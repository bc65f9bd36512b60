#!/usr/bin/env python3
"""TLS on both sides of idem-gateway (docs/gateway.md, TLS), with a test CA and certificates made
by the openssl command at test time (tests/common/tls_certs.py):

- the [tls] listener: the tour's three answers (executed, replayed, mismatch) with Python's client,
  curl and the C++ client (idemctl send); plain HTTP on the TLS port answered 400; a TLS 1.1
  handshake refused; sessions resumed; bad certificate and key files refused at start with one line
  (a passphrase never in any output);
- client certificates: refused when required, two certificates are two tenants, a renewed
  certificate with the same identity replays;
- certificate rotation by SIGHUP under wrk load on TLS keep-alive connections: 0 failed requests;
  a bad new certificate keeps the old one;
- an https:// upstream: replay and mismatch as over http://; an expired certificate, a wrong host
  name and an unknown CA answered 502 with the reason in the log and nothing executed, the same
  key executing once when the upstream is fixed; mutual TLS to the upstream; sessions resumed.

    python3 test_tls.py --gateway PATH --upstream-bin PATH [--store memory|sqlite]
"""

import http.client
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import GatewayTestCase, Process, Response, free_port, new_key, request  # noqa: E402
from tls_certs import PASSPHRASE, make_test_pki  # noqa: E402  (tests/common)
from tls_terminator import TlsTerminator  # noqa: E402  (tests/common)

HERE = os.path.dirname(os.path.abspath(__file__))


def client_context(pki, cert=None):
    ctx = ssl.create_default_context(cafile=pki["ca"][0])
    if cert:
        ctx.load_cert_chain(*pki[cert])
    return ctx


def https(port, method, path, pki, body=None, headers=(), key=None, cert=None, context=None, timeout=15.0):
    """One request over a new TLS connection to localhost:port; a harness Response."""
    ctx = context or client_context(pki, cert)
    conn = http.client.HTTPSConnection("localhost", port, context=ctx, timeout=timeout)
    try:
        hs = dict(headers)
        if key is not None:
            hs["Idempotency-Key"] = key
        conn.request(method, path, body=body, headers=hs)
        r = conn.getresponse()
        return Response(r.status, r.getheaders(), r.read())
    finally:
        conn.close()


class TlsGateway:
    """idem-gateway started from a whole configuration file (no --listen/--upstream flags, so a
    reload can change what the file says), ready when /healthz answers."""

    def __init__(self, workdir, config_body, store, plain=True):
        self.workdir = workdir
        self.port = free_port()
        self.tls_port = free_port()
        self.admin_port = free_port()
        self.store = store
        self.plain = plain
        self.config_path = os.path.join(workdir, "tls-gateway.%d.toml" % self.tls_port)
        self.write(config_body)
        self.process = Process("gateway", [harness.ARGS.gateway, "--config", self.config_path], workdir)
        deadline = time.monotonic() + harness.STARTUP_TIMEOUT
        while True:
            if not self.process.alive():
                raise RuntimeError("idem-gateway exited:\n" + self.process.log())
            try:
                if request(self.admin_port, "GET", "/healthz", timeout=1.0).status == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("idem-gateway did not become ready:\n" + self.process.log())
            time.sleep(0.02)

    def write(self, body):
        head = 'listen = "%s"\nadmin_listen = "127.0.0.1:%d"\nstore = "%s"\n' % (
            "127.0.0.1:%d" % self.port if self.plain else "off", self.admin_port, self.store)
        tmp = self.config_path + ".tmp"
        with open(tmp, "w") as f:
            f.write(head + body.replace("TLS_PORT", str(self.tls_port)))
        os.replace(tmp, self.config_path)

    def reload(self, body, timeout=10.0):
        """Writes the new file, sends SIGHUP, and returns once the reload's line is in the log
        (True: in force; False: refused, the running configuration kept)."""
        before = self.process.log().count("reload")
        self.write(body)
        self.process.signal(signal.SIGHUP)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            log = self.process.log()
            lines = [l for l in log.splitlines() if "reload" in l][before:]
            if any("in force" in l for l in lines):
                return True
            if any("reload failed" in l for l in lines):
                return False
            time.sleep(0.02)
        raise AssertionError("no reload line within %ss:\n%s" % (timeout, self.process.log()[-2000:]))

    def metrics(self):
        return harness.parse_metrics(request(self.admin_port, "GET", "/metrics").body.decode())

    def stop(self):
        return self.process.stop()


def tls_section(pki, extra=""):
    return '[tls]\nlisten = "127.0.0.1:TLS_PORT"\ncert_file = "%s"\nkey_file = "%s"\n%s' % (
        pki["server"][0], pki["server"][1], extra)


class TlsTestCase(GatewayTestCase):
    CONFIG = None

    @classmethod
    def start_class_processes(cls):
        cls.pki = make_test_pki(os.path.join(cls.workdir, "pki"))

    @classmethod
    def tls_gateway(cls, body, store=None, plain=True):
        g = TlsGateway(cls.workdir, body, store or cls.store_url("tls-%d.db" % free_port()), plain=plain)
        cls._owned.append(g)
        return g


class Listener(TlsTestCase):
    @classmethod
    def start_class_processes(cls):
        super().start_class_processes()
        pki = cls.pki
        cls.gw = cls.tls_gateway('upstream = "%s"\n' % cls.upstream.url + tls_section(pki, (
            'client_certificates = "optional"\nclient_ca_file = "%s"\n\n'
            '[[route]]\nmethod = "POST"\npath = "/echo/cert/*"\ntenant.from = "client_cert"\ntenant.identity = "uri"\n'
        ) % pki["ca"][0]))

    def test_the_tour_over_tls(self):
        key = new_key("tour")
        first = https(self.gw.tls_port, "POST", "/echo/charge", self.pki, b'{"amount":100}', key=key)
        self.assertExecuted(first)
        self.assertEqual(dict(first.json()["headers"]).get("X-Forwarded-Proto"), "https")
        again = https(self.gw.tls_port, "POST", "/echo/charge", self.pki, b'{"amount":100}', key=key)
        self.assertReplayOf(again, first)
        other = https(self.gw.tls_port, "POST", "/echo/charge", self.pki, b'{"amount":200}', key=key)
        self.assertProblem(other, 422, "idempotency_key_mismatch")
        self.assertEqual(self.upstream.executions(key), 1)
        # The plain listener serves beside it, the same records.
        plain = request(self.gw.port, "POST", "/echo/charge", b'{"amount":100}', [("Idempotency-Key", key)])
        self.assertReplayOf(plain, first)

    def test_curl_and_the_cpp_client(self):
        curl = shutil.which("curl")
        self.assertIsNotNone(curl, "curl is not installed (scripts/deps installs it)")
        key = new_key("curl")
        url = "https://localhost:%d/echo/curl" % self.gw.tls_port
        out = subprocess.run([curl, "-sS", "--cacert", self.pki["ca"][0], "-X", "POST", "-d", "x=1", "-H",
                              "Idempotency-Key: " + key, "-D", "-", url], capture_output=True, text=True, timeout=30)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("HTTP/1.1 200", out.stdout)
        first_id = re.search(r"X-Execution-Id: (\S+)", out.stdout).group(1)
        idemctl = os.path.normpath(os.path.join(os.path.dirname(harness.ARGS.gateway), "..", "cli", "idemctl"))
        sent = subprocess.run([idemctl, "send", url, "--key", key, "-d", "x=1", "-H",
                               "Content-Type: application/x-www-form-urlencoded", "--cacert", self.pki["ca"][0],
                               "--json"], capture_output=True, text=True, timeout=60)
        self.assertEqual(sent.returncode, 0, sent.stdout + sent.stderr)
        self.assertIn(first_id, sent.stdout)  # the C++ client got the replay of curl's execution
        self.assertEqual(self.upstream.executions(key), 1)
        # Without the test CA the C++ client refuses the certificate and sends nothing.
        refused = subprocess.run([idemctl, "send", url, "--key", new_key("nocert"), "-d", "x", "--attempts", "1"],
                                 capture_output=True, text=True, timeout=60)
        self.assertNotEqual(refused.returncode, 0)
        self.assertIn("certificate", (refused.stdout + refused.stderr).lower())

    def test_plain_http_on_the_tls_port_is_answered_400(self):
        with socket.create_connection(("127.0.0.1", self.gw.tls_port), timeout=5) as s:
            s.sendall(b"POST /echo/x HTTP/1.1\r\nHost: x\r\nIdempotency-Key: " + new_key().encode() +
                      b"\r\nContent-Length: 0\r\n\r\n")
            data = b""
            while True:
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
        self.assertTrue(data.startswith(b"HTTP/1.1 400"), data)
        self.assertIn(b"This port speaks HTTPS", data)
        self.assertExecuted(https(self.gw.tls_port, "POST", "/echo/after", self.pki, b"x", key=new_key()))

    def test_tls_1_1_is_refused(self):
        def s_client(*version):
            return subprocess.run(["openssl", "s_client", "-connect", "127.0.0.1:%d" % self.gw.tls_port,
                                   "-servername", "localhost", "-CAfile", self.pki["ca"][0], "-cipher",
                                   "DEFAULT:@SECLEVEL=0", *version], input="", capture_output=True, text=True,
                                  timeout=30)
        old = s_client("-tls1_1")
        self.assertNotIn("Cipher is ECDHE", old.stdout)
        self.assertRegex(old.stdout + old.stderr, r"(?i)alert protocol version|no protocols available|unsupported protocol")
        good = s_client("-tls1_2")
        self.assertIn("Protocol  : TLSv1.2", good.stdout)
        self.assertIn("Verify return code: 0 (ok)", good.stdout)
        # ALPN: http/1.1 when offered; nothing the gateway does not speak.
        alpn = subprocess.run(["openssl", "s_client", "-connect", "127.0.0.1:%d" % self.gw.tls_port, "-alpn",
                               "h2,http/1.1", "-CAfile", self.pki["ca"][0]], input="", capture_output=True,
                              text=True, timeout=30)
        self.assertIn("ALPN protocol: http/1.1", alpn.stdout)

    def test_sessions_resume(self):
        # TLS 1.2 without tickets: resumed by session id, from the gateway's session cache. The
        # gateway ends the first connection (Connection: close) without a TLS shutdown, after
        # which OpenSSL would drop the session from that cache unless told the close was clean.
        ctx = client_context(self.pki)
        ctx.maximum_version = ssl.TLSVersion.TLSv1_2
        ctx.options |= ssl.OP_NO_TICKET

        def get(session=None):
            sock = ctx.wrap_socket(socket.create_connection(("127.0.0.1", self.gw.tls_port), timeout=10),
                                   server_hostname="localhost", session=session)
            sock.sendall(b"GET /counts HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            data = b""
            while True:
                try:
                    chunk = sock.recv(65536)
                except ssl.SSLEOFError:  # the gateway closed without close_notify, as HTTP allows
                    break
                if not chunk:
                    break
                data += chunk
            self.assertTrue(data.startswith(b"HTTP/1.1 200"), data[:200])
            reused, session = sock.session_reused, sock.session
            try:
                sock.unwrap()  # our side shut down cleanly: the client keeps the session resumable
            except (ssl.SSLError, OSError):
                pass
            sock.close()
            return reused, session

        before = self.gw.metrics().get('idem_tls_handshakes_total{result="resumed"}', 0)
        reused, session = get()
        self.assertFalse(reused)
        self.eventually(lambda: self.gw.metrics().get("idem_connections_open", 1) == 0, 10)
        reused, _ = get(session)
        self.assertTrue(reused, "the session was not resumed by its id")
        after = self.gw.metrics().get('idem_tls_handshakes_total{result="resumed"}', 0)
        self.assertGreater(after, before)

    def test_client_certificates_are_tenants(self):
        key = new_key("mtls")
        a = https(self.gw.tls_port, "POST", "/echo/cert/pay", self.pki, b"{}", key=key, cert="client_a")
        self.assertExecuted(a)
        self.assertEqual(dict(a.json()["headers"]).get("Idempotency-Tenant"), "cert:spiffe://idem.test/payments-a")
        # Another client, the same key: its own tenant, its own execution.
        b = https(self.gw.tls_port, "POST", "/echo/cert/pay", self.pki, b"{}", key=key, cert="client_b")
        self.assertExecuted(b)
        self.assertNotEqual(b.execution_id, a.execution_id)
        # The same client with a renewed certificate (new key, same identity): a replay.
        renewed = https(self.gw.tls_port, "POST", "/echo/cert/pay", self.pki, b"{}", key=key, cert="client_a_renewed")
        self.assertReplayOf(renewed, a)
        self.assertEqual(self.upstream.executions(key), 2)
        # No certificate: refused before anything is claimed; a header cannot stand in for one.
        none = https(self.gw.tls_port, "POST", "/echo/cert/pay", self.pki, b"{}", key=new_key(),
                     headers={"X-Tenant-Id": "cert:spiffe://idem.test/payments-a"})
        self.assertProblem(none, 401, "client_certificate_missing")
        # The plain listener has no certificate either.
        plain = request(self.gw.port, "POST", "/echo/cert/pay", b"{}", [("Idempotency-Key", key)])
        self.assertProblem(plain, 401, "client_certificate_missing")
        # A certificate from an unknown CA fails the handshake, even where one is optional.
        with self.assertRaises((ssl.SSLError, ConnectionError, OSError)):
            ctx = client_context(self.pki)
            ctx.load_cert_chain(*self.pki["unknown_ca"])
            https(self.gw.tls_port, "POST", "/echo/cert/pay", self.pki, b"{}", key=new_key(), context=ctx)


class RequiredClientCertificates(TlsTestCase):
    def test_a_client_without_a_certificate_is_refused(self):
        gw = self.tls_gateway('upstream = "%s"\n' % self.upstream.url + tls_section(self.pki, (
            'client_certificates = "required"\nclient_ca_file = "%s"\n[tenant]\nfrom = "client_cert"\n'
            'identity = "common_name"\n') % self.pki["ca"][0]), plain=False)
        key = new_key("req")
        with self.assertRaises((ssl.SSLError, ConnectionError, OSError)):
            https(gw.tls_port, "POST", "/echo/req", self.pki, b"{}", key=key)
        ok = https(gw.tls_port, "POST", "/echo/req", self.pki, b"{}", key=key, cert="client_b")
        self.assertExecuted(ok)
        self.assertEqual(dict(ok.json()["headers"]).get("Idempotency-Tenant"), "cert:payments-b")
        self.assertEqual(self.upstream.executions(key), 1)
        self.assertFalse(can_connect_plain(gw.port), "listen = \"off\" still listens")


def can_connect_plain(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


class BadFiles(TlsTestCase):
    def start_expecting_failure(self, body):
        path = os.path.join(self.workdir, "bad-%d.toml" % free_port())
        with open(path, "w") as f:
            f.write('listen = "127.0.0.1:%d"\nadmin_listen = "off"\nstore = "memory:"\n' % free_port() +
                    body.replace("TLS_PORT", str(free_port())))
        out = subprocess.run([harness.ARGS.gateway, "--config", path], capture_output=True, text=True, timeout=30)
        self.assertEqual(out.returncode, 2, out.stdout + out.stderr)
        return out.stdout + out.stderr

    def copy(self, name, mode):
        cert, key = self.pki[name]
        dst = os.path.join(self.workdir, "copy-%d.key" % free_port())
        shutil.copy(key, dst)
        os.chmod(dst, mode)
        return cert, dst

    def test_bad_files_stop_the_start_with_one_line(self):
        pki = self.pki
        cert, readable = self.copy("server", 0o644)
        out = self.start_expecting_failure('[tls]\nlisten = "127.0.0.1:TLS_PORT"\ncert_file = "%s"\nkey_file = "%s"\n'
                                           % (cert, readable))
        self.assertIn("[tls]: key_file", out)
        self.assertIn("other users", out)
        out = self.start_expecting_failure('[tls]\nlisten = "127.0.0.1:TLS_PORT"\ncert_file = "%s"\nkey_file = "%s"\n'
                                           % (pki["server"][0], pki["upstream"][1]))
        self.assertIn("the key does not belong to the certificate", out)
        out = self.start_expecting_failure('[tls]\nlisten = "127.0.0.1:TLS_PORT"\ncert_file = "%s"\nkey_file = "%s"\n'
                                           % (pki["ca"][0] + ".missing", pki["server"][1]))
        self.assertIn("cannot load a PEM certificate chain", out)
        enc_cert, enc_key = pki["encrypted_key"]
        out = self.start_expecting_failure('[tls]\nlisten = "127.0.0.1:TLS_PORT"\ncert_file = "%s"\nkey_file = "%s"\n'
                                           % (enc_cert, enc_key))
        self.assertIn("give key_passphrase_file", out)
        wrong = os.path.join(self.workdir, "wrong.pass")
        with open(wrong, "w") as f:
            f.write("Zq9xW-wrong-passphrase\n")
        os.chmod(wrong, 0o600)
        out = self.start_expecting_failure(
            '[tls]\nlisten = "127.0.0.1:TLS_PORT"\ncert_file = "%s"\nkey_file = "%s"\nkey_passphrase_file = "%s"\n'
            % (enc_cert, enc_key, wrong))
        self.assertIn("does not decrypt it", out)
        self.assertNotIn("Zq9xW", out)

    def test_an_encrypted_key_with_its_passphrase_file(self):
        pass_file = os.path.join(self.workdir, "key.pass")
        with open(pass_file, "w") as f:
            f.write(PASSPHRASE + "\n")
        os.chmod(pass_file, 0o600)
        enc_cert, enc_key = self.pki["encrypted_key"]
        gw = self.tls_gateway('upstream = "%s"\nlog_level = "debug"\n[tls]\nlisten = "127.0.0.1:TLS_PORT"\n'
                              'cert_file = "%s"\nkey_file = "%s"\nkey_passphrase_file = "%s"\n'
                              % (self.upstream.url, enc_cert, enc_key, pass_file))
        self.assertExecuted(https(gw.tls_port, "POST", "/echo/enc", self.pki, b"{}", key=new_key()))
        gw.stop()
        log = gw.process.log()
        self.assertNotIn("Zq9xW", log)  # the passphrase (tests/common/tls_certs.py) never in output
        self.assertNotIn("PRIVATE KEY", log)


class Rotation(TlsTestCase):
    def test_sighup_rotates_the_certificate_under_load(self):
        wrk = shutil.which("wrk")
        self.assertIsNotNone(wrk, "wrk is not installed (scripts/deps installs it)")
        cert = os.path.join(self.workdir, "live.pem")
        key = os.path.join(self.workdir, "live.key")

        def install(name):
            for src, dst in zip(self.pki[name], (cert, key)):
                shutil.copy(src, dst + ".new")
                os.chmod(dst + ".new", 0o600)
                os.replace(dst + ".new", dst)

        install("server")
        body = 'upstream = "%s"\n[tls]\nlisten = "127.0.0.1:TLS_PORT"\ncert_file = "%s"\nkey_file = "%s"\n' % (
            self.upstream.url, cert, key)
        gw = self.tls_gateway(body)

        def served_serial():
            with client_context(self.pki).wrap_socket(socket.create_connection(("127.0.0.1", gw.tls_port), timeout=5),
                                                     server_hostname="localhost") as s:
                return s.getpeercert()["serialNumber"]

        serials = {name: subprocess.run(["openssl", "x509", "-in", self.pki[name][0], "-noout", "-serial"],
                                        capture_output=True, text=True).stdout.strip().split("=")[1].upper()
                   for name in ("server", "server_next")}
        self.assertEqual(served_serial(), serials["server"])
        lua = os.path.join(HERE, "..", "..", "bench", "gateway", "post.lua")
        load = subprocess.Popen([wrk, "-t1", "-c8", "-d8s", "-s", lua, "https://localhost:%d/echo/load" % gw.tls_port],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        rotations = 0
        try:
            time.sleep(0.5)
            deadline = time.monotonic() + 6
            name = "server"
            while time.monotonic() < deadline:
                name = "server_next" if name == "server" else "server"
                install(name)
                self.assertTrue(gw.reload(body), gw.process.log()[-2000:])
                self.assertEqual(served_serial(), serials[name])
                rotations += 1
                time.sleep(0.2)
            # A bad new certificate: the reload fails, saying why, and the running one stays.
            with open(cert, "w") as f:
                f.write("-----BEGIN CERTIFICATE-----\nnot a certificate\n-----END CERTIFICATE-----\n")
            self.assertFalse(gw.reload(body))
            self.assertIn("cannot load a PEM certificate chain", gw.process.log())
            self.assertEqual(served_serial(), serials[name])
        finally:
            out, _ = load.communicate(timeout=60)
        self.assertGreaterEqual(rotations, 5)
        self.assertNotIn("Non-2xx", out, "wrk got answers other than 2xx during the rotations:\n" + out)
        self.assertNotIn("Socket errors", out, "wrk's connections failed during the rotations:\n" + out)
        requests = int(re.search(r"(\d+) requests in", out).group(1))
        # Load through every rotation (a few hundred requests a second under the sanitizers on a
        # busy machine, tens of thousands in a release build).
        self.assertGreater(requests, 200, out)
        print("rotations=%d wrk_requests=%d" % (rotations, requests))


class Upstream(TlsTestCase):
    def front(self, name, client_ca=None):
        """The fixture upstream behind TLS with the certificate `name`."""
        f = TlsTerminator(self.upstream.port, *self.pki[name], client_ca=client_ca)
        self._owned.append(f)
        return f

    def upstream_config(self, front, extra=""):
        return 'upstream = "https://localhost:%d"\nupstream_max_idle = 0\n[upstream_tls]\nca_file = "%s"\n%s' % (
            front.port, self.pki["ca"][0], extra)

    def test_replay_and_mismatch_over_tls_and_sessions_resumed(self):
        front = self.front("upstream")
        gw = self.tls_gateway(self.upstream_config(front))
        key = new_key("up")
        first = request(gw.port, "POST", "/echo/up", b'{"a":1}', [("Idempotency-Key", key)])
        self.assertExecuted(first)
        self.assertReplayOf(request(gw.port, "POST", "/echo/up", b'{"a":1}', [("Idempotency-Key", key)]), first)
        self.assertProblem(request(gw.port, "POST", "/echo/up", b'{"a":2}', [("Idempotency-Key", key)]), 422,
                           "idempotency_key_mismatch")
        self.assertEqual(self.upstream.executions(key), 1)
        # upstream_max_idle = 0: a new connection per request, each resuming the last session.
        for _ in range(5):
            self.assertExecuted(request(gw.port, "POST", "/echo/up", b"{}", [("Idempotency-Key", new_key())]))
        resumed = gw.metrics().get('idem_upstream_tls_handshakes_total{result="resumed"}', 0)
        self.assertGreaterEqual(resumed, 3)

    def test_bad_upstream_certificates_are_502_and_nothing_runs(self):
        good = self.front("upstream")
        cases = [("expired", "certificate has expired"), ("wrong_host", "hostname mismatch"),
                 ("unknown_ca", "unable to get local issuer certificate")]
        gw = self.tls_gateway(self.upstream_config(good))
        for name, reason in cases:
            bad = self.front(name)
            self.assertTrue(gw.reload(self.upstream_config(bad)))
            key = new_key(name)
            for _ in range(2):
                r = request(gw.port, "POST", "/echo/bad", b"{}", [("Idempotency-Key", key)])
                self.assertProblem(r, 502, "upstream_unreachable")
                self.assertIn(reason, r.json()["detail"])
            self.assertEqual(self.upstream.executions(key), 0)
            self.assertEqual(bad.bytes_forwarded, 0)  # not one byte of a request got through
            self.assertIn(reason, gw.process.log())
            # The upstream fixed: the same key executes once, then replays.
            self.assertTrue(gw.reload(self.upstream_config(good)))
            first = request(gw.port, "POST", "/echo/bad", b"{}", [("Idempotency-Key", key)])
            self.assertExecuted(first)
            self.assertReplayOf(request(gw.port, "POST", "/echo/bad", b"{}", [("Idempotency-Key", key)]), first)
            self.assertEqual(self.upstream.executions(key), 1)

    def test_mutual_tls_to_the_upstream(self):
        front = self.front("upstream", client_ca=self.pki["ca"][0])
        without = self.tls_gateway(self.upstream_config(front))
        key = new_key("mtls-up")
        r = request(without.port, "POST", "/echo/m", b"{}", [("Idempotency-Key", key)])
        self.assertProblem(r, 502, "upstream_unreachable")
        self.assertIn("client certificate", r.json()["detail"])
        cert, client_key = self.pki["client_a"]
        with_cert = self.tls_gateway(self.upstream_config(front, 'cert_file = "%s"\nkey_file = "%s"\n' % (cert, client_key)))
        self.assertExecuted(request(with_cert.port, "POST", "/echo/m", b"{}", [("Idempotency-Key", key)]))
        self.assertEqual(self.upstream.executions(key), 1)


if __name__ == "__main__":
    harness.main()
