#!/usr/bin/env python3
"""Three idem-gateway processes sharing one store (PostgreSQL, Redis, Redis Cluster), as replicas
of one service would: one key raced across all three executes once; 10,000 distinct keys execute
10,000 times; and while the store goes away and comes back, nothing executes twice.

    python3 test_shared_stores.py --gateway PATH --upstream-bin PATH --store postgres|redis|redis_cluster

The store's address comes from the environment scripts/test exports (scripts/lib/servers.sh):
IDEM_TEST_POSTGRES_URL, IDEM_TEST_REDIS_URL, IDEM_TEST_REDIS_CLUSTER_URL.
"""

import http.client
import os
import subprocess
import sys
import threading
import time
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import GatewayTestCase, new_key, run_concurrently, shared_store_url  # noqa: E402

CONFIG = """
upstream_timeout = "30s"

[idempotency]
lease = "60s"
retry_after = "1s"

[[route]]
method = "POST"
path = "/slow"

[[route]]
method = "POST"
path = "/echo"
"""


class KeepAliveClient:
    """One persistent HTTP/1.1 connection, reopened if the gateway closes it."""

    def __init__(self, port):
        self.port = port
        self.conn = None

    def post(self, path, body, key):
        for attempt in range(2):
            if self.conn is None:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
            try:
                self.conn.request("POST", path, body=body, headers={
                    "Idempotency-Key": key, "Content-Type": "application/json"})
                r = self.conn.getresponse()
                data = r.read()
                return r.status, dict((k.lower(), v) for k, v in r.getheaders()), data
            except (http.client.HTTPException, OSError):
                self.conn.close()
                self.conn = None
                if attempt == 1:
                    raise


class ThreeReplicas(GatewayTestCase):
    """Three gateways in front of one upstream, sharing the store under test."""

    CONFIG = None

    @classmethod
    def start_class_processes(cls):
        cls.gateways = [cls.start_gateway(CONFIG, store=shared_store_url()) for _ in range(3)]


class ThreeGatewaysOneStore(ThreeReplicas):

    def test_no_reaper_scans_a_store_that_expires_records_itself(self):
        # Redis drops records by their key TTLs; a periodic purge would SCAN the keyspace.
        redis = harness.ARGS.store.startswith("redis")
        for g in self.gateways:
            log = g.process.log()
            self.assertIn("listening on", log)
            self.assertEqual("reaper: off, the store expires records by itself" in log, redis, log)

    def test_300_concurrent_requests_one_key_across_three_gateways_execute_once(self):
        key = new_key("shared")
        gws = self.gateways
        results = run_concurrently(300, lambda i: gws[i % 3].request(
            "POST", "/slow?ms=1500", '{"amount": 100}', key=key, timeout=60), timeout=120)
        errors = [r for r in results if isinstance(r, Exception) or r is None]
        self.assertEqual(errors, [])
        executed = [r for r in results if r.status == 200 and not r.replayed]
        others = [r for r in results if r.status not in (200, 409)]
        self.assertEqual(others, [])
        self.assertEqual(len(executed), 1)
        for r in results:
            if r.status == 409:
                self.assertProblem(r, 409, "idempotency_key_in_use")
            elif r.replayed:
                self.assertReplayOf(r, executed[0])
        self.assertEqual(self.upstream.executions(key), 1)
        # Every replica now replays it.
        for g in gws:
            self.assertReplayOf(g.request("POST", "/slow?ms=1500", '{"amount": 100}', key=key), executed[0])

    def test_10000_distinct_keys_across_three_gateways_execute_10000_times(self):
        total_before = self.upstream.total()
        keys = [new_key("many-%05d" % i) for i in range(10000)]
        failures = []
        threads = 24
        lock = threading.Lock()

        def worker(t):
            clients = [KeepAliveClient(g.port) for g in self.gateways]
            for i in range(t, len(keys), threads):
                status, headers, _ = clients[i % 3].post("/echo", '{"n": %d}' % i, keys[i])
                if status != 200 or headers.get("idempotent-replayed") == "true":
                    with lock:
                        failures.append((i, status))

        ts = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(timeout=600)
        self.assertEqual(failures, [])
        self.assertEqual(self.upstream.total() - total_before, 10000)
        # A sample replayed through another replica: stored once, visible to all.
        for i in range(0, 10000, 500):
            status, headers, _ = KeepAliveClient(self.gateways[(i + 1) % 3].port).post("/echo", '{"n": %d}' % i, keys[i])
            self.assertEqual((status, headers.get("idempotent-replayed")), (200, "true"))
        self.assertEqual(self.upstream.total() - total_before, 10000)


# ---- the store goes away mid-run ----------------------------------------------------------------


