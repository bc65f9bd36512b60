#!/usr/bin/env python3
"""Encryption at rest through the real gateway (issue 19 §2, docs/security.md): [encryption]
key_file. Replays work encrypted while the storage holds no response in plaintext; an altered
record or one whose key is gone answers 500 idempotency_record_unreadable and executes nothing;
records stored before encryption was on still replay; two gateways sharing one store rotate keys,
restarted one after the other under continuous keyed traffic, without a failed request; idemctl
shows responses only with the key file; no key ever appears in a log or an output.

    python3 test_encryption.py --gateway PATH --upstream-bin PATH --store sqlite|postgres|redis

idemctl is taken from the same build tree as the gateway (BUILD/cli/idemctl). The shared stores'
addresses come from the environment scripts/test exports (IDEM_TEST_POSTGRES_URL,
IDEM_TEST_REDIS_URL).
"""

import json
import os
import random
import sqlite3
import subprocess
import sys
import threading
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import GatewayTestCase, new_key, shared_store_url  # noqa: E402

MARKER = "MARKER-e2e-5105105105105100"
RUN = uuid.uuid4().hex[:8]  # key ids and tenants of this run: shared stores hold other runs' records

BASE_CONFIG = """
upstream_timeout = "10s"
drain_timeout = "10s"

[idempotency]
retention = "1h"
lease = "30s"

[tenant]
header = "X-Tenant-Id"

[[route]]
method = "POST"
path = "/echo"
"""


def config_with_keys(key_file):
    return BASE_CONFIG + '\n[encryption]\nkey_file = "%s"\n' % key_file


def openssl_key():
    """A key as docs/security.md says to make one by hand."""
    return subprocess.run(["openssl", "rand", "-base64", "32"], check=True, capture_output=True,
                          text=True).stdout.strip()


def write_key_file(path, lines, mode=0o600):
    with open(path, "w") as f:
        f.write("# keys of test_encryption.py\n" + "".join(line + "\n" for line in lines))
    os.chmod(path, mode)


def idemctl_path():
    path = os.path.normpath(os.path.join(os.path.dirname(harness.ARGS.gateway), "..", "cli", "idemctl"))
    if not os.access(path, os.X_OK):
        raise RuntimeError("idemctl not found next to the gateway's build: %s (build the idemctl target)" % path)
    return path


def idemctl(*args, env=None):
    e = dict(os.environ)
    e.pop("IDEM_KEY_FILE", None)
    e.update(env or {})
    return subprocess.run([idemctl_path()] + list(args), capture_output=True, text=True, env=e, timeout=60)


# ---------------------------------------------------------------------------------------------
# The store, raw: what a person with the disk, the database or the Redis server sees.


