#!/usr/bin/python3
"""gRPC unary-call idempotency through idem-gateway, end to end: real processes over loopback.

The upstream is tests/grpc/payments_service.py (grpcio, generic handlers, raw bytes), reached by the
gateway over h2c (upstream_protocol = "h2"); clients are grpcio channels on the gateway's plain
listener with h2c prior knowledge ([http2] cleartext = true). The key is the `idempotency-key`
metadata; /payments.Payments/Charge is a required keyed route.

- a call executes once; the same key and message replays the message, initial metadata and
  trailers (`idempotent-replayed: true`); another message is FAILED_PRECONDITION
  (idempotency_key_mismatch); no key is INVALID_ARGUMENT (idempotency_key_missing), a short key or
  two keys INVALID_ARGUMENT (idempotency_key_invalid);
- -bin metadata and a ~700 KB answer to a ~300 KB message replay byte for byte; a gzip-compressed
  call replays; 100 calls with their own keys multiplexed on one connection get their own answers;
- a call while the first runs is ABORTED (idempotency_key_in_use, grpc-retry-pushback-ms); 50
  concurrent calls on one key: one execution, every answer its bytes or ABORTED; a call the client
  cancelled mid-flight is still recorded and replayed;
- DEADLINE_EXCEEDED at the client's deadline and at upstream_timeout; UNAVAILABLE for an upstream
  that is not there;
- an upstream status in grpc_retryable (by default UNAVAILABLE, RESOURCE_EXHAUSTED, ABORTED)
  releases the key, the retry executes and is stored; INVALID_ARGUMENT, NOT_FOUND and
  PERMISSION_DENIED are stored and replayed; the upstream's DEADLINE_EXCEEDED leaves the key in
  progress (its handler may run on); a route's grpc_retryable replaces the list;
- the upstream SIGKILLed mid-call (DEADLINE_EXCEEDED, upstream_timeout: the key stays in
  progress), restarted on its port: after the lease, on_lease_expiry =
  "reexecute" executes again (once), "unknown" answers FAILED_PRECONDITION
  (idempotency_outcome_unknown);
- a server-streaming method (no keyed route) passes through;
- 200 operations through a proxy that loses ~30% of the answers after the gateway sent them
  (tests/grpc/lossy_proxy.py), each retried on UNAVAILABLE on a new channel: each key executed
  exactly once and every operation ended with its first execution's bytes.

    /usr/bin/python3 test_grpc.py --gateway PATH [--store memory|sqlite] [unittest args]

Debian's python3-grpcio: run with /usr/bin/python3.
"""

import argparse
import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import unittest
import uuid

os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")
import grpc  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "gateway"))
import harness  # noqa: E402
from harness import Gateway, free_port, new_key, run_concurrently  # noqa: E402
from lossy_proxy import LossyProxy  # noqa: E402  (tests/grpc)
from h2_raw import H2Connection  # noqa: E402  (tests/common, on the path harness put there)

CHARGE = "/payments.Payments/Charge"
COUNTS = "/payments.Payments/Counts"
STREAM = "/payments.Payments/Stream"
# The default grpc_retryable: an upstream answer with one of these is not stored, the key is
# released. DEADLINE_EXCEEDED is not one: the upstream's handler may still run on after its deadline
# fired, so the key stays in progress until its lease expires.
RETRYABLE = ("UNAVAILABLE", "RESOURCE_EXHAUSTED", "ABORTED")

# No fork() in this process once grpcio runs: grpcio 1.51's thread pool has fork handlers that can
# wait forever for a busy thread (grpc/grpc#31885); a test hung in subprocess.Popen that way. The
# harness's Process forks to run its preexec_fn (PR_SET_PDEATHSIG); without one, Popen uses vfork
# and exec, which run no fork handlers, and setpriv(1) sets the parent-death signal instead.
_SETPRIV = shutil.which("setpriv")


class Process(harness.Process):
    def __init__(self, name, argv, workdir):
        wrapped = [_SETPRIV, "--pdeathsig", "KILL", "--"] + list(argv) if _SETPRIV else list(argv)
        super().__init__(name, wrapped, workdir)
        self.argv = list(argv)


harness._die_with_parent = None  # Popen(preexec_fn=None)
harness.Process = Process  # what harness.Gateway starts its gateways with

# One TCP connection per channel: grpcio shares subchannels (connections) between channels to the
# same target unless told not to, and a test about connections must know which one it uses.
CHANNEL_OPTIONS = [("grpc.use_local_subchannel_pool", 1), ("grpc.enable_retries", 0)]


# ---------------------------------------------------------------------------------------------
# The upstream


