"""Shared machinery for the idem-gateway end-to-end tests: real processes over loopback.

Every test module starts its own fixture upstream and gateway(s) on free ports, waits until they
are ready, and stops them by PID at the end, even when a test fails. Nothing here sleeps without
a bound: every wait has a deadline.

Command line of every module (ctest passes the binaries):
    python3 test_x.py --gateway PATH --upstream-bin PATH [--store memory|sqlite] [unittest args]
"""

import argparse
import ctypes
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import uuid

ARGS = None  # filled by main()
_PROCESSES = []  # every Process started, for the log dump on failure

STARTUP_TIMEOUT = 15.0
STOP_TIMEOUT = 15.0


# ---------------------------------------------------------------------------------------------
# Ports and processes


def _die_with_parent():
    """Runs in the child before exec: if the test process is killed (ctest timeout), so is the
    child, instead of lingering on its port."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


# A port that was free a moment ago and that this process never handed out before
# (tests/common/ports.py; the caller retries if another process takes it).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from ports import free_port  # noqa: E402,F401


# The environment scripts/test exports for the shared stores (scripts/lib/servers.sh).
SHARED_STORE_ENV = {
    "postgres": "IDEM_TEST_POSTGRES_URL",
    "redis": "IDEM_TEST_REDIS_URL",
    "redis_cluster": "IDEM_TEST_REDIS_CLUSTER_URL",
}


def shared_store_url(store=None):
    """The URL of the shared store under test (--store unless given), from the environment."""
    var = SHARED_STORE_ENV[store or ARGS.store]
    url = os.environ.get(var)
    if not url:
        raise RuntimeError("%s is not set: run through scripts/test, which starts the servers" % var)
    return url


def new_key(prefix="k"):
    """A fresh, valid Idempotency-Key (>= 16 visible ASCII characters)."""
    return "%s-%s" % (prefix, uuid.uuid4().hex)


class Process:
    """A child process with its output in a log file, stopped by PID."""

    def __init__(self, name, argv, workdir):
        self.name = name
        self.argv = argv
        self.log_path = os.path.join(workdir, "%s.%d.log" % (name, len(_PROCESSES)))
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
        self.pid = self.proc.pid
        self.saved_log = None  # kept after the temp dir is gone, for the dump on failure
        _PROCESSES.append(self)

    def alive(self):
        return self.proc.poll() is None

    def signal(self, sig):
        if self.alive():
            os.kill(self.pid, sig)

    def wait(self, timeout):
        """Exit code, or None if still running after `timeout` seconds."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, timeout=STOP_TIMEOUT):
        """SIGTERM, then SIGKILL after `timeout`; returns the exit code."""
        if self.alive():
            os.kill(self.pid, signal.SIGTERM)
            if self.wait(timeout) is None:
                os.kill(self.pid, signal.SIGKILL)
                self.proc.wait()
        self._finish()
        return self.proc.returncode

    def kill(self):
        if self.alive():
            os.kill(self.pid, signal.SIGKILL)
        self.proc.wait()
        self._finish()
        return self.proc.returncode

    def _finish(self):
        if not self._log.closed:
            self._log.close()
            self.saved_log = self.log()

    def log(self):
        if self.saved_log is not None:
            return self.saved_log
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def wait_log(self, text, timeout=5.0):
        """The log once it holds `text` (a line the process writes after it answered may land a
        moment later), or the log as it is after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            log = self.log()
            if text in log or time.monotonic() > deadline:
                return log
            time.sleep(0.02)


class Upstream:
    """The fixture upstream (testing/fixture_upstream), on a port it chose itself."""

    def __init__(self, workdir, port=0):
        port_file = os.path.join(workdir, "upstream.%s.port" % uuid.uuid4().hex[:8])
        self.process = Process("upstream", [ARGS.upstream_bin, "--listen", "127.0.0.1:%d" % port,
                                            "--port-file", port_file], workdir)
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while not os.path.exists(port_file):
            if not self.process.alive():
                raise RuntimeError("fixture upstream exited: " + self.process.log())
            if time.monotonic() > deadline:
                raise RuntimeError("fixture upstream did not start")
            time.sleep(0.01)
        with open(port_file) as f:
            self.port = int(f.read().strip())
        self.url = "http://127.0.0.1:%d" % self.port

    def get_json(self, path):
        r = request(self.port, "GET", path)
        assert r.status == 200, r
        return json.loads(r.body)

    def executions(self, key):
        """How many times the upstream executed requests carrying this key (any tenant)."""
        return self.get_json("/executions?key=" + key)["count"]

    def total(self):
        return self.get_json("/counts")["total"]

    def reset(self):
        request(self.port, "POST", "/reset")

    def stop(self):
        return self.process.stop()


class Gateway:
    """idem-gateway with a TOML config, on free ports; ready when admin /healthz answers 200."""

    def __init__(self, workdir, upstream_url, store, config="", extra_args=(), start=True,
                 port=None, admin_port=None):
        self.workdir = workdir
        self.upstream_url = upstream_url
        self.store = store
        self.config_text = config
        self.extra_args = list(extra_args)
        self.port = port
        self.admin_port = admin_port
        self.process = None
        if start:
            self.start()

    def start(self, attempts=5):
        """Starts on the given ports, or on fresh free ports (retrying if one was taken)."""
        fixed = self.port is not None
        last = ""
        for _ in range(attempts if not fixed else 1):
            if not fixed:
                self.port, self.admin_port = free_port(), free_port()
            self.config_path = os.path.join(self.workdir, "gateway.%s.toml" % uuid.uuid4().hex[:8])
            with open(self.config_path, "w") as f:
                f.write(self.config_text)
            argv = [ARGS.gateway, "--config", self.config_path,
                    "--listen", "127.0.0.1:%d" % self.port,
                    "--admin-listen", "127.0.0.1:%d" % self.admin_port,
                    "--upstream", self.upstream_url, "--store", self.store] + self.extra_args
            self.process = Process("gateway", argv, self.workdir)
            if self._wait_ready():
                return self
            last = self.process.log()
            self.process.kill()
            if fixed:
                break
        raise RuntimeError("idem-gateway did not become ready; last log:\n" + last)

    def _wait_ready(self):
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while time.monotonic() < deadline:
            if not self.process.alive():
                return False
            try:
                r = request(self.admin_port, "GET", "/healthz", timeout=1.0)
                if r.status == 200 and can_connect(self.port):
                    return True
            except OSError:
                pass
            time.sleep(0.02)
        return False

    def request(self, method, path, body=None, headers=(), key=None, timeout=30.0):
        hs = list(headers)
        if key is not None:
            hs.append(("Idempotency-Key", key))
        return request(self.port, method, path, body, hs, timeout=timeout)

    def admin(self, path):
        return request(self.admin_port, "GET", path)

    def metrics(self):
        r = self.admin("/metrics")
        assert r.status == 200, r
        return parse_metrics(r.body.decode())

    def alive(self):
        return self.process is not None and self.process.alive()

    def stop(self):
        return self.process.stop() if self.process else None

    def restart(self, crash=False):
        """Stops (SIGTERM, or SIGKILL when `crash`) and starts again on the same ports and store."""
        if crash:
            self.process.kill()
        else:
            self.stop()
        fixed_port, fixed_admin = self.port, self.admin_port
        for _ in range(50):  # the old listener may linger a moment
            try:
                self.port, self.admin_port = fixed_port, fixed_admin
                return self.start()
            except RuntimeError:
                time.sleep(0.1)
        raise RuntimeError("idem-gateway did not restart")


def can_connect(port, timeout=1.0):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout):
            return True
    except OSError:
        return False


# ---------------------------------------------------------------------------------------------
# HTTP


class Response:
    def __init__(self, status, headers, body):
        self.status = status
        self.headers = headers  # list of (name, value) in wire order, duplicates kept
        self.body = body

    def header(self, name, default=None):
        for k, v in self.headers:
            if k.lower() == name.lower():
                return v
        return default

    def header_all(self, name):
        return [v for k, v in self.headers if k.lower() == name.lower()]

    def json(self):
        return json.loads(self.body)

    @property
    def replayed(self):
        return self.header("Idempotent-Replayed") == "true"

    @property
    def execution_id(self):
        return self.header("X-Execution-Id")

    def __repr__(self):
        body = self.body[:300]
        return "<Response %d %r %r>" % (self.status, self.headers, body)


def request(port, method, path, body=None, headers=(), timeout=30.0):
    """One request on a new connection; header values may be str or raw bytes."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.putrequest(method, path, skip_accept_encoding=True)
        names = {k.lower() for k, _ in headers}
        for k, v in headers:
            conn.putheader(k, v)
        if body is not None and "content-length" not in names and "transfer-encoding" not in names:
            conn.putheader("Content-Length", str(len(body)))
        elif body is None and method in ("POST", "PUT", "PATCH") and "content-length" not in names:
            conn.putheader("Content-Length", "0")
        conn.endheaders(body.encode() if isinstance(body, str) else body)
        r = conn.getresponse()
        data = r.read()
        return Response(r.status, r.getheaders(), data)
    finally:
        conn.close()


