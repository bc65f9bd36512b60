#!/usr/bin/env python3
"""HTTP/2 on idem-gateway's client listeners ([http2]: "h2" by ALPN on the [tls] listener, h2c with
prior knowledge on the plain one), against the same fixture upstream, which stays HTTP/1.1:

- the tour's three answers (executed, replayed, 422 mismatch) with curl --http2 over TLS and
  curl --http2-prior-knowledge on the plain port, each checked to have spoken HTTP/2; HTTP/1.1
  clients still served on both ports; ALPN offering h2 only with [http2] tls = true, curl falling
  back to HTTP/1.1 without it;
- answers over h2 are HTTP/1.1's: a replay's stored headers equal across the protocols, no
  hop-by-hop header, lower-case names, X-Forwarded-Proto and Host upstream;
- one key on 50 streams of one connection (h2load -c 1 -m 50, and the raw client stream by
  stream): the upstream runs it once, every stream answered 200 or 409; several URIs on one
  connection with nghttp;
- streams served in parallel; 800 KB request and 3 MB response bodies (flow control both ways);
  client certificates as tenants over h2; a client's RST_STREAM mid-flight recorded as a vanished
  HTTP/1.1 client's request is, a partial upload reset claiming nothing; SIGHUP keeping h2
  connections; [http2] checked at start;
- hostile clients (tests/common/h2_raw.py, a raw client): a header list above max_header answered
  431 on its stream, the connection still usable; a body above a route's max_body 413; streams
  beyond max_concurrent_streams refused with RST_STREAM(REFUSED_STREAM) while the others are
  answered; a rapid reset flood (10,000 HEADERS + RST_STREAM) ending that connection with GOAWAY
  while another connection is served; garbage after the preface and a CONTINUATION flood closing
  the connection; CONNECT answered 501 at once; 400 connections of random frames (seeded:
  IDEM_H2_SEED, IDEM_H2_RANDOM_CONNECTIONS) never crashing it; a drain (SIGTERM) announced with
  GOAWAY while the stream in flight completes;
- H2Timeouts: client_timeout per stream (a stalled request body cut off without taking the
  connection's other streams down; a client that never gives flow-control credit cut off; a slow
  upstream and a slow but steady reader left alone) and idle_timeout announced with GOAWAY;
- H2TruncatedUpstream: a streamed response the upstream cuts off resets the stream.

Tools: curl (with HTTP/2), h2load and nghttp (Debian nghttp2-client), openssl (the test CA,
tests/common/tls_certs.py). Missing tools fail the test, they never skip it.

    python3 test_h2.py --gateway PATH --upstream-bin PATH [--store memory|sqlite]
"""

import json
import os
import random
import re
import shutil
import signal
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import GatewayTestCase, Process, RawClient, Response, free_port, new_key, request  # noqa: E402
from tls_certs import make_test_pki  # noqa: E402  (tests/common)
import h2_raw  # noqa: E402  (tests/common)
from h2_raw import H2Connection  # noqa: E402

MAX_HEADER = 8 * 1024   # the main gateway's max_header
SMALL_BODY = 1024       # max_body of its /echo/small/** route


def tool(name):
    path = shutil.which(name) or (("/usr/bin/" + name) if os.access("/usr/bin/" + name, os.X_OK) else None)
    if not path:
        raise AssertionError("%s is not installed (scripts/deps installs it)" % name)
    return path


class H2Gateway:
    """idem-gateway started from a whole configuration file, ready when /healthz answers."""

    def __init__(self, workdir, store, upstream_url, top="", tables="", pki=None, plain=True, tls_extra=""):
        self.workdir = workdir
        self.port = free_port() if plain else None
        self.tls_port = free_port() if pki else None
        self.admin_port = free_port()
        text = 'listen = "%s"\nadmin_listen = "127.0.0.1:%d"\nstore = "%s"\nupstream = "%s"\n%s\n' % (
            "127.0.0.1:%d" % self.port if plain else "off", self.admin_port, store, upstream_url, top)
        if pki:
            text += '[tls]\nlisten = "127.0.0.1:%d"\ncert_file = "%s"\nkey_file = "%s"\n%s\n' % (
                self.tls_port, pki["server"][0], pki["server"][1], tls_extra)
        text += tables
        self.config_text = text
        self.config_path = os.path.join(workdir, "h2-gateway.%s.toml" % uuid.uuid4().hex[:8])
        with open(self.config_path, "w") as f:
            f.write(text)
        self.process = Process("gateway", [harness.ARGS.gateway, "--config", self.config_path], workdir)
        deadline = time.monotonic() + harness.STARTUP_TIMEOUT
        while True:
            if not self.process.alive():
                raise RuntimeError("idem-gateway exited:\n%s\nconfig:\n%s" % (self.process.log(), text))
            try:
                if request(self.admin_port, "GET", "/healthz", timeout=1.0).status == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("idem-gateway did not become ready:\n" + self.process.log())
            time.sleep(0.02)

    def healthy(self):
        try:
            return self.process.alive() and request(self.admin_port, "GET", "/healthz", timeout=5).status == 200
        except OSError:
            return False

    def metrics(self):
        return harness.parse_metrics(request(self.admin_port, "GET", "/metrics").body.decode())

    def stop(self):
        return self.process.stop()


class Curl:
    """What one curl run got: exit code, the HTTP version it used, the last response."""

    def __init__(self, returncode, version, response, stderr):
        self.returncode = returncode
        self.version = version
        self.response = response
        self.stderr = stderr

    def __repr__(self):
        return "<curl rc=%d version=%s %r %s>" % (self.returncode, self.version, self.response, self.stderr[-300:])


def parse_head(text):
    """The last header block of curl -D: (status, [(name, value)])."""
    blocks = [b for b in re.split(r"\r?\n\r?\n", text) if b.strip()]
    if not blocks:
        return None, []
    lines = blocks[-1].splitlines()
    status = int(lines[0].split()[1])
    headers = [tuple(s.strip() for s in line.split(":", 1)) for line in lines[1:] if ":" in line]
    return status, headers


def as_response(r):
    """A harness Response from an h2_raw one (pseudo-headers left out)."""
    return Response(r.status, [(k, v) for k, v in r.headers if not k.startswith(":")], r.body)


