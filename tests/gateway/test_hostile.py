#!/usr/bin/env python3
"""Hostile input through the real gateway: malformed request lines, oversized headers and bodies,
a client sending one byte a second, clients vanishing mid-request and mid-response, an upstream
closing mid-response. After each, the gateway has answered or closed cleanly, is still alive and
serves a normal request.

    python3 test_hostile.py --gateway PATH --upstream-bin PATH [--store memory|sqlite]
"""

import collections
import hashlib
import os
import random
import re
import resource
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import GatewayTestCase, RawClient, new_key  # noqa: E402

HEADER_TIMEOUT = 2.0  # the gateway's client_timeout and idle_timeout in CONFIG

CONFIG = """
upstream_timeout = "5s"
max_body = "64KiB"
client_timeout = "2s"
idle_timeout = "2s"

[idempotency]
lease = "30s"

[[route]]
method = "POST"
path = "/echo"

[[route]]
method = "POST"
path = "/slow"

[[route]]
method = "POST"
path = "/close-mid-response"

[[route]]
method = "POST"
path = "/malformed-response"
"""


class HostileTest(GatewayTestCase):
    CONFIG = CONFIG

    def assertStillServing(self):
        self.assertTrue(self.gateway.alive(), "gateway died")
        r = self.gateway.request("POST", "/echo", "{}", key=new_key(), timeout=10)
        self.assertExecuted(r)

    def assertAnsweredOrClosed(self, c, allowed=range(400, 500), timeout=5.0):
        """A 4xx answer or a clean close within `timeout`; never a success."""
        try:
            r = c.read_response(timeout=timeout)
        except (ConnectionResetError, BrokenPipeError):
            return None
        except (socket.timeout, TimeoutError):
            self.fail("neither answered nor closed within %.1fs" % timeout)
        if r is not None:
            self.assertIn(r.status, allowed, r)
        return r

    def test_malformed_request_lines(self):
        cases = [
            b"GARBAGE\r\n\r\n",
            b"GET\r\n\r\n",
            b"POST /echo HTTP/9.9\r\nHost: x\r\n\r\n",
            b"POST /echo\r\nHost: x\r\n\r\n",
            b"\x00\x01\x02\x03\r\n\r\n",
            b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 64,  # a TLS ClientHello
            b"POST /echo HTTP/1.1\r\nHost: x\r\nBad Header Line\r\n\r\n",
            b"POST /echo HTTP/1.1\r\nHost: x\r\n: empty-name\r\n\r\n",
            b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
            b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
            b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
            b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nZZZ\r\nhello\r\n0\r\n\r\n",
            b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n0\r\n\r\n",
            b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\nxyz",
            b"POST " + b"/a" * 20000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
            b"\r\n" * 1000,
        ]
        before = self.upstream.total()
        for raw in cases:
            with self.subTest(raw=raw[:60]):
                c = RawClient(self.gateway.port)
                try:
                    try:
                        c.send(raw)
                    except (BrokenPipeError, ConnectionResetError):
                        continue
                    self.assertAnsweredOrClosed(c)
                finally:
                    c.close()
        self.assertEqual(self.upstream.total(), before, "a malformed request reached the upstream")
        self.assertStillServing()

    def test_oversized_headers(self):
        cases = {
            "one huge header": "X-Big: " + "a" * (1024 * 1024) + "\r\n",
            "many headers": "".join("X-H%d: %s\r\n" % (i, "v" * 100) for i in range(5000)),
        }
        before = self.upstream.total()
        for name, headers in cases.items():
            with self.subTest(name):
                c = RawClient(self.gateway.port)
                try:
                    try:
                        c.send("POST /echo HTTP/1.1\r\nHost: x\r\nIdempotency-Key: %s\r\n%s\r\n"
                               % (new_key(), headers))
                    except (BrokenPipeError, ConnectionResetError):
                        continue  # closed while we were still sending: fine
                    r = self.assertAnsweredOrClosed(c, allowed=(431,))
                    if r is not None:
                        self.assertProblem(r, 431, "request_header_too_large")
                finally:
                    c.close()
        self.assertEqual(self.upstream.total(), before)
        self.assertStillServing()

    def test_oversized_chunked_body(self):
        key = new_key()
        c = RawClient(self.gateway.port)
        try:
            c.send("POST /echo HTTP/1.1\r\nHost: x\r\nIdempotency-Key: %s\r\nTransfer-Encoding: chunked\r\n\r\n" % key)
            chunk = b"4000\r\n" + b"z" * 0x4000 + b"\r\n"
            try:
                for _ in range(64):  # 1 MiB, well above max_body
                    c.send(chunk)
            except (BrokenPipeError, ConnectionResetError):
                pass
            r = self.assertAnsweredOrClosed(c, allowed=(413,))
            if r is not None:
                self.assertProblem(r, 413, "request_too_large")
        finally:
            c.close()
        self.assertEqual(self.upstream.executions(key), 0)
        self.assertStillServing()

    def test_one_byte_a_second_is_cut_off_by_the_header_timeout(self):
        c = RawClient(self.gateway.port)
        stop = threading.Event()
        request = b"POST /echo HTTP/1.1\r\nHost: x\r\nIdempotency-Key: " + new_key().encode() + b"\r\n"
        closed_at = {}

        def trickle():
            start = time.monotonic()
            for b in request:
                if stop.wait(1.0):
                    return
                try:
                    c.sock.sendall(bytes([b]))
                except OSError:
                    closed_at["t"] = time.monotonic() - start
                    return

        t = threading.Thread(target=trickle, daemon=True)
        start = time.monotonic()
        t.start()
        try:
            # Others are served while the slow client trickles.
            self.assertStillServing()
            closed = c.closed_by_peer(HEADER_TIMEOUT + 3.0)
            elapsed = time.monotonic() - start
            self.assertTrue(closed or "t" in closed_at,
                            "slow client still connected after %.1fs (header timeout %.1fs)"
                            % (elapsed, HEADER_TIMEOUT))
            self.assertLess(elapsed, HEADER_TIMEOUT + 3.0)
            if c.buf:  # an answer before closing is fine, but only a 408/400
                self.assertRegex(c.buf[:12], rb"HTTP/1\.[01] (408|400)")
        finally:
            stop.set()
            t.join(5)
            c.close()
        self.assertStillServing()

    def test_idle_connection_before_any_byte_is_closed(self):
        c = RawClient(self.gateway.port)
        try:
            self.assertTrue(c.closed_by_peer(HEADER_TIMEOUT + 3.0), "idle connection never closed")
        finally:
            c.close()
        self.assertStillServing()

    def test_client_vanishes_mid_request(self):
        key = new_key()
        for partial in (b"POST /echo HTTP/1.1\r\nHost: x\r\nIdempot",
                        b"POST /echo HTTP/1.1\r\nHost: x\r\nIdempotency-Key: " + key.encode() +
                        b"\r\nContent-Length: 1000\r\n\r\n" + b"a" * 10):
            c = RawClient(self.gateway.port)
            c.send(partial)
            c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            c.close()  # RST
        self.assertStillServing()
        # The key was never claimed: the complete request executes.
        r = self.gateway.request("POST", "/echo", "{}", key=key)
        self.assertExecuted(r)
        self.assertEqual(self.upstream.executions(key), 1)

    def test_client_vanishes_while_upstream_works(self):
        key = new_key()
        c = RawClient(self.gateway.port)
        c.send("POST /slow?ms=700 HTTP/1.1\r\nHost: x\r\nIdempotency-Key: %s\r\nContent-Length: 2\r\n\r\n{}" % key)
        self.eventually(lambda: self.upstream.executions(key) == 1, 5)
        c.close()
        self.assertStillServing()
        time.sleep(1.0)  # the slow upstream answers at 0.7 s
        # Never executed twice; the outcome was recorded, so the retry replays.
        r = self.gateway.request("POST", "/slow?ms=700", "{}", key=key)
        self.assertEqual(self.upstream.executions(key), 1)
        self.assertEqual(r.status, 200, r)
        self.assertTrue(r.replayed, r)

    def test_many_clients_vanish_at_once(self):
        socks = []
        for i in range(100):
            c = RawClient(self.gateway.port)
            c.send("POST /slow?ms=300 HTTP/1.1\r\nHost: x\r\nIdempotency-Key: %s\r\nContent-Length: 2\r\n\r\n{}"
                   % new_key("v%d" % i))
            socks.append(c)
        for c in socks:
            c.close()
        self.assertStillServing()

    def test_upstream_closes_mid_response(self):
        for _ in range(5):
            r = self.gateway.request("POST", "/close-mid-response", "{}", key=new_key())
            self.assertProblem(r, 504, "upstream_timeout")
        self.assertStillServing()

    def test_heads_other_servers_could_frame_differently_are_refused_and_never_execute(self):
        """RFC 9112 §3.2, §6.1, §6.3: a request whose body length is uncertain, whose Host is
        missing, repeated or malformed, or that asks for a tunnel, is answered and the connection
        closed, with a valid key and all: nothing executes, nothing is claimed, and the bytes
        after the head (here, a whole second request) are never read as a request."""
        smuggled_key = new_key("smuggled")
        smuggled = ("POST /echo HTTP/1.1\r\nHost: x\r\nIdempotency-Key: %s\r\n"
                    "Content-Length: 2\r\n\r\n{{}}" % smuggled_key)  # {{}}: a template, as below
        http11 = "POST /echo HTTP/1.1\r\nIdempotency-Key: {key}\r\n"
        chunked_body = "2\r\n{{}}\r\n0\r\n\r\n"
        cases = [
            # (the request, with {key} for a fresh key; status; code)
            (http11 + "Host: x\r\nTransfer-Encoding: gzip\r\n\r\n" + smuggled, 400, "bad_request"),
            (http11 + "Host: x\r\nTransfer-Encoding: chunked, identity\r\n\r\n" + smuggled, 400, "bad_request"),
            (http11 + "Host: x\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: gzip\r\n\r\n" + smuggled,
             400, "bad_request"),
            (http11 + "Host: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n" + chunked_body, 501, "not_implemented"),
            ("POST /echo HTTP/1.0\r\nIdempotency-Key: {key}\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked_body,
             400, "bad_request"),
            (http11 + "Content-Length: 2\r\n\r\n{{}}", 400, "bad_request"),
            (http11 + "Host: x\r\nHost: y\r\nContent-Length: 2\r\n\r\n{{}}", 400, "bad_request"),
            (http11 + "Host: x/y@z\r\nContent-Length: 2\r\n\r\n{{}}", 400, "bad_request"),
        ]
        before = self.upstream.total()
        for i, (template, status, code) in enumerate(cases):
            key = new_key("framing%d" % i)
            raw = template.format(key=key)
            with self.subTest(raw=raw[:90]):
                c = RawClient(self.gateway.port)
                try:
                    c.send(raw)
                    r = c.read_response(timeout=5)
                    self.assertIsNotNone(r, "closed without an answer")
                    self.assertProblem(r, status, code)
                    self.assertIsNone(c.read_response(timeout=5), "the connection stayed open")
                finally:
                    c.close()
                # The key was never claimed: the same key in a well-formed request executes.
                self.assertExecuted(self.gateway.request("POST", "/echo", "{}", key=key))
        tunnel = RawClient(self.gateway.port)
        try:
            tunnel.send("CONNECT x:443 HTTP/1.1\r\nHost: x:443\r\n\r\n")
            r = tunnel.read_response(timeout=5)
            self.assertIsNotNone(r)
            self.assertProblem(r, 501, "not_implemented")
        finally:
            tunnel.close()
        self.assertEqual(self.upstream.executions(smuggled_key), 0, "a smuggled request executed")
        self.assertEqual(self.upstream.total() - before, len(cases), "only the well-formed retries executed")
        self.assertStillServing()

    def test_upstream_response_framed_two_ways_is_a_504_never_passed_on(self):
        """An upstream response with both Content-Length and chunked framing is neither passed
        on nor stored: the client gets 504 saying why, and as the upstream did execute, the key
        stays in progress (409 for a retry) instead of being released for a second execution."""
        key = new_key()
        r = self.gateway.request("POST", "/malformed-response", "{}", key=key)
        self.assertProblem(r, 504, "upstream_timeout")
        self.assertIn("not valid HTTP", r.json()["detail"])
        self.assertNotIn(b"hello", r.body)
        retry = self.gateway.request("POST", "/malformed-response", "{}", key=key)
        self.assertProblem(retry, 409, "idempotency_key_in_use")
        self.assertEqual(self.upstream.executions(key), 1)
        self.assertStillServing()

    def test_out_of_file_descriptors_recovers_and_logs_sparingly(self):
        """With its file descriptors used up, the gateway neither dies nor spins nor floods its
        log: each listener retries accepting every 50 ms, says so in one line (per 10 s), counts
        the failures, and the gateway serves again once descriptors are free."""
        g = self.start_gateway(CONFIG)
        pid = g.process.pid

        def cpu_seconds():
            with open("/proc/%d/stat" % pid) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

        def logged(listener):
            return [l for l in g.process.log().splitlines() if " %s accept: " % listener in l]

        in_use = len(os.listdir("/proc/%d/fd" % pid))
        soft, hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (in_use + 8, hard))  # the soft limit only
        clients = []
        try:
            for _ in range(40):  # the kernel queues them; the gateway accepts 8 at most
                clients.append(socket.create_connection(("127.0.0.1", g.port), timeout=5))
            self.eventually(lambda: logged("client"), 10, msg="no failed client accept logged")
            # A health check arriving now waits in the admin listener's queue too.
            clients.append(socket.create_connection(("127.0.0.1", g.admin_port), timeout=5))
            self.eventually(lambda: logged("admin"), 10, msg="no failed admin accept logged")
            cpu_before = cpu_seconds()
            time.sleep(1.0)  # ~20 more retries of each accept
            self.assertTrue(g.alive(), "gateway died")
            # Retrying every 50 ms costs next to nothing; an accept loop that spins takes a core.
            self.assertLess(cpu_seconds() - cpu_before, 0.5, "a listener spins on its failed accepts")
        finally:
            for c in clients:
                c.close()
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (soft, hard))
        deadline = time.monotonic() + 10
        while True:  # the closed connections drain from the backlog
            try:
                r = g.request("POST", "/echo", "{}", key=new_key(), timeout=5)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        self.assertExecuted(r)
        self.assertGreaterEqual(g.metrics()["idem_accept_errors_total"], 10)
        for listener in ("client", "admin"):
            lines = logged(listener)
            # One line per 10 s: a second only if the run above took that long.
            self.assertIn(len(lines), (1, 2), "\n".join(lines))
            self.assertIn("retrying every 50 ms", lines[0])

    def test_pipelined_requests_are_answered_in_order(self):
        keys = [new_key("p%d" % i) for i in range(3)]
        c = RawClient(self.gateway.port)
        try:
            c.send(b"".join(b"POST /echo HTTP/1.1\r\nHost: x\r\nIdempotency-Key: " + k.encode() +
                            b"\r\nContent-Length: 2\r\n\r\n{}" for k in keys))
            for k in keys:
                r = c.read_response(timeout=10)
                self.assertIsNotNone(r)
                self.assertExecuted(r)
                self.assertEqual(r.json()["key"], k)
        finally:
            c.close()

    def test_random_mutations_of_requests_never_crash_or_hang_it(self):
        """1,500 requests mutated at random (seeded): bytes flipped, inserted and deleted, lines
        repeated, framing headers given odd values, cut short. Each gets well-formed HTTP answers
        or a close once the client stops sending; so do 300 mutated requests to the admin
        listener. The gateway stays up and serves normally."""
        rng = random.Random(2026)
        status_line = re.compile(rb"HTTP/1\.[01] [1-5][0-9][0-9] ")

        def base():
            key = new_key("fuzz").encode()
            body = b'{"amount":100,"currency":"EUR","note":"fuzz"}'
            framing = rng.choice([
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body),
                b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(body), body),
            ])
            key_header = rng.choice([b"Idempotency-Key: " + key, b'Idempotency-Key: "' + key + b'"'])
            return (rng.choice([b"POST", b"PATCH", b"GET", b"PUT"]) + b" /echo/fuzz?x=1 HTTP/1.1\r\nHost: x\r\n" +
                    key_header + b"\r\nContent-Type: application/json\r\nX-Tenant-Id: t1\r\n" + framing)

        odd_values = [b"-1", b"99999999999999999999", b"0x10", b" 5", b"5, 5", b"", b"\x00", b"chunked, chunked",
                      b"gzip", b"\xff\xfe", b"1e3", b"+5"]

        def mutate(raw):
            for _ in range(rng.randint(1, 4)):
                op = rng.randrange(7)
                at = rng.randrange(len(raw) + 1)
                if op == 0 and raw:    # flip a byte
                    at = min(at, len(raw) - 1)
                    raw = raw[:at] + bytes([rng.randrange(256)]) + raw[at + 1:]
                elif op == 1:          # insert a byte that means something to a parser
                    raw = raw[:at] + rng.choice([b"\r", b"\n", b"\x00", b" ", b":", b"\t", b"\x80", b";"]) + raw[at:]
                elif op == 2:          # delete a span
                    raw = raw[:at] + raw[at + rng.randint(1, 16):]
                elif op == 3:          # repeat a line
                    lines = raw.split(b"\r\n")
                    i = rng.randrange(len(lines))
                    raw = b"\r\n".join(lines[:i + 1] + [lines[i]] + lines[i + 1:])
                elif op == 4:          # an odd framing value
                    name = rng.choice([b"Content-Length", b"Transfer-Encoding"])
                    raw = raw.replace(b"\r\n", b"\r\n" + name + b": " + rng.choice(odd_values) + b"\r\n", 1)
                elif op == 5:          # cut short
                    raw = raw[:at]
                else:                  # a second request behind it on the connection
                    raw = raw + base()
            return raw

        def exchange(port, raw, n):
            """Sends `raw`, ends the sending side, and returns what came back before the close."""
            c = RawClient(port, timeout=5)
            received = b""
            try:
                try:
                    c.send(raw)
                    c.sock.shutdown(socket.SHUT_WR)  # no more bytes: the gateway must answer or close
                    deadline = time.monotonic() + 10
                    while True:
                        c.sock.settimeout(max(0.01, deadline - time.monotonic()))
                        data = c.sock.recv(65536)
                        if not data:
                            break
                        received += data
                except (socket.timeout, TimeoutError):
                    self.fail("case %d: neither answered nor closed within 10 s: %r" % (n, raw[:200]))
                except OSError:
                    pass  # reset, or closed before the shutdown (ENOTCONN): a close
            finally:
                c.close()
            if received:
                self.assertRegex(received[:16], status_line, "case %d: %r -> %r" % (n, raw[:200], received[:200]))
            if n % 100 == 0:
                self.assertTrue(self.gateway.alive(), "gateway died at case %d: %r" % (n, raw[:200]))
            return received

        outcomes = collections.Counter()
        for n in range(1500):
            received = exchange(self.gateway.port, mutate(base()), n)
            outcomes[received[9:10] + b"xx" if received else b"closed"] += 1
        # The admin listener parses HTTP too.
        for n in range(300):
            exchange(self.gateway.admin_port, mutate(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"), n)
        print("\nfirst answers: %s" % dict(outcomes), file=sys.stderr)
        # The mutations must reach past the parser as well as be refused by it.
        self.assertGreater(outcomes[b"2xx"], 100, outcomes)
        self.assertGreater(outcomes[b"4xx"], 100, outcomes)
        self.assertStillServing()
        self.assertEqual(self.gateway.admin("/readyz").status, 200)


# ---- an upstream that answers garbage ----------------------------------------------------------

# Problem codes the gateway answers with when the upstream misbehaves.
UPSTREAM_PROBLEMS = {502: "upstream_unreachable", 504: "upstream_timeout"}
RELEASED = {408, 409, 425, 429}  # SPEC §4.3: these release the key


class MutatingUpstream:
    """A loopback HTTP/1.1 server that reads each request and answers a randomly mutated
    response, chosen by the request's Idempotency-Key (so a retry of a key gets the same one) and
    marked with it (X-For-Key), then usually closes the connection."""

    def __init__(self):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.url = "http://127.0.0.1:%d" % self.port
        self.executions = collections.Counter()
        self.lock = threading.Lock()
        self.stopping = False
        threading.Thread(target=self._accept, daemon=True).start()

    def stop(self):
        self.stopping = True
        self.listener.close()

    def _accept(self):
        while not self.stopping:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        buf = b""
        conn.settimeout(10)
        try:
            while True:
                while b"\r\n\r\n" not in buf:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buf += data
                head, buf = buf.split(b"\r\n\r\n", 1)
                fields = dict((k.strip().lower(), v.strip()) for k, _, v in
                              (line.partition(b":") for line in head.split(b"\r\n")[1:]))
                length = int(fields.get(b"content-length", b"0"))
                while len(buf) < length:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buf += data
                buf = buf[length:]
                key = fields.get(b"idempotency-key", b"").decode()
                with self.lock:
                    self.executions[key] += 1
                rng = random.Random(key)
                # Most answers end the connection, so none waits for a body never sent; half of
                # those say so, the others close unannounced (a request the gateway sends on such
                # a connection meanwhile is reset: the upstream never saw it).
                close = rng.random() < 0.85
                conn.sendall(self._response(rng, key, announce_close=close and rng.random() < 0.5))
                if close:
                    return
        except OSError:
            return
        finally:
            conn.close()

    @staticmethod
    def for_key(key):
        """The X-For-Key value of the response to `key`'s request: the key and a checksum, so
        that a mutation cannot turn it into another key's."""
        return "%s %s" % (key, hashlib.sha1(key.encode()).hexdigest()[:8])

    @staticmethod
    def _response(rng, key, announce_close):
        body = b'{"id":"pay_%d","status":"succeeded"}' % rng.randrange(10**6)
        status = rng.choice([b"200 OK", b"201 Created", b"400 Bad Request", b"404 Not Found", b"409 Conflict",
                             b"500 Internal Server Error", b"503 Service Unavailable"])
        framing = rng.choice([b"Content-Length: %d\r\n\r\n%s" % (len(body), body),
                              b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)])
        raw = (b"HTTP/1.1 " + status + b"\r\nContent-Type: application/json\r\nX-For-Key: " +
               MutatingUpstream.for_key(key).encode() + b"\r\n" +
               (b"Connection: close\r\n" if announce_close else b"") + framing)
        if rng.random() < 0.2:
            return raw  # some answers are well-formed
        for _ in range(rng.randint(1, 3)):
            op = rng.randrange(6)
            at = rng.randrange(len(raw) + 1)
            if op == 0 and raw:
                at = min(at, len(raw) - 1)
                raw = raw[:at] + bytes([rng.randrange(256)]) + raw[at + 1:]
            elif op == 1:
                raw = raw[:at] + rng.choice([b"\r", b"\n", b"\x00", b" ", b":", b"\x80"]) + raw[at:]
            elif op == 2:
                raw = raw[:at] + raw[at + rng.randint(1, 16):]
            elif op == 3:
                lines = raw.split(b"\r\n")
                i = rng.randrange(len(lines))
                raw = b"\r\n".join(lines[:i + 1] + [lines[i]] + lines[i + 1:])
            elif op == 4:
                raw = raw[:at]
            else:  # bytes after the response: a gateway that reused the connection would read
                # them as the next request's answer
                raw = raw + rng.choice([b"garbage", b"\r\n", b"HTTP/1.1 200 OK\r\nX-For-Key: " +
                                        MutatingUpstream.for_key(key).encode() + b"\r\nContent-Length: 0\r\n\r\n"])
        return raw


class HostileUpstreamTest(GatewayTestCase):
    """Whatever the upstream answers, a client gets a well-formed answer, and the key's record
    follows SPEC §4.3: a stored response replays byte for byte; a response the gateway could not
    read leaves the key in progress (504), never executed twice."""

    CONFIG = None

    @classmethod
    def start_class_processes(cls):
        cls.mutating = MutatingUpstream()
        cls._owned.append(cls.mutating)  # stopped after the gateway in front of it
        cls.gateway = cls.start_gateway(
            'upstream_timeout = "1s"\n\n[idempotency]\nlease = "60s"\n\n[[route]]\nmethod = "POST"\n'
            'path = "/pay"\n', upstream_url=cls.mutating.url)

    def test_mutated_upstream_responses_are_answered_and_recorded_by_the_rules(self):
        keys = [new_key("up-fuzz") for _ in range(400)]
        failures = []
        outcomes = collections.Counter()
        lock = threading.Lock()

        def check(key):
            first = self.gateway.request("POST", "/pay", '{"amount":1}', key=key, timeout=15)
            second = self.gateway.request("POST", "/pay", '{"amount":1}', key=key, timeout=15)
            problem = first.header("Content-Type", "").startswith("application/problem+json")
            code = first.json().get("code") if problem else None
            gateway_failed = code is not None and code == UPSTREAM_PROBLEMS.get(first.status)
            why = None
            if gateway_failed and first.status == 504:
                # The request reached the upstream: outcome unknown, the key stays in progress.
                if (second.status, second.header("Content-Type", "").startswith("application/problem+json") and
                        second.json().get("code")) != (409, "idempotency_key_in_use"):
                    why = "a 504 must leave the key in progress, got %r" % second
            elif gateway_failed:
                # 502: the request never left the gateway, so the key was released.
                if second.replayed or second.status == 409:
                    why = "a 502 must release the key, got %r" % second
            elif first.status < 500 and first.status not in RELEASED:
                if not second.replayed or (second.status, second.body) != (first.status, first.body):
                    why = "a stored %d must replay byte for byte, got %r" % (first.status, second)
            elif second.replayed:
                why = "a %d must not be stored, but was replayed: %r" % (first.status, second)
            # Never another request's response (a connection reused out of step).
            for answer in (first, second):
                mark = answer.header("X-For-Key", "")
                other = mark.split(" ")[0]
                if not why and other != key and mark == MutatingUpstream.for_key(other):
                    why = "answered with the response to %s: %r" % (other, answer)
            # Stored: executed once. In doubt (504): at most once (a request sent on a connection
            # the upstream had just closed never reached it), and the retry did not execute it.
            executions = self.mutating.executions[key]
            if not why and not gateway_failed and first.status < 500 and first.status not in RELEASED:
                if executions != 1:
                    why = "a stored response, executed %d times" % executions
            elif not why and gateway_failed and executions > 1:
                why = "a 504 (in doubt), then executed %d times" % executions
            with lock:
                outcomes["%d from the gateway" % first.status if gateway_failed else
                         "%dxx passed on" % (first.status // 100)] += 1
                if why:
                    failures.append((key, why))

        def checker(share):
            for key in share:
                try:
                    check(key)
                except Exception as e:  # a malformed answer or a close: report it with its key
                    with lock:
                        failures.append((key, repr(e)))

        threads = [threading.Thread(target=checker, args=(keys[t::4],)) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        print("\nfirst answers: %s" % dict(outcomes), file=sys.stderr)
        self.assertEqual(failures[:5], [])
        self.assertEqual(sum(outcomes.values()), len(keys))
        self.assertTrue(self.gateway.alive())
        self.assertGreater(outcomes["504 from the gateway"], 50, outcomes)
        self.assertGreater(outcomes["2xx passed on"], 20, outcomes)


if __name__ == "__main__":
    harness.main()