class RawClient:
    """A raw TCP connection, for requests http.client refuses to send."""

    def __init__(self, port, timeout=10.0):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.buf = b""

    def send(self, data):
        self.sock.sendall(data if isinstance(data, bytes) else data.encode("latin-1"))

    def read_response(self, timeout=10.0):
        """The next response, or None if the peer closed first. Raises socket.timeout."""
        self.sock.settimeout(timeout)
        deadline = time.monotonic() + timeout
        while b"\r\n\r\n" not in self.buf:
            if not self._fill(deadline):
                return None
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ")[1])
        headers = [tuple(s.strip() for s in l.split(":", 1)) for l in lines[1:]]
        length = 0
        chunked = False
        for k, v in headers:
            if k.lower() == "content-length":
                length = int(v)
            if k.lower() == "transfer-encoding" and "chunked" in v.lower():
                chunked = True
        if chunked:
            body = b""
            while True:
                while b"\r\n" not in self.buf:
                    if not self._fill(deadline):
                        return Response(status, headers, body)
                size_line, self.buf = self.buf.split(b"\r\n", 1)
                size = int(size_line.split(b";")[0], 16)
                while len(self.buf) < size + 2:
                    if not self._fill(deadline):
                        return Response(status, headers, body)
                body += self.buf[:size]
                self.buf = self.buf[size + 2:]
                if size == 0:
                    break
        else:
            while len(self.buf) < length:
                if not self._fill(deadline):
                    break
            body, self.buf = self.buf[:length], self.buf[length:]
        return Response(status, headers, body)

    def _fill(self, deadline):
        self.sock.settimeout(max(0.01, deadline - time.monotonic()))
        data = self.sock.recv(65536)
        if not data:
            return False
        self.buf += data
        return True

    def closed_by_peer(self, timeout):
        """True if the peer closes (or resets) within `timeout` seconds; data read is kept."""
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                self.sock.settimeout(max(0.01, deadline - time.monotonic()))
                data = self.sock.recv(65536)
                if not data:
                    return True
                self.buf += data
        except (socket.timeout, TimeoutError):
            return False
        except (ConnectionResetError, BrokenPipeError):
            return True
        return False

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