class PaymentsService:
    """tests/grpc/payments_service.py on a port of its own; its executions log outlives restarts."""

    def __init__(self, workdir, port=0):
        self.workdir = workdir
        self.log_file = os.path.join(workdir, "payments.%s.executions" % uuid.uuid4().hex[:8])
        self.port = port
        self.process = None
        self.start()

    def start(self, attempts=50):
        last = ""
        for _ in range(attempts):
            port_file = os.path.join(self.workdir, "payments.%s.port" % uuid.uuid4().hex[:8])
            self.process = Process("payments", [sys.executable, os.path.join(HERE, "payments_service.py"),
                                                "--port", str(self.port), "--port-file", port_file,
                                                "--log", self.log_file], self.workdir)
            deadline = time.monotonic() + harness.STARTUP_TIMEOUT
            while not os.path.exists(port_file) and self.process.alive() and time.monotonic() < deadline:
                time.sleep(0.01)
            if os.path.exists(port_file):
                with open(port_file) as f:
                    self.port = int(f.read().strip())
                self.url = "http://127.0.0.1:%d" % self.port
                return self
            last = self.process.log()
            self.process.kill()
            if not self.port:
                break
            time.sleep(0.1)  # the same port again: the old listener may linger a moment
        raise RuntimeError("payments_service did not start:\n" + last)

    def kill(self):
        self.process.kill()

    def restart(self):
        """Started again on the same port, with the same executions log."""
        if self.process.alive():
            self.process.stop()
        return self.start()

    def stop(self):
        return self.process.stop()

    def counts(self):
        """{"executions": {key: n}, "total": N}, asked of the service itself (not the gateway)."""
        with grpc.insecure_channel("127.0.0.1:%d" % self.port, options=CHANNEL_OPTIONS) as ch:
            return json.loads(ch.unary_unary(COUNTS)(b"", timeout=10))

    def executions(self, key):
        """Executions of Charge with this key, from the log (readable while the service is down)."""
        n = 0
        with open(self.log_file, "rb") as f:
            for line in f:
                if line.split(b"\t", 1)[0] == key.encode():
                    n += 1
        return n


# ---------------------------------------------------------------------------------------------
# Calls


class Result:
    """One call's outcome: status, details, response message (None on error), both metadata."""

    def __init__(self, code, details, response, initial, trailing, elapsed):
        self.code = code
        self.details = details
        self.response = response
        self.initial = [(m.key, m.value) for m in (initial or ())]
        self.trailing = [(m.key, m.value) for m in (trailing or ())]
        self.elapsed = elapsed

    def header(self, name):
        return next((v for k, v in self.initial if k == name), None)

    def trailer(self, name):
        return next((v for k, v in self.trailing if k == name), None)

    @property
    def ok(self):
        return self.code == grpc.StatusCode.OK

    @property
    def replayed(self):
        """The replay marker: in the initial metadata, or for an answer without a message (a
        Trailers-Only response, whose one HEADERS frame grpcio reports as trailers) there."""
        v = self.header("idempotent-replayed")
        if v is None and self.response is None:
            v = self.trailer("idempotent-replayed")
        return v == "true"

    @property
    def problem(self):
        return self.trailer("idem-problem-code")

    def custom_initial(self):
        return sorted((k, v) for k, v in self.initial if k != "idempotent-replayed")

    def custom_trailing(self):
        return sorted((k, v) for k, v in self.trailing if k != "idempotent-replayed")

    def __repr__(self):
        return "<Result %s %r response=%r initial=%r trailing=%r %.2fs>" % (
            self.code, self.details, self.response, self.initial, self.trailing, self.elapsed)


def channel(port):
    return grpc.insecure_channel("127.0.0.1:%d" % port, options=CHANNEL_OPTIONS)


def call(port_or_channel, request, key=None, method=CHARGE, timeout=15.0, metadata=()):
    """A unary call (on a new channel unless given one), its outcome as a Result, never raising."""
    own = not isinstance(port_or_channel, grpc.Channel)
    ch = channel(port_or_channel) if own else port_or_channel
    md = list(metadata)
    if key is not None:
        md.append(("idempotency-key", key))
    start = time.monotonic()
    try:
        response, c = ch.unary_unary(method).with_call(request, metadata=md, timeout=timeout)
        return Result(c.code(), c.details(), response, c.initial_metadata(), c.trailing_metadata(),
                      time.monotonic() - start)
    except grpc.RpcError as e:
        return Result(e.code(), e.details(), None, e.initial_metadata(), e.trailing_metadata(),
                      time.monotonic() - start)
    finally:
        if own:
            ch.close()