class H2Test(GatewayTestCase):
    CONFIG = None

    @classmethod
    def start_class_processes(cls):
        cls.pki = make_test_pki(os.path.join(cls.workdir, "pki"))
        cls.ca = cls.pki["ca"][0]
        top = 'max_header = "%dB"\nmax_body = "1MiB"\n' % MAX_HEADER
        routes = ('[[route]]\nmethod = "POST"\npath = "/echo/small/**"\nmax_body = "%dB"\n\n' % SMALL_BODY +
                  '[[route]]\nmethod = "POST"\npath = "/echo/cert/*"\ntenant.from = "client_cert"\n'
                  'tenant.identity = "uri"\n\n')
        # The gateway under test: h2 on both listeners, the default stream limit (100), client
        # certificates optional (tenants on /echo/cert/*).
        cls.gw = cls.h2_gateway(top, "[http2]\ntls = true\ncleartext = true\n\n" + routes, pki=cls.pki,
                                tls_extra='client_certificates = "optional"\nclient_ca_file = "%s"\n' % cls.ca)
        # A stream limit of 5, plain listener only.
        cls.gw5 = cls.h2_gateway("", "[http2]\ncleartext = true\nmax_concurrent_streams = 5\n")
        # No [http2]: HTTP/1.1 only, whatever the client offers.
        cls.gw11 = cls.h2_gateway("", "", pki=cls.pki)

    @classmethod
    def h2_gateway(cls, top, tables, pki=None, plain=True, tls_extra=""):
        store = cls.store_url("h2-%s.db" % uuid.uuid4().hex[:8])
        g = H2Gateway(cls.workdir, store, cls.upstream.url, top, tables, pki=pki, plain=plain, tls_extra=tls_extra)
        cls._owned.append(g)
        return g

    # -- clients --------------------------------------------------------------------------------

    def curl(self, url, *args, body=None, key=None, headers=(), method=None):
        """One curl run (args such as --http2); a Curl result with the last response."""
        fd, head_path = tempfile.mkstemp(dir=self.workdir, prefix="curl-head-")
        os.close(fd)
        body_path = head_path.replace("curl-head-", "curl-body-")
        argv = [tool("curl"), "-sS", "--max-time", "20", "-o", body_path, "-D", head_path,
                "-w", "%{http_version}", *args]
        if url.startswith("https:"):
            argv += ["--cacert", self.ca]
        if method:
            argv += ["-X", method]
        if key is not None:
            argv += ["-H", "Idempotency-Key: " + key]
        for k, v in headers:
            argv += ["-H", "%s: %s" % (k, v)]
        if body is not None:
            data_path = head_path.replace("curl-head-", "curl-data-")
            with open(data_path, "wb") as f:
                f.write(body if isinstance(body, bytes) else body.encode())
            argv += ["--data-binary", "@" + data_path, "-H", "Content-Type: application/json"]
        out = subprocess.run(argv + [url], capture_output=True, text=True, timeout=60)
        response = None
        try:
            with open(head_path) as f:
                status, hs = parse_head(f.read())
            with open(body_path, "rb") as f:
                data = f.read()
            if status is not None:
                response = Response(status, hs, data)
        except OSError:
            pass
        return Curl(out.returncode, out.stdout.strip(), response, out.stderr)

    def tls_context(self, alpn=("h2",)):
        ctx = ssl.create_default_context(cafile=self.ca)
        if alpn:
            ctx.set_alpn_protocols(list(alpn))
        return ctx

    def h2(self, gw=None, tls=False, **kw):
        """A raw HTTP/2 connection to gw's TLS (ALPN h2) or plain listener."""
        gw = gw or self.gw
        if tls:
            c = H2Connection(gw.tls_port, tls_context=self.tls_context(), **kw)
            self.assertEqual(c.alpn, "h2")
        else:
            c = H2Connection(gw.port, **kw)
        self.addCleanup(c.close)
        return c

    def assertTour(self, url, *curl_args, proto):
        """The tour's three answers through curl with these arguments, each over HTTP/2."""
        key = new_key("tour")
        first = self.curl(url, *curl_args, body='{"amount":100}', key=key)
        self.assertEqual(first.returncode, 0, first)
        self.assertEqual(first.version, "2", first)
        self.assertExecuted(first.response)
        echoed = {k.lower(): v for k, v in first.response.json()["headers"]}
        self.assertEqual(echoed.get("x-forwarded-proto"), proto, echoed)
        self.assertEqual(first.response.json()["body"], '{"amount":100}')
        again = self.curl(url, *curl_args, body='{"amount":100}', key=key)
        self.assertEqual(again.version, "2", again)
        self.assertReplayOf(again.response, first.response)
        self.assertEqual(again.response.execution_id, first.response.execution_id)
        other = self.curl(url, *curl_args, body='{"amount":200}', key=key)
        self.assertEqual(other.version, "2", other)
        self.assertProblem(other.response, 422, "idempotency_key_mismatch")
        self.assertEqual(self.upstream.executions(key), 1)
        # The same record over HTTP/1.1: the same stored answer, whichever protocol stored it.
        path = "/" + url.split("/", 3)[3]
        h1 = request(self.gw.port, "POST", path, b'{"amount":100}',
                     [("Idempotency-Key", key), ("Content-Type", "application/json")])
        self.assertReplayOf(h1, first.response)
        self.assertEqual(self.upstream.executions(key), 1)

    # -- the tour -------------------------------------------------------------------------------

    def test_tour_with_curl_http2_over_tls(self):
        self.assertTour("https://localhost:%d/echo/tour" % self.gw.tls_port, "--http2", proto="https")

    def test_tour_with_curl_h2c_prior_knowledge(self):
        self.assertTour("http://127.0.0.1:%d/echo/tour" % self.gw.port, "--http2-prior-knowledge", proto="http")

    def test_http11_still_served_on_both_ports(self):
        for url in ("https://localhost:%d/echo/h1" % self.gw.tls_port, "http://127.0.0.1:%d/echo/h1" % self.gw.port):
            with self.subTest(url=url):
                key = new_key("h1")
                first = self.curl(url, "--http1.1", body="{}", key=key)
                self.assertEqual(first.version, "1.1", first)
                self.assertExecuted(first.response)
                again = self.curl(url, "--http1.1", body="{}", key=key)
                self.assertReplayOf(again.response, first.response)
                self.assertEqual(self.upstream.executions(key), 1)
        # curl --http2 on the plain port without prior knowledge: HTTP/1.1 with an Upgrade offer,
        # which the gateway does not take (no h2c Upgrade): answered as HTTP/1.1.
        key = new_key("upgrade")
        up = self.curl("http://127.0.0.1:%d/echo/h1" % self.gw.port, "--http2", body="{}", key=key)
        self.assertEqual(up.version, "1.1", up)
        self.assertExecuted(up.response)

    def test_http2_section_is_checked_at_start(self):
        def start(tables, with_tls=False, starts=False):
            """(exit code, output) of a gateway refusing the file; (None, output) of one that
            started (stopped once /healthz answered)."""
            path = os.path.join(self.workdir, "h2-check-%s.toml" % uuid.uuid4().hex[:8])
            admin = free_port()
            text = 'listen = "127.0.0.1:%d"\nadmin_listen = "127.0.0.1:%d"\nstore = "memory:"\nupstream = "%s"\n' % (
                free_port(), admin, self.upstream.url)
            if with_tls:
                text += '[tls]\nlisten = "127.0.0.1:%d"\ncert_file = "%s"\nkey_file = "%s"\n' % (
                    free_port(), self.pki["server"][0], self.pki["server"][1])
            with open(path, "w") as f:
                f.write(text + tables)
            p = subprocess.Popen([harness.ARGS.gateway, "--config", path], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, preexec_fn=harness._die_with_parent)
            try:
                if starts:
                    deadline = time.monotonic() + harness.STARTUP_TIMEOUT
                    while p.poll() is None and time.monotonic() < deadline:
                        try:
                            if request(admin, "GET", "/healthz", timeout=1.0).status == 200:
                                break
                        except OSError:
                            time.sleep(0.05)
                    if p.poll() is None:
                        p.send_signal(signal.SIGTERM)
                        out, err = p.communicate(timeout=15)
                        return None, out + err
                out, err = p.communicate(timeout=harness.STARTUP_TIMEOUT)
                return p.returncode, out + err
            finally:
                if p.poll() is None:
                    p.kill()
                    p.communicate()

        for tables, mention in (("[http2]\nmax_concurrent_streams = 0\n", "max_concurrent_streams"),
                                ("[http2]\nmax_concurrent_streams = 10001\n", "max_concurrent_streams"),
                                ("[http2]\ncleartext = \"yes\"\n", "cleartext"),
                                ("[http2]\nh2c_upgrade = true\n", "h2c_upgrade")):
            with self.subTest(tables=tables):
                code, text = start(tables)
                self.assertEqual(code, 2, "started, or exited otherwise: %r" % text)
                self.assertIn(mention, text)
                self.assertIn("[http2]", text)
        # Both limits themselves are fine.
        for n in (1, 10000):
            code, text = start("[http2]\ncleartext = true\nmax_concurrent_streams = %d\n" % n, starts=True)
            self.assertIsNone(code, "max_concurrent_streams = %d refused: %r" % (n, text))
        # tls = true without a [tls] listener starts, saying it has no effect.
        code, text = start("[http2]\ntls = true\n", starts=True)
        self.assertIsNone(code, text)
        self.assertIn("no effect", text)

    def test_reload_keeps_h2_connections_serving(self):
        conns = [self.h2(tls=True), self.h2()]
        for c in conns:
            self.assertExecuted(as_response(c.response(c.request("POST", "/echo/before-reload",
                                                                 [("idempotency-key", new_key())], b"{}"))))
        before = self.gw.process.log().count("in force")
        self.gw.process.signal(signal.SIGHUP)
        self.assertTrue(self.eventually(lambda: self.gw.process.log().count("in force") > before, 10))
        for c in conns:
            r = c.response(c.request("POST", "/echo/after-reload", [("idempotency-key", new_key())], b"{}"))
            self.assertExecuted(as_response(r))
            self.assertIsNone(c.goaway)
        fresh = self.curl("https://localhost:%d/echo/after-reload" % self.gw.tls_port, "--http2", body="{}",
                          key=new_key())
        self.assertEqual(fresh.version, "2", fresh)
        self.assertExecuted(fresh.response)

    def test_the_plain_port_tells_h2c_from_http11_by_the_whole_preface(self):
        # HTTP/1.1 a byte at a time: not mistaken for a preface, nor stuck waiting for one.
        key = new_key("trickle")
        req = ("POST /echo/trickle HTTP/1.1\r\nHost: x\r\nIdempotency-Key: %s\r\nContent-Length: 2\r\n\r\n{}"
               % key).encode()
        c = RawClient(self.gw.port)
        try:
            for i in range(4):
                c.send(req[i:i + 1])
                time.sleep(0.1)
            c.send(req[4:])
            self.assertExecuted(c.read_response(timeout=10))
        finally:
            c.close()
        # A method named PRI, even with the target *: HTTP/1.1, passed through like any other.
        for line in (b"PRI /echo/pri HTTP/1.1", b"PRI * HTTP/1.1"):
            c = RawClient(self.gw.port)
            try:
                c.send(line + b"\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
                r = c.read_response(timeout=10)
                self.assertIsNotNone(r, line)
                self.assertIsNotNone(r.header("X-Fixture-Route"), r)  # the upstream answered
            finally:
                c.close()
        # The preface in 3-byte pieces: h2.
        c = self.h2(send_preface=False)
        for i in range(0, len(h2_raw.PREFACE), 3):
            self.assertTrue(c.send(h2_raw.PREFACE[i:i + 3]))
            time.sleep(0.05)
        c.send(h2_raw.settings_frame())
        r = c.response(c.request("POST", "/echo/split-preface", [("idempotency-key", new_key())], b"{}"))
        self.assertExecuted(as_response(r))
        # A broken preface: refused as HTTP/1.1 would refuse it, nothing executed.
        c = RawClient(self.gw.port)
        try:
            c.send(b"PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n")
            r = c.read_response(timeout=10)
            self.assertTrue(r is None or r.status == 400, r)
        finally:
            c.close()
        self.assertTrue(self.gw.healthy())

    def test_alpn_offers_h2_only_with_http2_tls(self):
        def negotiated(port, offer):
            ctx = self.tls_context(offer)
            with ctx.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=5),
                                 server_hostname="localhost") as s:
                return s.selected_alpn_protocol()

        self.assertEqual(negotiated(self.gw.tls_port, ("h2", "http/1.1")), "h2")
        self.assertEqual(negotiated(self.gw.tls_port, ("http/1.1",)), "http/1.1")
        self.assertEqual(negotiated(self.gw11.tls_port, ("h2", "http/1.1")), "http/1.1")

    def test_without_http2_curl_falls_back_to_http11(self):
        key = new_key("fallback")
        url = "https://localhost:%d/echo/fallback" % self.gw11.tls_port
        first = self.curl(url, "--http2", body="{}", key=key)
        self.assertEqual(first.returncode, 0, first)
        self.assertEqual(first.version, "1.1", first)
        self.assertExecuted(first.response)
        self.assertReplayOf(self.curl(url, "--http2", body="{}", key=key).response, first.response)
        # Prior knowledge on a plain listener without cleartext h2: no HTTP/2 answer, nothing runs.
        k2 = new_key("noh2c")
        pk = self.curl("http://127.0.0.1:%d/echo/noh2c" % self.gw11.port, "--http2-prior-knowledge", body="{}", key=k2)
        self.assertFalse(pk.returncode == 0 and pk.version == "2", pk)
        self.assertEqual(self.upstream.executions(k2), 0)
        self.assertTrue(self.gw11.healthy())

    # -- answers over h2 ------------------------------------------------------------------------

    def test_h2_answers_are_http11_answers(self):
        for tls in (True, False):
            with self.subTest(tls=tls):
                key = new_key("hop")
                c = self.h2(tls=tls)
                authority = "localhost:%d" % (self.gw.tls_port if tls else self.gw.port)
                hs = [("idempotency-key", key), ("content-type", "application/json")]
                scheme = "https" if tls else "http"
                first = c.response(c.request("POST", "/echo/hop?hop=1", hs, b"{}", authority=authority, scheme=scheme))
                again = c.response(c.request("POST", "/echo/hop?hop=1", hs, b"{}", authority=authority, scheme=scheme))
                self.assertTrue(first.ended, first)
                self.assertExecuted(as_response(first))
                self.assertReplayOf(as_response(again), as_response(first))
                for name, r in (("forwarded", first), ("replayed", again)):
                    names = [k for k, _ in r.headers]
                    self.assertEqual(names, [k.lower() for k in names], "upper-case names over h2: %r" % r)
                    for hop in ("connection", "keep-alive", "transfer-encoding", "upgrade", "proxy-connection",
                                "proxy-authenticate", "proxy-fixture", "x-fixture-private"):
                        self.assertNotIn(hop, names, "%s: %s sent over h2: %r" % (name, hop, r))
                    self.assertEqual([k for k in names if k.startswith(":")], [":status"], r)
                echoed = json.loads(first.body)
                upstream_headers = {k.lower(): v for k, v in echoed["headers"]}
                self.assertEqual(upstream_headers.get("x-forwarded-proto"), scheme, upstream_headers)
                self.assertEqual(upstream_headers.get("host"), authority, upstream_headers)
                self.assertEqual(echoed["method"], "POST")
                self.assertEqual(echoed["target"], "/echo/hop?hop=1")
                # HTTP/1.1 replays what h2 stored, byte for byte.
                h1 = request(self.gw.port, "POST", "/echo/hop?hop=1", b"{}", [("Idempotency-Key", key),
                                                                              ("Content-Type", "application/json")])
                self.assertReplayOf(h1, as_response(first))
                # The gateway's own answers too: a missing key on a listed route is HTTP/1.1's 400.
                missing = c.response(c.request("POST", "/echo/small/x", [], b"{}", authority=authority, scheme=scheme))
                h1_missing = request(self.gw.port, "POST", "/echo/small/x", b"{}")
                self.assertProblem(as_response(missing), 400, "idempotency_key_missing")
                self.assertEqual(json.loads(missing.body)["code"], h1_missing.json()["code"])
                self.assertEqual(self.upstream.executions(key), 1)
        # The listener decides X-Forwarded-Proto, not the client's :scheme.
        c = self.h2()
        r = c.response(c.request("POST", "/echo/scheme", [("idempotency-key", new_key())], b"{}", scheme="https"))
        self.assertEqual({k.lower(): v for k, v in json.loads(r.body)["headers"]}.get("x-forwarded-proto"), "http", r)

    # -- many streams ---------------------------------------------------------------------------

    def test_one_key_on_fifty_streams_with_h2load(self):
        key = new_key("h2load")
        body_path = os.path.join(self.workdir, "h2load-body.json")
        with open(body_path, "w") as f:
            f.write('{"amount":100}')
        before = self.gw.metrics()
        out = subprocess.run([tool("h2load"), "-c", "1", "-m", "50", "-n", "50", "-H", "idempotency-key: " + key,
                              "-H", "content-type: application/json", "-d", body_path,
                              "https://127.0.0.1:%d/slow/h2load?ms=300" % self.gw.tls_port],
                             capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        text = out.stdout
        self.assertIn("Application protocol: h2", text)
        done = re.search(r"requests: 50 total, 50 started, (\d+) done, (\d+) succeeded", text)
        self.assertIsNotNone(done, text)
        self.assertEqual(done.group(1), "50", text)
        codes = re.search(r"status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx", text)
        self.assertIsNotNone(codes, text)
        c2, c3, c4, c5 = map(int, codes.groups())
        self.assertEqual((c3, c5), (0, 0), text)
        self.assertEqual(c2 + c4, 50, text)
        self.assertEqual(self.upstream.executions(key), 1)
        # Which answers: one execution, the rest 409 in progress or replays; nothing else.
        after = self.gw.metrics()

        def delta(outcome):
            name = 'idem_requests_total{outcome="%s"}' % outcome
            return after.get(name, 0) - before.get(name, 0)

        self.assertEqual(delta("executed"), 1, after)
        self.assertGreaterEqual(delta("in_use"), 1, after)
        self.assertEqual(delta("in_use") + delta("replayed"), 49, after)
        self.assertEqual(c4, delta("in_use"), text)
        # One key from 8 connections at once (both event loops), 25 streams each: still once.
        key = new_key("h2load8")
        out = subprocess.run([tool("h2load"), "-c", "8", "-m", "25", "-n", "400", "-H", "idempotency-key: " + key,
                              "-H", "content-type: application/json", "-d", body_path,
                              "https://127.0.0.1:%d/slow/h2load8?ms=200" % self.gw.tls_port],
                             capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        codes = re.search(r"status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx", out.stdout)
        self.assertIsNotNone(codes, out.stdout)
        c2, c3, c4, c5 = map(int, codes.groups())
        self.assertEqual((c2 + c4, c3, c5), (400, 0, 0), out.stdout)
        self.assertEqual(self.upstream.executions(key), 1)

    def test_one_key_on_fifty_streams_stream_by_stream(self):
        key = new_key("raw50")
        c = self.h2(tls=True)
        data = b""
        ids = []
        for _ in range(50):
            sid, frames = c.request_frames("POST", "/slow/raw50?ms=300", [("idempotency-key", key)], b'{"a":1}',
                                           scheme="https", authority="localhost:%d" % self.gw.tls_port)
            ids.append(sid)
            data += frames
        self.assertTrue(c.send(data))
        self.assertTrue(c.wait(lambda: all(c.streams[s].done for s in ids), 30), c.streams)
        self.assertIsNone(c.goaway)
        rs = [c.streams[s] for s in ids]
        self.assertEqual([r.reset_code for r in rs], [None] * 50, rs)
        executed = [r for r in rs if r.status == 200 and r.header("idempotent-replayed") is None]
        self.assertEqual(len(executed), 1, rs)
        execution_id = executed[0].header("x-execution-id")
        for r in rs:
            if r.status == 409:
                self.assertProblem(as_response(r), 409, "idempotency_key_in_use")
                self.assertIsNotNone(r.header("retry-after"), r)
            else:
                self.assertEqual(r.status, 200, r)
                self.assertEqual(r.header("x-execution-id"), execution_id, r)
        self.assertGreaterEqual(sum(r.status == 409 for r in rs), 1, rs)
        self.assertEqual(self.upstream.executions(key), 1)
        # After it completed: a replay on the same connection.
        last = c.response(c.request("POST", "/slow/raw50?ms=300", [("idempotency-key", key)], b'{"a":1}',
                                    scheme="https", authority="localhost:%d" % self.gw.tls_port))
        self.assertEqual(last.header("idempotent-replayed"), "true", last)
        self.assertEqual(last.header("x-execution-id"), execution_id, last)

    def test_nghttp_several_uris_on_one_connection(self):
        base = "http://127.0.0.1:%d/echo/nghttp-%s" % (self.gw.port, uuid.uuid4().hex[:8])
        uris = ["%s/%d" % (base, i) for i in range(4)]
        out = subprocess.run([tool("nghttp"), "-nv", *uris], capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, 0, out.stdout[-3000:] + out.stderr)
        statuses = re.findall(r"recv \(stream_id=(\d+)\) :status: (\d+)", out.stdout)
        self.assertEqual(len(statuses), 4, out.stdout[-3000:])
        self.assertEqual({s for _, s in statuses}, {"200"}, out.stdout[-3000:])
        self.assertEqual(len({sid for sid, _ in statuses}), 4)
        self.assertEqual(len(re.findall(r"recv SETTINGS frame <length=\d+, flags=0x00", out.stdout)), 1,
                         "one connection, one server SETTINGS")
        counted = {r["path"] for r in self.upstream.get_json("/counts")["requests"] if r["method"] == "GET"}
        for u in uris:
            self.assertIn(u.split(str(self.gw.port), 1)[1], counted)

    def test_streams_are_served_in_parallel(self):
        c = self.h2()
        keys, ids, data = [], [], b""
        for i in range(20):
            keys.append(new_key("par%d" % i))
            sid, frames = c.request_frames("POST", "/slow/par?ms=600", [("idempotency-key", keys[-1])], b"{}")
            ids.append(sid)
            data += frames
        start = time.monotonic()
        self.assertTrue(c.send(data))
        self.assertTrue(c.wait(lambda: all(c.streams[s].done for s in ids), 20), c.streams)
        elapsed = time.monotonic() - start
        self.assertEqual([c.streams[s].status for s in ids], [200] * 20)
        self.assertLess(elapsed, 3.0, "20 streams of 600 ms each took %.1fs: not concurrent" % elapsed)
        self.assertEqual([self.upstream.executions(k) for k in keys], [1] * 20)

    def test_large_bodies_both_ways(self):
        # A request body well above the 64 KiB initial window: the gateway must hand out credit.
        body = ("%08d" % 0) * 100000  # 800,000 bytes
        for url, args in (("https://localhost:%d/echo/big-in" % self.gw.tls_port, ["--http2"]),
                          ("http://127.0.0.1:%d/echo/big-in" % self.gw.port, ["--http2-prior-knowledge"])):
            with self.subTest(url=url):
                key = new_key("bigin")
                r = self.curl(url, *args, body=body, key=key)
                self.assertEqual(r.version, "2", r)
                self.assertExecuted(r.response)
                self.assertEqual(r.response.json()["body"], body)
                self.assertReplayOf(self.curl(url, *args, body=body, key=key).response, r.response)
        # A response above max_stored_response (streamed, not stored) and one below (stored).
        for size in (3000000, 300000):
            r = self.curl("https://localhost:%d/large/out?bytes=%d" % (self.gw.tls_port, size), "--http2",
                          body="{}", key=new_key("bigout"))
            self.assertEqual(r.version, "2", r)
            self.assertEqual(r.response.status, 200, r)
            self.assertEqual(len(r.response.body), size)
            self.assertEqual(r.response.body[:52], bytes(range(97, 123)) * 2)

    def test_the_connection_window_is_given_back_for_refused_and_taken_bodies(self):
        # 600 bodies of 50,000 bytes on one connection: 30 MB, more than any window the gateway
        # grants, answered 413 (refused mid-upload: the rest of the body must still be credited)
        # and 200. The raw client sends only what the windows allow: a leak stalls it.
        c = self.h2()
        body = b"w" * 50000
        for path, status in (("/echo/small/window", 413), ("/echo/window", 200)):
            seen = {}
            for _ in range(600):
                r = c.response(c.request("POST", path, [("idempotency-key", new_key("win"))], body), 10)
                seen[(r.status, r.reset_code)] = seen.get((r.status, r.reset_code), 0) + 1
                if not r.done:
                    break
            self.assertEqual(seen, {(status, None): 600}, "%s: connection window %d, GOAWAY %r" % (
                path, c.send_window, c.goaway))
        self.assertIsNone(c.goaway)

    def test_a_client_reset_mid_flight_is_recorded_like_a_vanished_http11_client(self):
        key = new_key("rst")
        c = self.h2()
        sid = c.request("POST", "/slow/rst?ms=700", [("idempotency-key", key)], b"{}")
        self.eventually(lambda: self.upstream.executions(key) == 1, 5)
        self.assertTrue(c.rst(sid, h2_raw.CANCEL))
        # The connection goes on.
        ok = c.response(c.request("POST", "/echo/after-rst", [("idempotency-key", new_key())], b"{}"))
        self.assertExecuted(as_response(ok))
        # Never executed twice; the outcome was recorded (the upstream answers at 0.7 s: until
        # then a retry is 409 in progress), so the retry replays.
        deadline = time.monotonic() + 10
        while True:
            again = c.response(c.request("POST", "/slow/rst?ms=700", [("idempotency-key", key)], b"{}"))
            if again.status != 409 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        self.assertEqual(again.status, 200, again)
        self.assertEqual(again.header("idempotent-replayed"), "true", again)
        self.assertEqual(self.upstream.executions(key), 1)

    def test_client_certificates_are_tenants_over_h2(self):
        key = new_key("mtls")
        url = "https://localhost:%d/echo/cert/pay" % self.gw.tls_port

        def send(cert):
            args = ["--http2"]
            if cert:
                args += ["--cert", self.pki[cert][0], "--key", self.pki[cert][1]]
            return self.curl(url, *args, body="{}", key=key)

        a = send("client_a")
        self.assertEqual(a.version, "2", a)
        self.assertExecuted(a.response)
        self.assertEqual(dict(a.response.json()["headers"]).get("Idempotency-Tenant"),
                         "cert:spiffe://idem.test/payments-a")
        # The same identity renewed: a replay; another client: its own execution.
        self.assertReplayOf(send("client_a_renewed").response, a.response)
        b = send("client_b")
        self.assertExecuted(b.response)
        self.assertNotEqual(b.response.execution_id, a.response.execution_id)
        # No certificate, over h2 and h2c: refused, nothing executed.
        self.assertProblem(send(None).response, 401, "client_certificate_missing")
        c = self.h2()
        r = c.response(c.request("POST", "/echo/cert/pay", [("idempotency-key", key)], b"{}"))
        self.assertProblem(as_response(r), 401, "client_certificate_missing")
        self.assertEqual(self.upstream.executions(key), 2)

    def test_a_partial_upload_reset_claims_nothing(self):
        key = new_key("partial")
        c = self.h2()
        sid, frames = c.request_frames("POST", "/echo/partial", [("idempotency-key", key), ("content-length", "100")],
                                       end_stream=False)
        self.assertTrue(c.send(frames + h2_raw.frame(h2_raw.DATA, 0, sid, b"x" * 10)))
        time.sleep(0.2)
        self.assertTrue(c.rst(sid, h2_raw.CANCEL))
        # The key was never claimed: the complete request executes, on the same connection.
        r = c.response(c.request("POST", "/echo/partial", [("idempotency-key", key)], b"x" * 100))
        self.assertExecuted(as_response(r))
        self.assertEqual(json.loads(r.body)["body"], "x" * 100)
        self.assertEqual(self.upstream.executions(key), 1)

    def test_connect_is_answered_501_at_once(self):
        # HTTP/1.1 answers CONNECT 501 not_implemented. Over h2 a CONNECT stream stays open for the
        # tunnel's bytes (RFC 9113 §8.5), so the answer cannot wait for its end.
        for end_stream in (True, False):
            with self.subTest(end_stream=end_stream):
                c = self.h2()
                sid = c.new_stream_id()
                block = h2_raw.encode_headers([(":method", "CONNECT"), (":authority", "127.0.0.1:%d" % self.upstream.port)])
                self.assertTrue(c.send(h2_raw.headers_frames(sid, block, end_stream=end_stream)))
                r = c.response(sid, 5)
                self.assertEqual(r.status, 501, "CONNECT (END_STREAM %s) not answered within 5 s: %r" % (end_stream, r))
                self.assertProblem(as_response(r), 501, "not_implemented")

    # -- hostile clients ------------------------------------------------------------------------

    def test_header_list_above_max_header_is_431_and_the_connection_stays(self):
        for tls in (True, False):
            with self.subTest(tls=tls):
                c = self.h2(tls=tls)
                scheme = "https" if tls else "http"
                key = new_key("big")
                one_big = [("idempotency-key", key), ("x-big", "b" * (MAX_HEADER + 4096))]
                r = c.response(c.request("POST", "/echo/big", one_big, b"{}", scheme=scheme))
                self.assertProblem(as_response(r), 431, "request_header_too_large")
                many = [("idempotency-key", key)] + [("x-many-%03d" % i, "m" * 40) for i in range(300)]
                r = c.response(c.request("POST", "/echo/big", many, b"{}", scheme=scheme))
                self.assertProblem(as_response(r), 431, "request_header_too_large")
                self.assertEqual(self.upstream.executions(key), 0)
                # The same connection goes on; below the limit is served.
                fine = [("idempotency-key", key), ("x-big", "b" * (MAX_HEADER // 2))]
                ok = c.response(c.request("POST", "/echo/big", fine, b"{}", scheme=scheme))
                self.assertExecuted(as_response(ok))
                self.assertIsNone(c.goaway)
                self.assertFalse(c.closed)
        # curl too; and a fresh connection afterwards.
        key = new_key("bigcurl")
        url = "https://localhost:%d/echo/big" % self.gw.tls_port
        big = self.curl(url, "--http2", body="{}", key=key, headers=[("X-Big", "c" * (MAX_HEADER + 1000))])
        self.assertEqual(big.version, "2", big)
        self.assertProblem(big.response, 431, "request_header_too_large")
        self.assertExecuted(self.curl(url, "--http2", body="{}", key=key).response)

    def test_body_above_max_body_is_413(self):
        for tls in (True, False):
            with self.subTest(tls=tls):
                c = self.h2(tls=tls)
                scheme = "https" if tls else "http"
                key = new_key("large")
                r = c.response(c.request("POST", "/echo/small/x", [("idempotency-key", key)], b"x" * (4 * SMALL_BODY),
                                         scheme=scheme))
                self.assertProblem(as_response(r), 413, "request_too_large")
                self.assertEqual(self.upstream.executions(key), 0)
                # At the limit on a fresh connection: executed. The other routes keep max_body.
                c2 = self.h2(tls=tls)
                ok = c2.response(c2.request("POST", "/echo/small/x", [("idempotency-key", key)], b"x" * SMALL_BODY,
                                            scheme=scheme))
                self.assertExecuted(as_response(ok))
                bigger = c2.response(c2.request("POST", "/echo/other", [("idempotency-key", new_key())],
                                                b"y" * (4 * SMALL_BODY), scheme=scheme))
                self.assertExecuted(as_response(bigger))
        key = new_key("largecurl")
        big = self.curl("https://localhost:%d/echo/small/c" % self.gw.tls_port, "--http2", body="z" * (4 * SMALL_BODY),
                        key=key)
        self.assertEqual(big.version, "2", big)
        self.assertProblem(big.response, 413, "request_too_large")
        self.assertEqual(self.upstream.executions(key), 0)

    def test_streams_beyond_max_concurrent_streams_are_refused(self):
        # The SETTINGS not acknowledged yet: nghttp2 refuses the streams above the limit it sent
        # (once acknowledged, going above it is a connection error).
        c = self.h2(self.gw5, auto_ack_settings=False)
        self.assertTrue(c.wait(lambda: h2_raw.SETTINGS_MAX_CONCURRENT_STREAMS in c.server_settings, 5))
        self.assertEqual(c.server_settings[h2_raw.SETTINGS_MAX_CONCURRENT_STREAMS], 5)
        keys, ids, data = [], [], b""
        for i in range(10):
            keys.append(new_key("cap%d" % i))
            sid, frames = c.request_frames("POST", "/slow/cap?ms=500", [("idempotency-key", keys[-1])], b"{}")
            ids.append(sid)
            data += frames
        self.assertTrue(c.send(data))
        self.assertTrue(c.wait(lambda: all(c.streams[s].done for s in ids), 20), c.streams)
        rs = [c.streams[s] for s in ids]
        for r in rs[:5]:
            self.assertEqual((r.status, r.reset_code), (200, None), r)
        for r in rs[5:]:
            self.assertEqual(r.reset_code, h2_raw.REFUSED_STREAM, r)
            self.assertIsNone(r.status, r)
        self.assertEqual([self.upstream.executions(k) for k in keys], [1] * 5 + [0] * 5)
        self.assertIsNone(c.goaway)
        # The connection goes on: acknowledged, a refused request sent again is served.
        self.assertTrue(c.ack_settings())
        again = c.response(c.request("POST", "/slow/cap?ms=10", [("idempotency-key", keys[7])], b"{}"))
        self.assertEqual(again.status, 200, again)
        self.assertEqual(self.upstream.executions(keys[7]), 1)

    def test_rapid_reset_flood_ends_that_connection_only(self):
        key = new_key("flood")
        c = self.h2()
        self.assertTrue(c.wait(lambda: c.server_settings, 5))
        # A request on another connection, in flight during the flood.
        other_key = new_key("bystander")
        curl = subprocess.Popen([tool("curl"), "-sS", "--max-time", "30", "--http2", "--cacert", self.ca,
                                 "-o", "/dev/null", "-w", "%{http_code} %{http_version}", "-X", "POST", "-d", "{}",
                                 "-H", "Idempotency-Key: " + other_key,
                                 "https://localhost:%d/slow/bystander?ms=1500" % self.gw.tls_port],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            time.sleep(0.3)
            flood = bytearray()
            for _ in range(10000):
                sid, frames = c.request_frames("POST", "/echo/flood", [("idempotency-key", key)], end_stream=False)
                flood += frames + h2_raw.rst_stream_frame(sid, h2_raw.CANCEL)
            start = time.monotonic()
            sent_all = c.send(bytes(flood), timeout=30)
            goaway = c.wait_goaway(10)
            closed = c.wait_closed(10)
            print("rapid reset: all sent %s in %.2fs, GOAWAY %r, closed %s" % (
                sent_all, time.monotonic() - start, goaway, closed))
            self.assertTrue(goaway is not None or closed, "neither GOAWAY nor close after 10,000 resets")
            if goaway is not None:
                self.assertNotEqual(goaway[1], h2_raw.NO_ERROR, goaway)
            out, err = curl.communicate(timeout=40)
        finally:
            if curl.poll() is None:
                curl.kill()
                curl.wait()
        self.assertEqual(out.strip(), "200 2", err)
        self.assertEqual(self.upstream.executions(other_key), 1)
        self.assertEqual(self.upstream.executions(key), 0)  # not one flooded request had a body
        self.assertTrue(self.gw.healthy())
        after = self.curl("https://localhost:%d/echo/after-flood" % self.gw.tls_port, "--http2", body="{}",
                          key=new_key())
        self.assertEqual(after.version, "2", after)
        self.assertExecuted(after.response)

    def test_garbage_after_the_preface_closes_the_connection(self):
        cases = {
            "an oversized frame": h2_raw.PREFACE + h2_raw.settings_frame() + b"\xff" * 64,
            "HTTP/1.1 after the preface": h2_raw.PREFACE + h2_raw.settings_frame()
            + b"POST /echo/garbage HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}",
            "a HEADERS block HPACK cannot decode": h2_raw.PREFACE + h2_raw.settings_frame()
            + h2_raw.frame(h2_raw.HEADERS, h2_raw.END_HEADERS | h2_raw.END_STREAM, 1, b"\xff\xff\xff\xff\xff"),
            "DATA on stream 0": h2_raw.PREFACE + h2_raw.settings_frame() + h2_raw.frame(h2_raw.DATA, 0, 0, b"xx"),
        }
        for tls in (False, True):
            for name, data in cases.items():
                with self.subTest(case=name, tls=tls):
                    c = self.h2(tls=tls, send_preface=False)
                    c.send(data)
                    self.assertTrue(c.wait_closed(10), "still open after %s" % name)
                    if c.goaway is not None:
                        self.assertNotEqual(c.goaway[1], h2_raw.NO_ERROR, c.goaway)
        self.assertTrue(self.gw.healthy())
        c = self.h2()
        ok = c.response(c.request("POST", "/echo/after-garbage", [("idempotency-key", new_key())], b"{}"))
        self.assertExecuted(as_response(ok))

    def test_continuation_flood_closes_the_connection(self):
        # HEADERS without END_HEADERS, then 20,000 small CONTINUATION frames: a header list far
        # above max_header that never ends (CVE-2024-27316's pattern).
        c = self.h2()
        sid = c.new_stream_id()
        block = h2_raw.encode_headers([(":method", "POST"), (":scheme", "http"), (":authority", "x"),
                                       (":path", "/echo/continuation")])
        data = bytearray(h2_raw.frame(h2_raw.HEADERS, 0, sid, block))
        one = h2_raw.frame(h2_raw.CONTINUATION, 0, sid, h2_raw.encode_headers([("x-c", "v" * 10)]))
        for _ in range(20000):
            data += one
        c.send(bytes(data), timeout=30)
        self.assertTrue(c.wait_closed(10) or c.streams[sid].done, "neither closed nor answered")
        self.assertIn(c.streams[sid].status, (None, 431), c.streams[sid])
        self.assertTrue(self.gw.healthy())

    def test_random_frames_never_crash_or_hang_it(self):
        seed = int(os.environ.get("IDEM_H2_SEED", "0")) or random.randrange(1, 2 ** 31)
        rng = random.Random(seed)
        good_block = h2_raw.encode_headers([(":method", "POST"), (":scheme", "http"), (":authority", "x"),
                                            (":path", "/echo/random"), ("idempotency-key", new_key("rnd"))])

        def random_frame():
            sid = rng.choice([0, 1, 3, 5, rng.randrange(0, 2 ** 31)])
            kind = rng.randrange(12)
            if kind == h2_raw.HEADERS and rng.random() < 0.6:
                payload = good_block if rng.random() < 0.7 else bytes(rng.randrange(256) for _ in range(rng.randrange(40)))
            elif kind == h2_raw.SETTINGS and rng.random() < 0.7:
                payload = b"".join(struct.pack(">HI", rng.randrange(10), rng.choice([0, 1, 100, 2 ** 31, 2 ** 32 - 1]))
                                   for _ in range(rng.randrange(4)))
            elif kind == h2_raw.WINDOW_UPDATE and rng.random() < 0.7:
                payload = struct.pack(">I", rng.choice([0, 1, 65535, 2 ** 31 - 1]))
            else:
                payload = bytes(rng.randrange(256) for _ in range(rng.choice([0, 1, 4, 5, 8, 9, rng.randrange(64)])))
            return h2_raw.frame(kind, rng.randrange(256), sid, payload)

        for i in range(int(os.environ.get("IDEM_H2_RANDOM_CONNECTIONS", "400"))):
            c = H2Connection(self.gw.port, send_preface=False)
            try:
                data = h2_raw.PREFACE + h2_raw.settings_frame() + b"".join(random_frame() for _ in range(rng.randrange(1, 12)))
                if rng.random() < 0.2:  # a length that lies
                    data = data[:-1] if rng.random() < 0.5 else data + bytes([rng.randrange(256)])
                c.send(data, timeout=10)
                c.wait(lambda: False, 0.02)
            finally:
                c.close()
            self.assertTrue(self.gw.process.alive(), "gateway died at connection %d (IDEM_H2_SEED=%d)" % (i, seed))
        self.assertTrue(self.gw.healthy(), "IDEM_H2_SEED=%d" % seed)
        c = self.h2()
        r = c.response(c.request("POST", "/echo/after-random", [("idempotency-key", new_key())], b"{}"))
        self.assertExecuted(as_response(r))

    def test_drain_sends_goaway_and_finishes_the_stream_in_flight(self):
        gw = self.h2_gateway('drain_timeout = "10s"\n', "[http2]\ncleartext = true\n")
        c = self.h2(gw)
        key = new_key("drain")
        sid = c.request("POST", "/slow/drain?ms=1500", [("idempotency-key", key)], b"{}")
        self.assertTrue(c.wait(lambda: c.settings_acked, 5))
        time.sleep(0.4)  # the request reached the upstream
        gw.process.signal(signal.SIGTERM)
        goaway = c.wait_goaway(5)
        self.assertIsNotNone(goaway, "no GOAWAY on drain")
        self.assertEqual(goaway[1], h2_raw.NO_ERROR, goaway)
        self.assertGreaterEqual(goaway[0], sid, goaway)  # the stream in flight is processed
        r = c.response(sid, 10)
        self.assertEqual(r.status, 200, r)
        self.assertTrue(r.ended, r)
        self.assertEqual(self.upstream.executions(key), 1)
        self.assertTrue(c.wait_closed(10), "connection still open after the drain")
        self.assertEqual(gw.process.wait(15), 0, gw.process.log()[-2000:])


class H2Timeouts(GatewayTestCase):
    """client_timeout and idle_timeout over h2: per stream, as they are per request over HTTP/1.1
    (test_hostile.py), without taking the connection's other streams down."""

    CONFIG = None
    CLIENT_TIMEOUT = 2.0
    IDLE_TIMEOUT = 3.0

    @classmethod
    def start_class_processes(cls):
        cls.gw = H2Gateway(cls.workdir, cls.store_url("h2-timeouts.db"), cls.upstream.url,
                           'client_timeout = "2s"\nidle_timeout = "3s"\n', "[http2]\ncleartext = true\n")
        cls._owned.append(cls.gw)

    def h2(self, **kw):
        c = H2Connection(self.gw.port, **kw)  # noqa: the class's own, plain listener only
        self.addCleanup(c.close)
        return c

    def test_a_stalled_request_body_does_not_take_the_other_streams_down(self):
        c = self.h2()
        start = time.monotonic()
        stalled = c.request("POST", "/echo/stalled", [("idempotency-key", new_key()), ("content-length", "10")],
                            end_stream=False)
        time.sleep(1.0)
        key = new_key("victim")
        victim = c.request("POST", "/slow/victim?ms=2500", [("idempotency-key", key)], b"{}")
        r = c.response(victim, 8)
        self.assertEqual((r.status, r.ended), (200, True),
                         "a stream in flight lost when another stream's body stalled: %r; GOAWAY %r, closed %s "
                         "after %.1fs" % (r, c.goaway, c.closed, time.monotonic() - start))
        self.assertEqual(self.upstream.executions(key), 1)
        s = c.streams[stalled]
        self.assertTrue(c.wait(lambda: s.done, max(0.0, start + self.CLIENT_TIMEOUT + 3.0 - time.monotonic())) or c.closed,
                        "the stalled stream still open after %.1fs" % (time.monotonic() - start))
        self.assertIn(s.status, (None, 408), s)

    def test_a_stalled_request_body_is_cut_off_on_a_busy_connection(self):
        c = self.h2()
        start = time.monotonic()
        stalled = c.request("POST", "/echo/stalled", [("idempotency-key", new_key()), ("content-length", "10")],
                            end_stream=False)
        s = c.streams[stalled]
        served = 0
        while not s.done and not c.closed and time.monotonic() < start + self.CLIENT_TIMEOUT + 3.0:
            r = c.response(c.request("POST", "/echo/busy", [("idempotency-key", new_key())], b"{}"), 5)
            if r.status == 200:
                served += 1
            c.wait(lambda: s.done, 0.3)
        elapsed = time.monotonic() - start
        self.assertTrue(s.done or c.closed, "a stream without its body still open after %.1fs (client_timeout "
                        "%.0fs) while other streams kept the connection busy" % (elapsed, self.CLIENT_TIMEOUT))
        self.assertIn(s.status, (None, 408), s)
        self.assertGreater(served, 3)

    def test_a_client_that_never_reads_is_cut_off(self):
        # No flow-control credit, ever: the response can never be written.
        c = self.h2(settings=((h2_raw.SETTINGS_INITIAL_WINDOW_SIZE, 0),))
        start = time.monotonic()
        sid = c.request("POST", "/large/unread?bytes=100000", [("idempotency-key", new_key())], b"{}")
        s = c.streams[sid]
        c.wait(lambda: s.reset_code is not None, self.CLIENT_TIMEOUT + 3.0)
        self.assertTrue(s.reset_code is not None or c.closed,
                        "a response the client never takes still held after %.1fs (client_timeout %.0fs): %r"
                        % (time.monotonic() - start, self.CLIENT_TIMEOUT, s))
        self.assertTrue(self.gw.healthy())

    def test_a_slow_upstream_and_a_slow_steady_reader_are_not_cut_off(self):
        # What the watchdog must leave alone: an upstream slower than client_timeout (that is
        # upstream_timeout's business), and a client taking the answer slowly but steadily. All
        # at once: the slow upstream's two streams wait while the steady reader reads.
        c = self.h2()
        ms = int(self.CLIENT_TIMEOUT * 1750)
        keyed = c.request("POST", "/slow/long?ms=%d" % ms, [("idempotency-key", new_key())], b"{}")
        passed = c.request("GET", "/slow/long-get?ms=%d" % ms)
        # 16 KiB of credit a second, 100,000 bytes: about 6 s, three times client_timeout.
        slow = self.h2(settings=((h2_raw.SETTINGS_INITIAL_WINDOW_SIZE, 16384),), auto_window_update=False)
        sid = slow.request("POST", "/large/steady?bytes=100000", [("idempotency-key", new_key())], b"{}")
        s = slow.streams[sid]
        start, seen = time.monotonic(), 0
        while not s.done and not slow.closed and time.monotonic() - start < 20:
            slow.wait(lambda: len(s.body) > seen or s.done, 3)
            fresh, seen = len(s.body) - seen, len(s.body)
            c.wait(lambda: False, self.CLIENT_TIMEOUT / 2)  # the other connection's frames meanwhile
            if fresh:
                slow.credit(sid, fresh)
        self.assertEqual((s.status, s.reset_code, s.ended, len(s.body)), (200, None, True, 100000),
                         "after %.1fs, GOAWAY %r" % (time.monotonic() - start, slow.goaway))
        self.assertGreater(time.monotonic() - start, self.CLIENT_TIMEOUT * 1.5)
        for sid in (keyed, passed):
            r = c.response(sid, 10)
            self.assertEqual((r.status, r.reset_code, r.ended), (200, None, True), r)

    def test_an_idle_connection_is_closed_with_goaway(self):
        c = self.h2()
        r = c.response(c.request("POST", "/echo/idle", [("idempotency-key", new_key())], b"{}"))
        self.assertEqual(r.status, 200, r)
        start = time.monotonic()
        self.assertTrue(c.wait_closed(self.IDLE_TIMEOUT + 3.0), "idle h2 connection never closed")
        self.assertGreater(time.monotonic() - start, self.IDLE_TIMEOUT - 0.5)
        # RFC 9113 §6.8: a GOAWAY before closing tells the client which streams were processed
        # (here: all of them), so that it knows what it may retry.
        self.assertIsNotNone(c.goaway, "idle connection closed without GOAWAY")
        self.assertEqual(c.goaway[:2], (r.stream_id, h2_raw.NO_ERROR), c.goaway)


class TruncatingUpstream:
    """An HTTP/1.1 upstream that starts a 3 MB response (above max_stored_response: streamed to
    the client) and closes after half of it: with Content-Length on /length, chunked on /chunked."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.url = "http://127.0.0.1:%d" % self.port
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    @staticmethod
    def _answer(conn):
        try:
            conn.settimeout(10)
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
            if b" /chunked" in data.split(b"\r\n", 1)[0]:
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
                             b"Transfer-Encoding: chunked\r\n\r\n")
                for _ in range(24):
                    conn.sendall(b"10000\r\n" + b"c" * 65536 + b"\r\n")
            else:
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
                             b"Content-Length: 3000000\r\n\r\n" + b"t" * 1500000)
        except OSError:
            pass
        finally:
            conn.close()

    def stop(self):
        self.sock.close()


class H2TruncatedUpstream(GatewayTestCase):
    """A streamed response the upstream cuts off: HTTP/1.1 closes the client's connection before
    the body is complete, so the client knows; over h2 the stream must be reset, never left open
    (and never ended as if complete)."""

    CONFIG = None

    @classmethod
    def start_class_processes(cls):
        cls.trunc = TruncatingUpstream()
        cls._owned.append(cls.trunc)
        cls.gw = H2Gateway(cls.workdir, cls.store_url("h2-trunc.db"), cls.trunc.url, 'upstream_timeout = "5s"\n',
                           "[http2]\ncleartext = true\n")
        cls._owned.append(cls.gw)

    def test_a_cut_off_streamed_response_resets_the_stream(self):
        for path in ("/length", "/chunked"):
            with self.subTest(path=path):
                # HTTP/1.1 for reference: the connection closes before the body is complete.
                h1 = subprocess.run([tool("curl"), "-sS", "--max-time", "20", "-o", "/dev/null",
                                     "http://127.0.0.1:%d%s" % (self.gw.port, path)], capture_output=True, text=True)
                self.assertEqual(h1.returncode, 18, h1.stderr)  # "transfer closed with ... remaining"
                c = H2Connection(self.gw.port)
                self.addCleanup(c.close)
                start = time.monotonic()
                r = c.response(c.request("GET", path), 6)
                self.assertEqual(r.status, 200, r)
                self.assertFalse(r.ended, "a cut-off response ended as if complete: %d bytes" % len(r.body))
                self.assertTrue(r.reset_code is not None or c.closed,
                                "a cut-off response neither reset nor closed after %.0fs (%d bytes received)"
                                % (time.monotonic() - start, len(r.body)))
                # The connection's other streams go on (when only the stream was reset).
                if not c.closed:
                    self.assertEqual(c.response(c.request("GET", "/length"), 10).status, 200)


if __name__ == "__main__":
    harness.main()