# ---------------------------------------------------------------------------------------------
# Metrics


def parse_metrics(text):
    """Prometheus text → {'name{labels}': value} (labels as written)."""
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            name, value = line.rsplit(" ", 1)
            if " " in name and "}" not in name:  # "name value timestamp"
                name, value = line.split(" ")[0], line.split(" ")[1]
            out[name] = float(value)
        except ValueError:
            continue
    return out


# ---------------------------------------------------------------------------------------------
# Test case base


class GatewayTestCase(unittest.TestCase):
    """A test class with its own temp dir, fixture upstream and gateway(s), stopped at the end."""

    maxDiff = 4000
    CONFIG = ""  # TOML text for the class's gateway; None = no gateway started in setUpClass

    @classmethod
    def setUpClass(cls):
        cls.workdir = tempfile.mkdtemp(prefix="idem-e2e-")
        cls._owned = []
        try:
            cls.upstream = Upstream(cls.workdir)
            cls._owned.append(cls.upstream)
            cls.gateway = None
            if cls.CONFIG is not None:
                cls.gateway = cls.start_gateway(cls.CONFIG)
            cls.start_class_processes()
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def start_class_processes(cls):
        """What a test class starts besides the upstream and CONFIG's gateway: its gateways and
        servers, each added to cls._owned (start_gateway does that) so that they are stopped at
        the end, or at once if one of them fails to start."""

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
    def store_url(cls, name="idem.db"):
        if ARGS.store == "memory":
            return "memory:"
        return "sqlite:" + os.path.join(cls.workdir, name)

    @classmethod
    def start_gateway(cls, config, store=None, upstream_url=None, **kw):
        g = Gateway(cls.workdir, upstream_url or cls.upstream.url, store or cls.store_url(), config, **kw)
        cls._owned.append(g)
        return g

    # -- assertions ----------------------------------------------------------------------------

    def assertProblem(self, r, status, code):
        """An RFC 9457 problem+json answer with this status and code (any code if None) (SPEC §7)."""
        self.assertEqual(r.status, status, r)
        ctype = (r.header("Content-Type") or "").split(";")[0].strip().lower()
        self.assertEqual(ctype, "application/problem+json", r)
        doc = r.json()
        for field in ("type", "title", "status", "detail", "code"):
            self.assertIn(field, doc, r)
        self.assertEqual(doc["status"], status, r)
        if code is not None:
            self.assertEqual(doc["code"], code, r)
        self.assertIsInstance(doc["code"], str)
        self.assertIsInstance(doc["title"], str)
        self.assertIsInstance(doc["detail"], str)
        self.assertIsInstance(doc["type"], str)
        return doc

    def assertExecuted(self, r, status=200):
        self.assertEqual(r.status, status, r)
        self.assertFalse(r.replayed, r)
        self.assertIsNotNone(r.execution_id, r)

    def assertReplayOf(self, replay, original):
        """Same status, same body bytes, same stored headers, plus Idempotent-Replayed: true."""
        self.assertEqual(replay.status, original.status, replay)
        self.assertEqual(replay.header("Idempotent-Replayed"), "true", replay)
        self.assertIsNone(original.header("Idempotent-Replayed"), original)
        self.assertEqual(replay.body, original.body)
        self.assertEqual(stored_headers(replay), stored_headers(original))

    def eventually(self, fn, timeout, interval=0.05, msg=""):
        """Polls fn() until truthy or the deadline; returns its last value."""
        deadline = time.monotonic() + timeout
        while True:
            v = fn()
            if v or time.monotonic() > deadline:
                if not v:
                    self.fail("condition not met within %.1fs %s" % (timeout, msg))
                return v
            time.sleep(interval)


