#!/usr/bin/env python3
"""The gateway process: graceful shutdown (SIGTERM/SIGINT finish in-flight requests, record their
outcomes, exit 0), restart on a durable store, and the command line (bad flag or config: exit 2
and one clear line).

    python3 test_lifecycle.py --gateway PATH --upstream-bin PATH [--store memory|sqlite]
"""

import http.client
import os
import resource
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import GatewayTestCase, can_connect, free_port, new_key  # noqa: E402

CONFIG = """
upstream_timeout = "10s"

[idempotency]
lease = "30s"

[[route]]
method = "POST"
path = "/slow"

[[route]]
method = "POST"
path = "/echo"
"""


class ShutdownTest(GatewayTestCase):
    CONFIG = None

    def shutdown_with_request_in_flight(self, sig):
        gw = self.start_gateway(CONFIG)
        key = new_key()
        box = {}
        t = threading.Thread(target=lambda: box.setdefault(
            "r", gw.request("POST", "/slow?ms=1500", "{}", key=key, timeout=15)))
        t.start()
        self.eventually(lambda: self.upstream.executions(key) == 1, 5)
        sent = time.monotonic()
        gw.process.signal(sig)
        # Stops accepting soon after the signal, while the slow request is still in flight.
        self.eventually(lambda: not can_connect(gw.port, timeout=0.2), 1.0, msg="still accepting after signal")
        t.join(15)
        r = box.get("r")
        self.assertIsNotNone(r, "in-flight request got no answer")
        self.assertExecuted(r)
        code = gw.process.wait(15)
        self.assertEqual(code, 0, "exit code after signal %d" % sig)
        self.assertLess(time.monotonic() - sent, 10)
        return gw, key, r

    def test_sigterm_finishes_in_flight_request_and_exits_0(self):
        gw, key, first = self.shutdown_with_request_in_flight(signal.SIGTERM)
        if harness.ARGS.store == "sqlite":
            # The outcome was recorded before exit: a new process replays it.
            gw.restart()
            self.assertReplayOf(gw.request("POST", "/slow?ms=1500", "{}", key=key), first)
            self.assertEqual(self.upstream.executions(key), 1)

    def test_sigint_too(self):
        self.shutdown_with_request_in_flight(signal.SIGINT)

    def test_sighup_reloads_and_a_file_that_does_not_load_changes_nothing(self):
        gw = self.start_gateway(CONFIG)
        gw.process.signal(signal.SIGHUP)
        self.eventually(lambda: "reload: configuration 2 in force" in gw.process.log(), 5, msg="no reload line")
        with open(gw.config_path, "w") as f:
            f.write(CONFIG + "\nno_such_key = 1\n")
        gw.process.signal(signal.SIGHUP)
        self.eventually(lambda: "reload failed, keeping the running configuration" in gw.process.log(), 5,
                        msg="no line for the failed reload")
        self.assertIn("no_such_key", gw.process.log())
        self.assertTrue(gw.alive(), "SIGHUP ended the gateway")
        self.assertTrue(can_connect(gw.port), "stopped accepting after SIGHUP")
        self.assertExecuted(gw.request("POST", "/echo", "{}", key=new_key()))
        gw.process.signal(signal.SIGTERM)  # and the signals that stop it still do
        self.assertEqual(gw.process.wait(15), 0)

    def test_idle_gateway_exits_0_promptly(self):
        gw = self.start_gateway(CONFIG)
        start = time.monotonic()
        self.assertEqual(gw.stop(), 0)
        self.assertLess(time.monotonic() - start, 5)

    def test_durable_store_survives_restart(self):
        if harness.ARGS.store != "sqlite":
            self.skipTest("memory store is per process; runs under --store sqlite")
        gw = self.start_gateway(CONFIG)
        key = new_key()
        first = gw.request("POST", "/echo", "{}", key=key)
        self.assertExecuted(first)
        gw.restart()
        self.assertReplayOf(gw.request("POST", "/echo", "{}", key=key), first)