def charged(request, n=1, pad=0):
    """What Charge answers to `request` on the key's n-th execution."""
    return b"charged:" + request + b":" + str(n).encode() + (bytes(range(256)) * (pad // 256 + 1))[:pad]


# ---------------------------------------------------------------------------------------------
# Gateways


def gateway_config(lease="10s", upstream_timeout="5s", on_lease_expiry="reexecute", extra="", route=""):
    return """\
upstream_protocol = "h2"
upstream_timeout = "%s"
%s
[http2]
cleartext = true

[idempotency]
lease = "%s"
on_lease_expiry = "%s"
%s
[[route]]
method = "POST"
path = "/payments.Payments/Charge"
required = true
%s""" % (upstream_timeout, extra, lease, on_lease_expiry,
         "allow_short_lease = true\n" if _seconds(lease) <= _seconds(upstream_timeout) else "", route)


def _seconds(d):
    return int(d[:-2]) / 1000.0 if d.endswith("ms") else int(d[:-1]) * {"s": 1, "m": 60}[d[-1]]


class GrpcTestCase(unittest.TestCase):
    """A temp dir, a payments service and a gateway (CONFIG) per class, stopped at the end."""

    maxDiff = 4000
    CONFIG = gateway_config()

    @classmethod
    def setUpClass(cls):
        cls.workdir = tempfile.mkdtemp(prefix="idem-grpc-")
        cls._owned = []
        try:
            cls.service = PaymentsService(cls.workdir)
            cls._owned.append(cls.service)
            if cls.CONFIG is not None:  # None: the class starts its own
                cls.gateway = cls.start_gateway(cls.CONFIG)
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls):
        for p in reversed(cls._owned):
            try:
                p.stop()
            except Exception:  # keep stopping the others
                pass
        if os.environ.get("IDEM_E2E_KEEP") != "1":
            shutil.rmtree(cls.workdir, ignore_errors=True)

    @classmethod
    def store_url(cls):
        if harness.ARGS.store == "memory":
            return "memory:"
        return "sqlite:" + os.path.join(cls.workdir, "idem.%s.db" % uuid.uuid4().hex[:8])

    @classmethod
    def start_gateway(cls, config, upstream_url=None):
        g = Gateway(cls.workdir, upstream_url or cls.service.url, cls.store_url(), config)
        cls._owned.append(g)
        return g

    def call(self, request, key=None, **kw):
        return call(self.gateway.port, request, key, **kw)

    def assertExecuted(self, r, response):
        self.assertEqual(r.code, grpc.StatusCode.OK, r)
        self.assertEqual(r.response, response, r)
        self.assertFalse(r.replayed, r)
        self.assertIsNone(r.problem, r)

    def assertReplayOf(self, replay, original):
        """Same status, details, message bytes, custom initial metadata and trailers; marked."""
        self.assertEqual(replay.code, original.code, replay)
        self.assertEqual(replay.details, original.details, replay)
        self.assertEqual(replay.response, original.response, replay)
        self.assertTrue(replay.replayed, replay)
        self.assertFalse(original.replayed, original)
        self.assertEqual(replay.custom_initial(), original.custom_initial(), replay)
        self.assertEqual(replay.custom_trailing(), original.custom_trailing(), replay)

    def assertProblem(self, r, code, problem):
        self.assertEqual(r.code, code, r)
        self.assertEqual(r.problem, problem, r)
        self.assertIsNone(r.response, r)

    def assertInUse(self, r):
        self.assertProblem(r, grpc.StatusCode.ABORTED, "idempotency_key_in_use")
        pushback = r.trailer("grpc-retry-pushback-ms")
        self.assertIsNotNone(pushback, r)
        self.assertRegex(pushback, r"^[0-9]+$", r)

    def wait_executions(self, key, n, timeout=10.0):
        deadline = time.monotonic() + timeout
        while self.service.executions(key) < n:
            if time.monotonic() > deadline:
                self.fail("key %s not executed %d times within %.1fs" % (key, n, timeout))
            time.sleep(0.01)


# ---------------------------------------------------------------------------------------------
# The tour


class UnaryIdempotency(GrpcTestCase):
    def test_a_call_executes_once_and_its_replay_is_the_same_answer(self):
        key = new_key("grpc-tour")
        req = b"amount=100;header=x-charge-id:ch_1;trailer=x-receipt:r-100;trailer=x-ledger-bin-count:2"
        first = self.call(req, key)
        self.assertExecuted(first, charged(req))
        self.assertEqual(first.header("x-charge-id"), "ch_1", first)
        self.assertEqual(first.trailer("x-receipt"), "r-100", first)
        for _ in range(3):
            replay = self.call(req, key)
            self.assertReplayOf(replay, first)
            self.assertEqual(replay.header("idempotent-replayed"), "true", replay)
        self.assertEqual(self.service.executions(key), 1)
        self.assertEqual(self.service.counts()["executions"][key], 1)

    def test_binary_metadata_and_large_messages_replay_byte_for_byte(self):
        key = new_key("grpc-large")
        sig = bytes([0, 255, 10, 13, 58, 0, 128]) + os.urandom(32)
        req = (b"amount=15;pad=400000;header=x-trace-bin:" + os.urandom(16).hex().encode()
               + b";trailer=x-sig-bin:" + sig.hex().encode() + b";" + os.urandom(150000).hex().encode())
        first = self.call(req, key)
        self.assertExecuted(first, charged(req, pad=400000))
        self.assertEqual(first.trailer("x-sig-bin"), sig, first.trailing)
        self.assertIsInstance(first.header("x-trace-bin"), bytes, first.initial)
        replay = self.call(req, key)
        self.assertReplayOf(replay, first)  # the message (~700 KB) and the -bin values, exactly
        self.assertEqual(replay.trailer("x-sig-bin"), sig)
        # One byte different in the 300 KB message: another fingerprint.
        other = req[:-1] + (b"0" if req[-1:] != b"0" else b"1")
        self.assertProblem(self.call(other, key), grpc.StatusCode.FAILED_PRECONDITION, "idempotency_key_mismatch")
        self.assertEqual(self.service.executions(key), 1)

    def test_100_calls_multiplexed_on_one_connection_get_their_own_answers(self):
        keys = [new_key("grpc-mux-%d" % i) for i in range(100)]
        reqs = [b"amount=%d;sleep=%d;trailer=x-op:%d" % (i, (i * 37) % 200, i) for i in range(100)]
        with channel(self.gateway.port) as ch:
            for round_ in ("executed", "replayed"):
                results = run_concurrently(100, lambda i: call(ch, reqs[i], keys[i], timeout=30))
                for i, r in enumerate(results):
                    self.assertIsInstance(r, Result, r)
                    self.assertEqual(r.code, grpc.StatusCode.OK, r)
                    self.assertEqual(r.response, charged(reqs[i]), r)
                    self.assertEqual(r.trailer("x-op"), str(i), r)
                    self.assertEqual(r.replayed, round_ == "replayed", r)
        counts = self.service.counts()["executions"]
        self.assertEqual([counts.get(k) for k in keys], [1] * 100)

    def test_the_same_key_with_another_message_is_a_mismatch(self):
        key = new_key("grpc-mismatch")
        self.assertExecuted(self.call(b"amount=1", key), charged(b"amount=1"))
        r = self.call(b"amount=2", key)
        self.assertProblem(r, grpc.StatusCode.FAILED_PRECONDITION, "idempotency_key_mismatch")
        replay = self.call(b"amount=1", key)
        self.assertTrue(replay.replayed, replay)
        self.assertEqual(replay.response, charged(b"amount=1"), replay)
        self.assertEqual(self.service.executions(key), 1)

    def test_a_call_without_a_key_is_refused(self):
        before = self.service.counts()["total"]
        r = self.call(b"amount=3")
        self.assertProblem(r, grpc.StatusCode.INVALID_ARGUMENT, "idempotency_key_missing")
        # A key too short, and two keys: invalid.
        self.assertProblem(self.call(b"amount=3", "short-key"), grpc.StatusCode.INVALID_ARGUMENT,
                           "idempotency_key_invalid")
        self.assertProblem(self.call(b"amount=3", new_key("one"), metadata=[("idempotency-key", new_key("two"))]),
                           grpc.StatusCode.INVALID_ARGUMENT, "idempotency_key_invalid")
        self.assertEqual(self.service.counts()["total"], before)

    def test_a_call_while_the_first_runs_is_aborted_with_a_pushback(self):
        key = new_key("grpc-in-use")
        req = b"amount=4;sleep=1500"
        results = {}
        t = threading.Thread(target=lambda: results.setdefault("first", self.call(req, key)))
        t.start()
        self.wait_executions(key, 1)
        r = self.call(req, key)
        self.assertInUse(r)
        t.join(15)
        self.assertExecuted(results["first"], charged(req))
        self.assertReplayOf(self.call(req, key), results["first"])
        self.assertEqual(self.service.executions(key), 1)

    def test_a_call_the_client_cancelled_is_still_recorded(self):
        """A client gone (RST_STREAM CANCEL) while the upstream runs: the gateway waits for the
        answer and records it; the retry meets the key in use, then the replay."""
        key = new_key("grpc-cancel")
        req = b"amount=16;sleep=800;trailer=x-receipt:r-16"
        with channel(self.gateway.port) as ch:
            future = ch.unary_unary(CHARGE).future(req, metadata=[("idempotency-key", key)])
            self.wait_executions(key, 1)
            self.assertTrue(future.cancel())
        self.assertInUse(self.call(req, key))
        deadline = time.monotonic() + 10
        while True:
            r = self.call(req, key)
            if r.code != grpc.StatusCode.ABORTED or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        self.assertEqual(r.code, grpc.StatusCode.OK, r)
        self.assertTrue(r.replayed, r)
        self.assertEqual(r.response, charged(req), r)
        self.assertEqual(r.trailer("x-receipt"), "r-16", r)
        self.assertEqual(self.service.executions(key), 1)

    def test_a_gzip_compressed_call_replays(self):
        key = new_key("grpc-gzip")
        req = b"amount=17;" + b"z" * 4000
        with grpc.insecure_channel("127.0.0.1:%d" % self.gateway.port, options=CHANNEL_OPTIONS,
                                   compression=grpc.Compression.Gzip) as ch:
            first = call(ch, req, key)
            self.assertExecuted(first, charged(req))
            replay = call(ch, req, key)
            self.assertReplayOf(replay, first)
        self.assertEqual(self.service.executions(key), 1)

    def test_50_concurrent_calls_with_one_key_execute_once(self):
        key = new_key("grpc-50")
        req = b"amount=50;sleep=300"
        channels = [channel(self.gateway.port) for _ in range(50)]
        try:
            results = run_concurrently(50, lambda i: call(channels[i], req, key, timeout=30))
        finally:
            for ch in channels:
                ch.close()
        ok = [r for r in results if isinstance(r, Result) and r.ok]
        aborted = [r for r in results if isinstance(r, Result) and r.code == grpc.StatusCode.ABORTED]
        self.assertEqual(len(ok) + len(aborted), 50, results)
        self.assertGreaterEqual(len(ok), 1, results)
        for r in ok:
            self.assertEqual(r.response, charged(req), r)
        self.assertEqual(len([r for r in ok if not r.replayed]), 1, ok)
        for r in aborted:
            self.assertInUse(r)
        self.assertEqual(self.service.executions(key), 1)
        # Once it finished, every retry is the replay.
        self.assertTrue(self.call(req, key).replayed)
        self.assertEqual(self.service.executions(key), 1)


class UpstreamStatuses(GrpcTestCase):
    def test_a_retryable_status_releases_the_key(self):
        for code in RETRYABLE:
            with self.subTest(code=code):
                key = new_key("grpc-retryable")
                req = b"amount=7;fail_first=" + code.encode() + b";trailer=x-attempt-note:first-fails"
                first = self.call(req, key)
                self.assertEqual(first.code, getattr(grpc.StatusCode, code), first)
                self.assertEqual(first.details, "charge failed: " + code, first)
                self.assertIsNone(first.problem, first)  # the upstream's answer, not the gateway's
                self.assertEqual(first.trailer("x-attempt-note"), "first-fails", first)
                self.assertFalse(first.replayed, first)
                # Released: the retry executes (the second execution succeeds) and is stored.
                second = self.call(req, key)
                self.assertExecuted(second, charged(req, 2))
                self.assertReplayOf(self.call(req, key), second)
                self.assertEqual(self.service.executions(key), 2)

    def test_an_answer_above_max_stored_response_is_relayed_and_never_executed_again(self):
        # 1.1 MB against the default max_stored_response (1 MiB): the client gets the whole answer,
        # the record says "executed, not stored", and a retry learns that instead of executing
        # again, also after the lease (on_lease_expiry = "reexecute" here).
        key = new_key("grpc-oversized")
        req = b"amount=11;pad=1100000"
        first = self.call(req, key)
        self.assertExecuted(first, charged(req, pad=1100000))
        for _ in range(2):
            self.assertProblem(self.call(req, key), grpc.StatusCode.FAILED_PRECONDITION,
                               "idempotency_response_not_stored")
        self.assertEqual(self.service.executions(key), 1)

    def test_an_upstream_deadline_exceeded_leaves_the_key_in_progress(self):
        key = new_key("grpc-upstream-deadline")
        req = b"amount=6;fail_first=DEADLINE_EXCEEDED"
        first = self.call(req, key)
        self.assertEqual(first.code, grpc.StatusCode.DEADLINE_EXCEEDED, first)
        self.assertEqual(first.details, "charge failed: DEADLINE_EXCEEDED", first)  # the upstream's
        self.assertIsNone(first.problem, first)
        for _ in range(2):
            self.assertInUse(self.call(req, key))
        self.assertEqual(self.service.executions(key), 1)

    def test_a_routes_grpc_retryable_decides_what_is_released(self):
        gw = self.start_gateway(gateway_config(route='grpc_retryable = ["RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED"]\n'))
        for code, released in (("RESOURCE_EXHAUSTED", True), ("DEADLINE_EXCEEDED", True),
                               ("UNAVAILABLE", False), ("ABORTED", False)):
            with self.subTest(code=code):
                key = new_key("grpc-route-retryable")
                req = b"amount=5;fail_first=" + code.encode()
                first = call(gw.port, req, key)
                self.assertEqual(first.code, getattr(grpc.StatusCode, code), first)
                self.assertIsNone(first.problem, first)
                second = call(gw.port, req, key)
                if released:
                    self.assertExecuted(second, charged(req, 2))
                    self.assertReplayOf(call(gw.port, req, key), second)
                    self.assertEqual(self.service.executions(key), 2)
                else:  # stored: replayed, status and message
                    self.assertReplayOf(second, first)
                    self.assertEqual(self.service.executions(key), 1)

    def test_a_non_retryable_status_is_stored_and_replayed(self):
        for code in ("INVALID_ARGUMENT", "NOT_FOUND", "PERMISSION_DENIED"):
            with self.subTest(code=code):
                key = new_key("grpc-stored-error")
                req = b"amount=-1;fail=" + code.encode() + b";trailer=x-reason:bad-amount"
                first = self.call(req, key)
                self.assertEqual(first.code, getattr(grpc.StatusCode, code), first)
                self.assertEqual(first.details, "charge failed: " + code, first)
                self.assertEqual(first.trailer("x-reason"), "bad-amount", first)
                self.assertIsNone(first.problem, first)
                self.assertFalse(first.replayed, first)
                for _ in range(2):
                    self.assertReplayOf(self.call(req, key), first)
                self.assertEqual(self.service.executions(key), 1)

    def test_deadline_exceeded_at_the_clients_deadline(self):
        key = new_key("grpc-deadline")
        r = self.call(b"amount=8;sleep=3000", key, timeout=0.5)
        self.assertEqual(r.code, grpc.StatusCode.DEADLINE_EXCEEDED, r)
        self.assertLess(r.elapsed, 2.5, r)
        self.wait_executions(key, 1)  # it was forwarded

    def test_deadline_exceeded_at_upstream_timeout(self):
        gw = self.start_gateway(gateway_config(lease="10s", upstream_timeout="1s"))
        key = new_key("grpc-upstream-timeout")
        r = call(gw.port, b"amount=9;sleep=4000", key, timeout=20)
        self.assertEqual(r.code, grpc.StatusCode.DEADLINE_EXCEEDED, r)
        self.assertIsNone(r.response, r)
        self.assertGreater(r.elapsed, 0.8, r)
        self.assertLess(r.elapsed, 3.5, r)  # the gateway's 1 s, not the upstream's 4 s
        self.assertEqual(self.service.executions(key), 1)

    def test_the_grpc_timeout_bounds_the_upstream_wait(self):
        """grpc-timeout below upstream_timeout: the call's own deadline bounds the wait. Sent with
        the raw HTTP/2 client, which has no deadline of its own: the answer is the gateway's (or
        the upstream's, if the gateway passes the deadline on), at ~1 s, not at the 5 s sleep."""
        gw = self.start_gateway(gateway_config(lease="60s", upstream_timeout="30s"))
        key = new_key("grpc-timeout")
        msg = b"amount=10;sleep=5000"
        with H2Connection(gw.port) as conn:
            start = time.monotonic()
            sid = conn.request("POST", CHARGE, [("content-type", "application/grpc"), ("te", "trailers"),
                                                ("grpc-timeout", "1000m"), ("idempotency-key", key)],
                               body=b"\0" + len(msg).to_bytes(4, "big") + msg)
            r = conn.response(sid, timeout=10)
            elapsed = time.monotonic() - start
        self.assertEqual(r.status, 200, r)
        status = dict(r.trailers).get("grpc-status") or r.header("grpc-status")
        self.assertEqual(status, "4", r)  # DEADLINE_EXCEEDED
        self.assertGreater(elapsed, 0.8, r)
        self.assertLess(elapsed, 3.0, r)
        self.assertEqual(self.service.executions(key), 1)

    def test_an_unreachable_upstream_is_unavailable(self):
        gw = self.start_gateway(gateway_config(), upstream_url="http://127.0.0.1:%d" % free_port())
        key = new_key("grpc-unreachable")
        for _ in range(2):  # nothing was sent: the key is released, the retry meets the same
            r = call(gw.port, b"amount=11", key, timeout=20)
            self.assertEqual(r.code, grpc.StatusCode.UNAVAILABLE, r)
            self.assertIsNone(r.response, r)
            self.assertFalse(r.replayed, r)
        self.assertEqual(self.service.executions(key), 0)

    def test_a_streaming_method_passes_through(self):
        ch = channel(self.gateway.port)
        try:
            stream = ch.unary_stream(STREAM)(b"n=5;gap=20", timeout=15)
            items = list(stream)
            self.assertEqual(stream.code(), grpc.StatusCode.OK)
            self.assertEqual(items, [b"item:%d" % i for i in range(5)])
            # With a key too: a streaming method is not a keyed route, nothing is stored.
            stream = ch.unary_stream(STREAM)(b"n=3", timeout=15,
                                             metadata=[("idempotency-key", new_key("grpc-stream"))])
            self.assertEqual(list(stream), [b"item:0", b"item:1", b"item:2"])
            self.assertNotIn(("idempotent-replayed", "true"), [(m.key, m.value) for m in stream.initial_metadata()])
        finally:
            ch.close()
        # An unkeyed unary method passes through as well.
        r = self.call(b"", method=COUNTS)
        self.assertTrue(r.ok, r)
        self.assertIn("executions", json.loads(r.response))


# ---------------------------------------------------------------------------------------------
# The upstream killed mid-call, the lease running out


class StoreUnavailable(GrpcTestCase):
    """The store stops answering (its own Redis, SIGSTOPped): a call is refused UNAVAILABLE with a
    pushback, nothing is forwarded, and once the store answers again the retry executes once."""

    CONFIG = None  # the gateway needs the class's Redis first

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        try:
            cls.redis_port = free_port()
            redis = shutil.which("redis-server") or "/usr/bin/redis-server"
            cls.redis = Process("redis", [redis, "--port", str(cls.redis_port), "--bind", "127.0.0.1",
                                          "--save", "", "--appendonly", "no"], cls.workdir)
            cls._owned.append(cls.redis)
            deadline = time.monotonic() + harness.STARTUP_TIMEOUT
            while True:
                try:
                    socket.create_connection(("127.0.0.1", cls.redis_port), timeout=1).close()
                    break
                except OSError:
                    if time.monotonic() > deadline or not cls.redis.alive():
                        raise RuntimeError("redis-server did not start: " + cls.redis.log())
                    time.sleep(0.02)
            g = Gateway(cls.workdir, cls.service.url, "redis://127.0.0.1:%d" % cls.redis_port,
                        'store_timeout = "500ms"\n' + gateway_config())
            cls._owned.append(g)
            cls.gateway = g
        except BaseException:
            cls.tearDownClass()
            raise

    def test_a_store_that_does_not_answer_is_unavailable_with_a_pushback(self):
        key = new_key("grpc-store-down")
        req = b"amount=12"
        self.redis.signal(signal.SIGSTOP)
        try:
            r = self.call(req, key)
        finally:
            self.redis.signal(signal.SIGCONT)
        self.assertProblem(r, grpc.StatusCode.UNAVAILABLE, "idempotency_store_unavailable")
        self.assertRegex(r.trailer("grpc-retry-pushback-ms") or "", r"^[0-9]+$", r)
        self.assertEqual(self.service.executions(key), 0, "nothing forwarded while the store was away")
        # The store back: the retry executes (once), and its retry replays.
        deadline = time.monotonic() + 10
        while True:
            second = self.call(req, key)
            if second.code != grpc.StatusCode.UNAVAILABLE and second.problem != "idempotency_key_in_use":
                break
            self.assertLess(time.monotonic(), deadline, second)
            time.sleep(0.2)
        self.assertExecuted(second, charged(req))
        self.assertReplayOf(self.call(req, key), second)
        self.assertEqual(self.service.executions(key), 1)


class LeaseExpiryCase(GrpcTestCase):
    """SIGKILL the service while a slow Charge runs and restart it on its port; retries before the
    lease ran out are ABORTED (in use); after it, on_lease_expiry decides."""

    POLICY = None
    LEASE = 2.0

    def kill_mid_call(self, key, req):
        results = {}
        t = threading.Thread(target=lambda: results.setdefault("first", self.call(req, key, timeout=20)))
        claimed = time.monotonic()
        t.start()
        self.wait_executions(key, 1)
        self.service.kill()
        t.join(15)
        first = results["first"]
        # The upstream's connection broke mid-call: the gateway's upstream_timeout answer (the HTTP
        # 504 path), DEADLINE_EXCEEDED.
        self.assertProblem(first, grpc.StatusCode.DEADLINE_EXCEEDED, "upstream_timeout")
        # Whether the upstream executed is unknown: the key stays in progress until the lease ends.
        self.assertLess(time.monotonic() - claimed, self.LEASE - 0.3, "too slow to see the lease held")
        self.assertInUse(self.call(req, key))
        self.service.restart()
        time.sleep(max(0.0, claimed + self.LEASE + 0.5 - time.monotonic()))
        return first


class LeaseExpiryReexecute(LeaseExpiryCase):
    CONFIG = gateway_config(lease="2s", upstream_timeout="30s", on_lease_expiry="reexecute")

    def test_after_the_lease_the_retry_executes_again_once(self):
        key = new_key("grpc-takeover")
        req = b"amount=12;sleep_first=20000"
        self.kill_mid_call(key, req)
        second = self.call(req, key)
        self.assertExecuted(second, charged(req, 2))
        self.assertReplayOf(self.call(req, key), second)
        self.assertEqual(self.service.executions(key), 2)
        self.assertEqual(self.service.counts()["executions"][key], 2)


class LeaseExpiryUnknown(LeaseExpiryCase):
    CONFIG = gateway_config(lease="2s", upstream_timeout="30s", on_lease_expiry="unknown")

    def test_after_the_lease_the_retry_is_an_unknown_outcome(self):
        key = new_key("grpc-unknown")
        req = b"amount=13;sleep_first=20000"
        self.kill_mid_call(key, req)
        for _ in range(2):
            self.assertProblem(self.call(req, key), grpc.StatusCode.FAILED_PRECONDITION,
                               "idempotency_outcome_unknown")
        self.assertEqual(self.service.executions(key), 1)
        # Another key is unaffected: the restarted service answers through the gateway.
        other = new_key("grpc-unknown-other")
        self.assertExecuted(self.call(b"amount=14", other), charged(b"amount=14"))


# ---------------------------------------------------------------------------------------------
# A client retrying through a lossy network


class LossyNetwork(GrpcTestCase):
    OPERATIONS = 200
    WORKERS = 8
    MAX_ATTEMPTS = 30

    def test_200_operations_through_a_lossy_proxy_have_no_duplicate_effect(self):
        proxy = LossyProxy(self.gateway.port, loss=0.3)
        try:
            outcomes = [None] * self.OPERATIONS
            keys = [new_key("grpc-lossy-%d" % i) for i in range(self.OPERATIONS)]
            next_op = iter(range(self.OPERATIONS))
            lock = threading.Lock()

            def operation(i):
                req = b"op=%d;amount=%d" % (i, i * 10)
                attempts = []
                for _ in range(self.MAX_ATTEMPTS):
                    r = call(proxy.port, req, keys[i], timeout=10)  # a new channel each attempt
                    attempts.append(r)
                    if r.code == grpc.StatusCode.UNAVAILABLE:
                        continue
                    if r.code == grpc.StatusCode.ABORTED and r.problem == "idempotency_key_in_use":
                        time.sleep(min(int(r.trailer("grpc-retry-pushback-ms") or "50"), 200) / 1000.0)
                        continue
                    break
                return req, attempts

            def worker():
                while True:
                    with lock:
                        i = next(next_op, None)
                    if i is None:
                        return
                    try:
                        outcomes[i] = operation(i)
                    except Exception as e:  # report, don't hide
                        outcomes[i] = e

            threads = [threading.Thread(target=worker, daemon=True) for _ in range(self.WORKERS)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(120)
        finally:
            proxy.close()

        counts = self.service.counts()["executions"]
        lost = replayed = 0
        for i, outcome in enumerate(outcomes):
            self.assertIsInstance(outcome, tuple, outcome)
            req, attempts = outcome
            final = attempts[-1]
            self.assertEqual(final.code, grpc.StatusCode.OK, attempts)
            self.assertEqual(final.response, charged(req), attempts)  # the first execution's bytes
            self.assertEqual(counts.get(keys[i]), 1, attempts)  # executed exactly once
            failed = [a for a in attempts[:-1]]
            for a in failed:
                self.assertIn(a.code, (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.ABORTED), a)
            # An answer lost after the upstream executed is replayed on the retry; an operation
            # whose first answer got through was not a replay.
            self.assertEqual(final.replayed, bool(failed), attempts)
            lost += sum(1 for a in failed if a.code == grpc.StatusCode.UNAVAILABLE)
            replayed += final.replayed
        print("\n  lossy proxy: %d connections, %d answers lost, %d operations ended in a replay"
              % (proxy.connections, proxy.dropped, replayed), file=sys.stderr)
        self.assertEqual(lost, proxy.dropped, "client saw %d lost answers, proxy dropped %d" % (lost, proxy.dropped))
        self.assertGreaterEqual(proxy.dropped, 20, "the proxy lost too few answers to mean anything")
        self.assertGreaterEqual(replayed, 20)


# ---------------------------------------------------------------------------------------------


def main():
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--gateway", required=True, help="path to idem-gateway")
    parser.add_argument("--store", choices=("memory", "sqlite"), default="memory")
    args, rest = parser.parse_known_args()
    args.upstream_bin = None
    harness.ARGS = args
    # SIGTERM (ctest, CI cancelling) unwinds like a failure, so tearDownClass stops the children.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    if not os.access(args.gateway, os.X_OK):
        print("not an executable: %s" % args.gateway, file=sys.stderr)
        sys.exit(2)
    harness.run_tests(rest, dump=("gateway", "payments"))


if __name__ == "__main__":
    main()