# Headers that legitimately differ between an original answer and its replay.
PER_RESPONSE_HEADERS = {"date", "connection", "keep-alive", "idempotent-replayed", "transfer-encoding",
                        "content-length"}


def stored_headers(r):
    return sorted((k.lower(), v) for k, v in r.headers if k.lower() not in PER_RESPONSE_HEADERS)


def sleep_until(t):
    """Sleeps until time.monotonic() >= t (bounded by construction)."""
    d = t - time.monotonic()
    if d > 0:
        time.sleep(d)


def run_concurrently(n, fn, timeout=60.0):
    """Runs fn(i) in n threads released together; returns the results (exceptions as values)."""
    barrier = threading.Barrier(n)
    results = [None] * n

    def worker(i):
        try:
            barrier.wait(timeout=timeout)
            results[i] = fn(i)
        except Exception as e:  # report, don't hide
            results[i] = e

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    return results


# ---------------------------------------------------------------------------------------------
# Entry point


def main():
    global ARGS
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--gateway", required=True, help="path to idem-gateway")
    parser.add_argument("--upstream-bin", required=True, help="path to idem-fixture-upstream")
    parser.add_argument("--store", choices=("memory", "sqlite", "postgres", "redis", "redis_cluster"), default="memory")
    ARGS, rest = parser.parse_known_args()
    # SIGTERM (ctest, CI cancelling) unwinds like a failure, so tearDownClass stops the children.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    for path in (ARGS.gateway, ARGS.upstream_bin):
        if not os.access(path, os.X_OK):
            print("not an executable: %s" % path, file=sys.stderr)
            sys.exit(2)
    run_tests(rest)


def run_tests(argv, dump=("gateway",)):
    """Runs the module's tests and exits; on failure, the last lines of every process named in
    `dump`, and of every process that crashed, go to stderr."""
    prog = unittest.main(argv=[sys.argv[0]] + argv, exit=False, verbosity=2)
    ok = prog.result.wasSuccessful()
    if not ok:
        for p in _PROCESSES:
            text = p.log()
            crashed = p.proc.returncode not in (None, 0)
            if text and (p.name in dump or crashed):
                tail = "\n".join(text.splitlines()[-40:])
                print("\n---- %s (pid %d, exit %s) %s, last lines ----\n%s"
                      % (p.name, p.pid, p.proc.returncode, " ".join(p.argv), tail), file=sys.stderr)
    sys.exit(0 if ok else 1)