class CommandLineTest(GatewayTestCase):
    CONFIG = None

    def run_gateway(self, args, config=None):
        argv = [harness.ARGS.gateway] + args
        if config is not None:
            path = os.path.join(self.workdir, "bad.%d.toml" % len(os.listdir(self.workdir)))
            with open(path, "w") as f:
                f.write(config)
            argv += ["--config", path]
        p = subprocess.run(argv, capture_output=True, timeout=10, stdin=subprocess.DEVNULL)
        return p.returncode, p.stderr.decode("utf-8", "replace").strip()

    def assertRefused(self, args, config=None, mention=None):
        base = {"--listen": "127.0.0.1:%d" % free_port(), "--admin-listen": "127.0.0.1:%d" % free_port(),
                "--upstream": self.upstream.url, "--store": "memory:"}
        for flag in args:
            base.pop(flag, None)  # the case replaces it
        code, err = self.run_gateway([x for kv in base.items() for x in kv] + args, config)
        self.assertEqual(code, 2, "args %r config %r: exit %d, stderr %r" % (args, config, code, err))
        self.assertTrue(err, "no message")
        self.assertNotIn("\n", err, "more than one line: %r" % err)
        if mention:
            self.assertIn(mention.lower(), err.lower())

    def test_bad_flags(self):
        self.assertRefused(["--no-such-flag"], mention="--no-such-flag")
        self.assertRefused(["--listen", "not-an-address"])
        self.assertRefused(["--listen", "127.0.0.1:99999"])
        self.assertRefused(["--store", "bogus:"], mention="bogus")
        self.assertRefused(["--upstream", "ftp://example"])

    def test_not_built_stores_are_clear_errors(self):
        for url in ("postgres://localhost/idem", "redis://127.0.0.1:6379", "redis+cluster://127.0.0.1:7000"):
            with self.subTest(url=url):
                code, err = self.run_gateway(["--listen", "127.0.0.1:%d" % free_port(),
                                              "--admin-listen", "127.0.0.1:%d" % free_port(),
                                              "--upstream", self.upstream.url, "--store", url])
                self.assertNotEqual(code, 0)
                self.assertTrue(err)

    def test_bad_config(self):
        self.assertRefused([], config='upstream_timeout = "10 parsecs"\n', mention="upstream_timeout")
        self.assertRefused([], config='[idempotency]\nlease = "-1s"\n', mention="lease")
        self.assertRefused([], config='[idempotency]\non_lease_expiry = "maybe"\n', mention="on_lease_expiry")
        self.assertRefused([], config='max_body = "lots"\n', mention="max_body")
        self.assertRefused([], config="this is not toml = = =\n")
        self.assertRefused([], config='[[route]]\nmethod = "POST"\n')  # no path
        code, err = self.run_gateway(["--config", os.path.join(self.workdir, "missing.toml")])
        self.assertEqual(code, 2, err)

    def test_flags_override_the_file(self):
        file_store = os.path.join(self.workdir, "from-the-file.db")
        config = ('listen = "127.0.0.1:1"\nadmin_listen = "127.0.0.1:2"\nupstream = "http://127.0.0.1:3"\n'
                  'store = "sqlite:%s"\n' % file_store)
        gw = self.start_gateway(config, store="memory:")  # the harness passes all four flags
        r = gw.request("POST", "/echo", "{}", key=new_key())
        self.assertEqual(r.status, 200, r)
        self.assertFalse(os.path.exists(file_store), "the file's store was opened despite --store")