def run(argv, **kw):
    return subprocess.run(argv, check=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120, **kw)


def redis_cli(hostport, *args):
    host, port = hostport.rsplit(":", 1)
    return run(["redis-cli", "-h", host, "-p", port] + list(args)).stdout.decode().strip()


class StoreOutage:
    """Takes the test's store down and brings it back, the way an operator's restart would."""

    def __init__(self, store):
        self.store = store

    def down(self):
        if self.store == "postgres":
            self._pg_ctl("stop", "-m", "fast")
        elif self.store == "redis":
            hostport = urllib.parse.urlparse(os.environ["IDEM_TEST_REDIS_URL"]).netloc
            self.redis_dir = redis_cli(hostport, "config", "get", "dir").splitlines()[1]
            self.redis_port = hostport.rsplit(":", 1)[1]
            try:
                redis_cli(hostport, "shutdown")
            except subprocess.CalledProcessError:
                pass  # the connection drops as the server exits
        else:
            # A master fails over to its replica: the shard is briefly unavailable, then serves on.
            nodes = os.environ["IDEM_TEST_REDIS_CLUSTER_NODES"].split(",")
            for node in nodes:
                if "role:slave" in redis_cli(node, "info", "replication"):
                    redis_cli(node, "cluster", "failover")
                    return

    def up(self):
        if self.store == "postgres":
            port = urllib.parse.urlparse(os.environ["IDEM_TEST_POSTGRES_URL"]).port
            data = os.environ["IDEM_TEST_POSTGRES_DATA"]
            self._pg_ctl("-l", os.path.join(data, "server.log"), "-w", "-t", "60", "-o",
                         "-p %d -k %s -c listen_addresses=127.0.0.1 -c max_connections=200" % (port, data), "start")
        elif self.store == "redis":
            d = self.redis_dir
            run(["redis-server", "--port", self.redis_port, "--bind", "127.0.0.1", "--daemonize", "yes",
                 "--dir", d, "--pidfile", os.path.join(d, "redis.pid"), "--logfile", os.path.join(d, "redis.log"),
                 "--appendonly", "yes", "--appendfsync", "everysec", "--save", ""])

    def _pg_ctl(self, *args):
        argv = [os.path.join(os.environ["IDEM_TEST_POSTGRES_BIN"], "pg_ctl"), "-D", os.environ["IDEM_TEST_POSTGRES_DATA"]]
        argv += list(args)
        if os.geteuid() == 0:
            argv = ["runuser", "-u", "postgres", "--"] + argv
        run(argv)


class StoreOutageMidRun(ThreeReplicas):
    def test_no_key_executes_twice_while_the_store_goes_away_and_comes_back(self):
        keys = [new_key("outage-%04d" % i) for i in range(400)]
        answers = {k: [] for k in keys}
        stop = threading.Event()
        lock = threading.Lock()

        def client(t):
            clients = [KeepAliveClient(g.port) for g in self.gateways]
            i = t
            while not stop.is_set():
                k = keys[i % len(keys)]
                try:
                    status, headers, body = clients[i % 3].post("/echo", '{"k": "%s"}' % k, k)
                except OSError:
                    status, headers = 0, {}
                with lock:
                    answers[k].append((status, headers.get("retry-after")))
                i += 7

        ts = [threading.Thread(target=client, args=(t,)) for t in range(6)]
        for t in ts:
            t.start()
        outage = StoreOutage(harness.ARGS.store)
        try:
            time.sleep(2)
            outage.down()
            time.sleep(3)
            if harness.ARGS.store != "redis_cluster":
                # While the store is down: 503 with Retry-After, and nothing executes.
                before = self.upstream.total()
                r = self.gateways[0].request("POST", "/echo", "{}", key=new_key("while-down"))
                self.assertProblem(r, 503, "idempotency_store_unavailable")
                self.assertIsNotNone(r.header("Retry-After"))
                self.assertEqual(self.upstream.total(), before)
        finally:
            outage.up()
        # The gateways recover by themselves.
        self.eventually(lambda: self.gateways[0].request("POST", "/echo", "{}", key=new_key("after")).status == 200,
                        timeout=60, interval=0.5)
        time.sleep(2)
        stop.set()
        for t in ts:
            t.join(timeout=60)
        executed_twice = [k for k in keys if self.upstream.executions(k) > 1]
        self.assertEqual(executed_twice, [])
        self.assertTrue(any(s == 200 for a in answers.values() for s, _ in a))
        for a in answers.values():
            for status, retry_after in a:
                self.assertIn(status, (0, 200, 409, 503, 504))
                if status == 503:
                    self.assertIsNotNone(retry_after)


if __name__ == "__main__":
    harness.main()