class RawStore:
    def __init__(self, url):
        self.url = url

    def hits(self, needle):
        """Occurrences of `needle` in the store's raw data."""
        store = harness.ARGS.store
        if store == "sqlite":
            path = self.url[len("sqlite:"):]
            n = 0
            for suffix in ("", "-wal", "-shm"):
                try:
                    with open(path + suffix, "rb") as f:
                        n += f.read().count(needle.encode())
                except FileNotFoundError:
                    pass
            return n
        # The shared stores hold other tests' records too: this run's tenants only (they name RUN).
        if store == "postgres":
            rows = self._psql("SELECT t::text FROM public.idempotency_keys t WHERE tenant_id LIKE '%%%s%%'" % RUN)
            return rows.count(needle) + rows.count(needle.encode().hex())
        n = 0
        keys = self._redis("--scan", "--pattern", "idem:{*%s*" % RUN).split()
        for i in range(0, len(keys), 200):  # MGET in batches: one redis-cli per key would take seconds
            n += self._redis_raw("MGET", *keys[i:i + 200]).count(needle.encode())
        return n

    def alter_one_byte(self, tenant, key):
        store = harness.ARGS.store
        if store == "sqlite":
            db = sqlite3.connect(self.url[len("sqlite:"):], timeout=10)
            try:
                (body,) = db.execute("SELECT response_body FROM idempotency_keys WHERE tenant_id = ? AND key = ?",
                                     (tenant, key)).fetchone()
                body = bytearray(body)
                body[len(body) // 2] ^= 0x01
                db.execute("UPDATE idempotency_keys SET response_body = ? WHERE tenant_id = ? AND key = ?",
                           (bytes(body), tenant, key))
                db.commit()
            finally:
                db.close()
        elif store == "postgres":
            out = self._psql("UPDATE public.idempotency_keys SET response_body = set_byte(response_body, "
                             "length(response_body) / 2, get_byte(response_body, length(response_body) / 2) # 1) "
                             "WHERE tenant_id = '%s' AND key = '%s' RETURNING 1" % (tenant, key))
            assert out.strip() == "1", out
        else:
            k = "idem:{%s:%s}" % (tenant, key)  # the test's ids need no escaping
            length = int(self._redis("STRLEN", k))
            offset = str(length - 20)  # the value ends with the stored body: ciphertext and tag
            old = self._redis_raw("GETRANGE", k, offset, offset)[:1]
            self._redis("SETRANGE", k, offset, "B" if old == b"A" else "A")

    def _psql(self, sql):
        return subprocess.run(["psql", self.url, "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-c", sql],
                              check=True, capture_output=True, text=True).stdout

    def _redis_raw(self, *args):
        out = subprocess.run(["redis-cli", "-u", self.url, "--no-auth-warning"] + list(args), check=True,
                             capture_output=True).stdout
        return out[:-1] if out.endswith(b"\n") else out

    def _redis(self, *args):
        return self._redis_raw(*args).decode("latin-1")


class EncryptedStoreCase(GatewayTestCase):
    """A gateway encrypting with key k1 on the store under test."""

    CONFIG = None

    @classmethod
    def start_class_processes(cls):
        if harness.ARGS.store == "memory":
            raise RuntimeError("run with --store sqlite, postgres or redis: the memory store has no raw storage")
        cls.url = cls.store_url() if harness.ARGS.store == "sqlite" else shared_store_url()
        cls.raw = RawStore(cls.url)
        cls.k1_id, cls.k1 = "e2e-%s-1" % RUN, openssl_key()
        cls.key_file = os.path.join(cls.workdir, "keys")
        write_key_file(cls.key_file, ["%s %s" % (cls.k1_id, cls.k1)])
        cls.gateway = cls.start_gateway(config_with_keys(cls.key_file), store=cls.url)

    def post(self, gateway, key, tenant=None, body=None):
        body = body if body is not None else json.dumps({"card": MARKER, "amount": 100})
        return gateway.request("POST", "/echo", body, [("Content-Type", "application/json"),
                                                       ("X-Tenant-Id", tenant or "acme-" + RUN)], key=key)


CONTROL = "CONTROL-plaintext-e2e-7f3a"


class Replay(EncryptedStoreCase):
    def test_replay_is_byte_for_byte_and_the_storage_holds_no_marker(self):
        # The control: a record of a gateway without [encryption], which the raw scan must see.
        plain = self.start_gateway(BASE_CONFIG, store=self.url)
        try:
            self.assertExecuted(self.post(plain, new_key(), body=json.dumps({"control": CONTROL})))
        finally:
            plain.stop()
        originals = {}
        for _ in range(5):
            key = new_key()
            originals[key] = self.post(self.gateway, key)
            self.assertExecuted(originals[key])
            self.assertIn(MARKER, originals[key].body.decode())
        for key, first in originals.items():
            again = self.post(self.gateway, key)
            self.assertReplayOf(again, first)
            self.assertEqual(self.upstream.executions(key), 1)
        self.assertGreaterEqual(self.raw.hits(CONTROL), 1, "the raw scan does not see the records")
        self.assertEqual(self.raw.hits(MARKER), 0, "a response stored in plaintext")

    def test_an_altered_record_is_refused_and_nothing_executes(self):
        key, tenant = new_key(), "acme-" + RUN
        first = self.post(self.gateway, key)
        self.assertExecuted(first)
        self.raw.alter_one_byte(tenant, key)
        before = self.gateway.metrics().get('idem_requests_total{outcome="record_unreadable"}', 0)
        for _ in range(3):
            r = self.post(self.gateway, key)
            doc = self.assertProblem(r, 500, "idempotency_record_unreadable")
            self.assertIsNone(r.header("Idempotent-Replayed"), r)
            self.assertIsNone(r.header("Retry-After"), r)
            self.assertNotIn(MARKER, r.body.decode())
            self.assertNotIn(self.k1_id, doc["detail"])  # the client learns no key id
        self.assertEqual(self.upstream.executions(key), 1, "an unreadable record was executed again")
        after = self.gateway.metrics()['idem_requests_total{outcome="record_unreadable"}']
        self.assertEqual(after - before, 3)
        log = self.gateway.process.wait_log("altered")
        self.assertIn('encryption: refused to replay, and did not execute', log)
        self.assertIn('key id "%s"' % self.k1_id, log)
        self.assertIn("altered", log)

    def test_a_missing_key_is_refused_naming_its_id(self):
        key = new_key()
        self.assertExecuted(self.post(self.gateway, key))
        other_file = os.path.join(self.workdir, "keys-without-k1")
        write_key_file(other_file, ["e2e-%s-other %s" % (RUN, openssl_key())])
        other = self.start_gateway(config_with_keys(other_file), store=self.url)
        try:
            r = self.post(other, key)
            self.assertProblem(r, 500, "idempotency_record_unreadable")
            self.assertEqual(self.upstream.executions(key), 1)
            line = 'key id "%s", which the key file does not list' % self.k1_id
            self.assertIn(line, other.process.wait_log(line))
            self.assertEqual(other.metrics()['idem_requests_total{outcome="record_unreadable"}'], 1)
            # The gateway that has the key still replays it.
            self.assertTrue(self.post(self.gateway, key).replayed)
        finally:
            other.stop()

    def test_plaintext_records_from_before_encryption_still_replay(self):
        plain = self.start_gateway(BASE_CONFIG, store=self.url)
        key = new_key()
        try:
            # Not the marker: the storage must hold no marker in plaintext (the replay test looks).
            first = self.post(plain, key, body=json.dumps({"before": "encryption", "amount": 5}))
            self.assertExecuted(first)
        finally:
            plain.stop()
        self.assertGreaterEqual(self.raw.hits(first.execution_id), 1, "the plaintext record is not in the store")
        self.assertReplayOf(self.post(self.gateway, key, body=json.dumps({"before": "encryption", "amount": 5})), first)
        self.assertEqual(self.upstream.executions(key), 1)

    def test_idemctl_shows_the_response_only_with_the_key_file(self):
        key, tenant = new_key(), "ctl-" + RUN  # a tenant of its own: no altered record in its list
        first = self.post(self.gateway, key, tenant=tenant)
        self.assertExecuted(first)
        without = idemctl("get", "--store", self.url, tenant, key)
        self.assertEqual(without.returncode, 0, without.stderr)
        self.assertIn('encrypted with key id "%s" (--key-file shows it)' % self.k1_id, without.stdout)
        self.assertNotIn(MARKER, without.stdout + without.stderr)
        body = idemctl("get", "--store", self.url, "--body", tenant, key)
        self.assertEqual(body.returncode, 1)
        self.assertIn("give --key-file", body.stderr)
        shown = idemctl("get", "--store", self.url, "--body", tenant, key, env={"IDEM_KEY_FILE": self.key_file})
        self.assertEqual(shown.returncode, 0, shown.stderr)
        self.assertEqual(shown.stdout.encode(), first.body)
        listed = idemctl("list", "--store", self.url, "--tenant", tenant, "--key-file", self.key_file, "--json")
        self.assertEqual(listed.returncode, 0, listed.stderr)
        record = [r for r in json.loads(listed.stdout)["records"] if r["key"] == key][0]
        self.assertEqual(record["response"]["status"], 200)
        self.assertEqual(record["response"]["key_id"], self.k1_id)
        usage = idemctl("keys", "usage", "--store", self.url, "--key-file", self.key_file, "--json")
        self.assertEqual(usage.returncode, 0, usage.stderr)
        by_id = {k["key_id"]: k for k in json.loads(usage.stdout)["keys"]}
        self.assertGreaterEqual(by_id[self.k1_id]["live"], 1)
        self.assertEqual(by_id[self.k1_id]["role"], "encrypts")
        for out in (without, body, shown, listed, usage):
            self.assertNotIn(self.k1, out.stdout + out.stderr)
            self.assertNotIn(self.k1[:16], out.stdout + out.stderr)

    def test_the_key_is_never_in_the_log(self):
        for _ in range(3):
            self.post(self.gateway, new_key())
        log = self.gateway.process.log()
        self.assertIn('encrypted with key id %s' % self.k1_id, log)  # the start-up line names the id...
        self.assertNotIn(self.k1, log)  # ...never the key
        self.assertNotIn(self.k1[:16], log)


class StartupErrors(GatewayTestCase):
    """A bad key file stops the gateway at start-up: exit 2, one line, no key material."""

    CONFIG = None

    def start(self, key_file):
        path = os.path.join(self.workdir, "g-%s.toml" % uuid.uuid4().hex[:6])
        with open(path, "w") as f:
            f.write(config_with_keys(key_file))
        return subprocess.run([harness.ARGS.gateway, "--config", path, "--store", "memory:",
                               "--listen", "127.0.0.1:%d" % harness.free_port(), "--admin-listen", "off",
                               "--upstream", self.upstream.url], capture_output=True, text=True, timeout=30)

    def test_bad_key_files_exit_2_with_one_line(self):
        good = openssl_key()
        short = subprocess.run(["openssl", "rand", "-base64", "16"], check=True, capture_output=True,
                               text=True).stdout.strip()
        cases = [
            (["k1 " + short], 0o600, 'key "k1": the key is 16 bytes, expected 32'),
            (["k1 " + good, "k1 " + openssl_key()], 0o600, 'key id "k1" is listed twice'),
            ([good + " k1"], 0o600, "the key id must be"),
            (["k1 " + good + " primary"], 0o600, 'the third field may only be "decrypt-only"'),
            (["k1 " + good], 0o644, "lets other users read or change it; chmod 600"),
            (["# nothing"], 0o600, "no key"),
        ]
        for lines, mode, expected in cases:
            with self.subTest(expected=expected):
                key_file = os.path.join(self.workdir, "keys-" + uuid.uuid4().hex[:6])
                write_key_file(key_file, lines, mode)
                r = self.start(key_file)
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertIn(expected, r.stderr)
                self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
                for secret in (good, short, good[:16], short[:12]):
                    self.assertNotIn(secret, r.stdout + r.stderr)
        r = self.start(os.path.join(self.workdir, "absent"))
        self.assertEqual(r.returncode, 2)
        self.assertIn("cannot read the key file", r.stderr)


class Rotation(EncryptedStoreCase):
    """Two gateways on one store, restarted one after the other while traffic runs: first with the
    new key decrypt-only, then with it encrypting (docs/security.md)."""

    @classmethod
    def start_class_processes(cls):
        super().start_class_processes()
        cls.second = cls.start_gateway(config_with_keys(cls.key_file), store=cls.url)

    def test_rotation_under_load_fails_no_request(self):
        gateways = [self.gateway, self.second]
        tenant = "rotation-" + RUN
        lock = threading.Lock()
        active = {0, 1}
        in_flight = [0, 0]
        done = []  # (key, first response) of executed requests
        failures = []
        counts = {"executed": 0, "replayed": 0}

        def count(what):
            with lock:
                counts[what] += 1
        stop = threading.Event()

        def pick():
            with lock:
                choices = sorted(active)
                if not choices:
                    return None
                g = random.choice(choices)
                in_flight[g] += 1
                return g

        def drive(seed):
            rnd = random.Random(seed)
            while not stop.is_set():
                g = pick()
                if g is None:
                    time.sleep(0.01)
                    continue
                try:
                    if done and rnd.random() < 0.5:
                        key, first = rnd.choice(done)
                        r = self.post(gateways[g], key, tenant=tenant)
                        if r.status != first.status or not r.replayed or r.body != first.body:
                            failures.append(("replay", g, key, r))
                        else:
                            count("replayed")
                    else:
                        key = new_key("rot")
                        r = self.post(gateways[g], key, tenant=tenant)
                        if r.status != 200 or r.replayed:
                            failures.append(("execute", g, key, r))
                        else:
                            done.append((key, r))
                            count("executed")
                except Exception as e:  # a connection error on a gateway in rotation is a failure
                    failures.append(("error", g, repr(e)))
                finally:
                    with lock:
                        in_flight[g] -= 1

        def restart(g):
            with lock:
                active.discard(g)  # the load balancer stops sending it requests...
            deadline = time.monotonic() + 15
            while True:  # ...and the gateway finishes what it has
                with lock:
                    if in_flight[g] == 0:
                        break
                self.assertLess(time.monotonic(), deadline, "requests stuck on gateway %d" % g)
                time.sleep(0.01)
            gateways[g].restart()
            with lock:
                active.add(g)
            time.sleep(0.7)  # traffic on both again before the next restart

        k2_id, k2 = "e2e-%s-2" % RUN, openssl_key()
        threads = [threading.Thread(target=drive, args=(i,), daemon=True) for i in range(3)]
        for t in threads:
            t.start()
        try:
            time.sleep(1.0)
            # Step 1: every replica learns k2, still encrypting with k1.
            write_key_file(self.key_file, ["%s %s" % (self.k1_id, self.k1), "%s %s decrypt-only" % (k2_id, k2)])
            restart(0)
            restart(1)
            # Step 2: k2 encrypts; a replica not yet restarted reads what the other writes with k2.
            write_key_file(self.key_file, ["%s %s" % (self.k1_id, self.k1), "%s %s" % (k2_id, k2)])
            restart(0)
            restart(1)
            time.sleep(1.0)
        finally:
            stop.set()
            for t in threads:
                t.join(60)
        self.assertEqual(failures, [], "failed requests during the rotation")
        self.assertGreater(counts["executed"], 50)
        self.assertGreater(counts["replayed"], 50)
        # Every record replays on both gateways, whichever key sealed it.
        for key, first in done[::max(1, len(done) // 40)]:
            for g in gateways:
                self.assertReplayOf(self.post(g, key, tenant=tenant), first)
        for key, _ in done:
            self.assertEqual(self.upstream.executions(key), 1, key)
        usage = idemctl("keys", "usage", "--store", self.url, "--key-file", self.key_file, "--json")
        self.assertEqual(usage.returncode, 0, usage.stderr)
        report = json.loads(usage.stdout)
        by_id = {k["key_id"]: k for k in report["keys"]}
        self.assertGreater(by_id[self.k1_id]["live"], 0)
        self.assertGreater(by_id[k2_id]["live"], 0)
        self.assertEqual(by_id[k2_id]["role"], "encrypts")
        self.assertNotIn(self.k1_id, report["removable"])  # live records still need it
        self.assertEqual(self.raw.hits(MARKER), 0)
        for g in gateways:
            self.assertIn("encrypted with key id %s" % k2_id, g.process.log())
        for p in harness._PROCESSES:  # every gateway run, the ones before each restart included
            for secret in (self.k1, k2, self.k1[:16], k2[:16]):
                self.assertNotIn(secret, p.log(), p.name)


if __name__ == "__main__":
    harness.main()