class OpenFilesLimitTest(GatewayTestCase):
    """The gateway raises its soft limit on open files to what max_connections needs (a client
    connection and its upstream connection, plus 1024), and warns when the hard limit is lower."""

    CONFIG = None

    def start_with_soft_limit(self, soft, config):
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        saved = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))  # the gateway inherits it
        try:
            gw = self.start_gateway(config)
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, saved)
        with open("/proc/%d/limits" % gw.process.pid) as f:
            line = next(l for l in f if l.startswith("Max open files"))
        return gw, int(line.split()[3]), hard

    def test_soft_limit_is_raised_for_max_connections(self):
        gw, soft, hard = self.start_with_soft_limit(256, "max_connections = 500\n")
        self.assertEqual(soft, min(hard, 2 * 500 + 1024))
        if hard >= 2 * 500 + 1024:
            self.assertNotIn("open files limit", gw.process.log())
        self.assertExecuted(gw.request("POST", "/echo", "{}", key=new_key()))

    def test_a_hard_limit_below_the_need_is_a_warning_not_an_error(self):
        gw, soft, hard = self.start_with_soft_limit(256, "max_connections = 10000000\n")
        self.assertEqual(soft, hard)
        self.assertRegex(gw.process.log(), r"warn open files limit %d is below the 20001024 that "
                                           r"max_connections = 10000000 needs" % hard)
        self.assertExecuted(gw.request("POST", "/echo", "{}", key=new_key()))


class StalledLogReaderTest(GatewayTestCase):
    """A gateway whose stderr nobody reads (a stalled journald, a pipe into a stuck process) keeps
    serving and still stops on SIGTERM: its lines wait in a bounded queue, then are dropped,
    counted in idem_log_lines_dropped_total, and reported once stderr is read again."""

    CONFIG = None
    # Each keyed request logs a line that carries its key: ~380 bytes with a 250-character key.
    # The pipe holds 64 KiB; the gateway queues 4 MiB more before it drops lines.
    KEY_LENGTH = 250

    def setUp(self):
        if harness.ARGS.store != "memory":
            self.skipTest("the log does not depend on the store; runs under --store memory")

    def start_with_unread_stderr(self):
        port, admin = free_port(), free_port()
        config = os.path.join(self.workdir, "stalled-log.toml")
        with open(config, "w") as f:
            f.write(CONFIG)
        proc = subprocess.Popen([harness.ARGS.gateway, "--config", config,
                                 "--listen", "127.0.0.1:%d" % port, "--admin-listen", "127.0.0.1:%d" % admin,
                                 "--upstream", self.upstream.url, "--store", "memory:"],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.addCleanup(lambda: (proc.kill(), proc.wait(), proc.stderr.close()))
        self.eventually(lambda: can_connect(admin) and harness.request(admin, "GET", "/healthz").status == 200,
                        harness.STARTUP_TIMEOUT, msg="the gateway did not start")
        return proc, port, admin

    def send_keyed(self, port, count):
        """Sends `count` keyed POSTs on one connection; each must be answered within 5 s."""
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        try:
            for i in range(count):
                key = new_key("log").ljust(self.KEY_LENGTH, "x")
                conn.request("POST", "/echo", body="{}", headers={"Idempotency-Key": key})
                r = conn.getresponse()
                r.read()
                self.assertEqual(r.status, 200, "request %d" % i)
        finally:
            conn.close()

    def test_requests_go_on_and_dropped_lines_are_counted_then_reported(self):
        proc, port, admin = self.start_with_unread_stderr()
        self.send_keyed(port, 12000)  # ~4.5 MiB of lines: fills the pipe and the queue
        dropped = harness.parse_metrics(harness.request(admin, "GET", "/metrics").body.decode()).get(
            "idem_log_lines_dropped_total", 0)
        self.assertGreater(dropped, 0)

        seen = threading.Event()

        def read_stderr():
            for line in proc.stderr:
                if b"lines dropped: stderr was not being read" in line:
                    seen.set()

        threading.Thread(target=read_stderr, daemon=True).start()
        self.assertTrue(seen.wait(20), "no line said how many lines were dropped")
        proc.send_signal(signal.SIGTERM)
        self.assertEqual(proc.wait(20), 0)

    def test_sigterm_stops_it_while_nobody_reads(self):
        proc, port, _ = self.start_with_unread_stderr()
        self.send_keyed(port, 1000)  # ~380 KiB: the pipe is full, the writer blocked
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        self.assertEqual(proc.wait(20), 0)
        self.assertLess(time.monotonic() - started, 10)


if __name__ == "__main__":
    harness.main()
