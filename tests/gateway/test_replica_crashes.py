#!/usr/bin/env python3
"""Replicas that crash: three idem-gateway processes share one store while clients retry a pool of
keys through all of them, and one replica after another is SIGKILLed mid-traffic and started
again. A killed replica leaves its in-flight keys in progress; with on_lease_expiry = "unknown"
their lease running out must not execute them again. Over the whole run:

  - no key executes twice (the fixture upstream's counts);
  - every 2xx answer for a key carries the one execution's X-Execution-Id: replays are that
    execution's response, whichever replica answers;
  - every answer is 200 or a 409 problem (in use, outcome unknown); a replica being killed may
    drop connections, nothing else;
  - keys stranded in progress are at most what the killed replicas had in flight;
  - the run's history (every try of every key, every execution the upstream recorded, every kill:
    history.jsonl in the scratch directory) passes the history checker (tests/common/history.py).

    python3 test_replica_crashes.py --gateway PATH --upstream-bin PATH --store sqlite|postgres|redis|redis_cluster

IDEM_CRASH_SECONDS sets how long the clients and the kills run (default 20; scripts/soak runs it
for longer). Shared stores come from the environment scripts/test exports (scripts/lib/servers.sh).
"""

import collections
import http.client
import json
import os
import random
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import harness  # noqa: E402
import history  # noqa: E402
from harness import GatewayTestCase, new_key, shared_store_url  # noqa: E402

SECONDS = float(os.environ.get("IDEM_CRASH_SECONDS", "20"))
CLIENTS = 6
ACTIVE_KEYS = 40
ANSWERS_PER_KEY = 6
LEASE_S = 1.0

CONFIG = """
upstream_timeout = "30s"

[idempotency]
lease = "%gs"
# Shorter than upstream_timeout on purpose: the crashes leave keys whose leases must run out fast.
allow_short_lease = true
retry_after = "1s"
on_lease_expiry = "unknown"

[[route]]
method = "POST"
path = "/slow"
""" % LEASE_S


def post(port, key, timeout=30.0, record=None):
    """One keyed POST on a new connection: (status, problem code, execution id, replayed), or None
    when the connection failed (the replica was killed, or is starting). `record` (a History)
    gets the try either way."""
    sent = time.monotonic()
    answer, data = _post(port, key, timeout)
    if record is not None:
        status, code, execution, replayed = answer if answer else (None, None, None, False)
        record.op(key, sent, status, execution, replayed, data if status == 200 else None, code)
    return answer


def _post(port, key, timeout):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        body = json.dumps({"key": key})
        conn.request("POST", "/slow?ms=20", body=body, headers={
            "Idempotency-Key": key, "Content-Type": "application/json"})
        r = conn.getresponse()
        data = r.read()
        code = None
        if r.getheader("Content-Type", "").startswith("application/problem+json"):
            code = json.loads(data).get("code")
        return (r.status, code, r.getheader("X-Execution-Id"), r.getheader("Idempotent-Replayed") == "true"), data
    except (http.client.HTTPException, OSError):
        return None, None
    finally:
        conn.close()


class ReplicaCrashes(GatewayTestCase):
    CONFIG = None

    @classmethod
    def start_class_processes(cls):
        # SQLite: one file, three processes.
        url = cls.store_url("shared.db") if harness.ARGS.store == "sqlite" else shared_store_url()
        cls.gateways = [cls.start_gateway(CONFIG, store=url) for _ in range(3)]

    def test_no_key_executes_twice_while_replicas_are_killed_and_restarted(self):
        # A rolling pool: each key is sent ANSWERS_PER_KEY times (its retries, spread over the
        # replicas and the clients, often at once), then a fresh key takes its place, so the kills
        # keep meeting first executions, not only replays.
        active = [new_key("crash") for _ in range(ACTIVE_KEYS)]
        keys = list(active)
        answers = collections.defaultdict(list)  # key -> [(status, code, execution id, replayed)]
        sent = collections.Counter()
        dropped = [0]
        lock = threading.Lock()
        stop = threading.Event()
        kills = [0]
        record = history.History(os.path.join(self.workdir, "history.jsonl"))

        def client(seed):
            rng = random.Random(seed)
            while not stop.is_set():
                with lock:
                    slot = rng.randrange(ACTIVE_KEYS)
                    key = active[slot]
                    sent[key] += 1
                    if sent[key] == ANSWERS_PER_KEY:
                        active[slot] = new_key("crash")
                        keys.append(active[slot])
                answer = post(rng.choice(self.gateways).port, key, record=record)
                with lock:
                    if answer is None:
                        dropped[0] += 1
                    else:
                        answers[key].append(answer)

        threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(CLIENTS)]
        for t in threads:
            t.start()
        # The kills run on this thread: the harness ties each child's life to the thread that
        # started it (PR_SET_PDEATHSIG), so replicas started by a thread that ends would die with it.
        rng = random.Random(7)
        deadline = time.monotonic() + SECONDS
        try:
            while time.monotonic() < deadline:
                time.sleep(rng.uniform(0.3, 1.0))
                victim = rng.choice(self.gateways)
                record.event("kill", port=victim.port)
                victim.restart(crash=True)
                kills[0] += 1
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=60)
        self.assertFalse(any(t.is_alive() for t in threads), "a client hung")

        # Whatever the killed replicas held: its lease runs out, then every key gets a last answer.
        time.sleep(LEASE_S + 0.5)
        for i, key in enumerate(keys):
            answer = post(self.gateways[i % 3].port, key, record=record)
            self.assertIsNotNone(answer, key)
            answers[key].append(answer)
        for line in harness.request(self.upstream.port, "GET", "/history").body.splitlines():
            e = json.loads(line)
            record.execution(e["key"], e["execution_id"], e["attempt"] or None)
        record.close()
        ok, text = history.report(history.load(record.path), policy="unknown")
        print(text, file=sys.stderr)
        self.assertTrue(ok, text)

        counts = self.upstream.get_json("/counts")["keys"]
        twice = {k: counts[k] for k in keys if counts.get(k, 0) > 1}
        self.assertEqual(twice, {})

        stranded = []
        for key in keys:
            ids = {execution for status, _, execution, _ in answers[key] if status == 200}
            self.assertLessEqual(len(ids), 1, (key, answers[key]))
            self.assertTrue(ids <= {None} or counts.get(key) == 1, (key, answers[key]))
            fresh = [a for a in answers[key] if a[0] == 200 and not a[3]]
            self.assertLessEqual(len(fresh), 1, (key, answers[key]))
            for status, code, _, _ in answers[key]:
                self.assertIn((status, code), {(200, None), (409, "idempotency_key_in_use"),
                                               (409, "idempotency_outcome_unknown")}, key)
            last_status, last_code, _, _ = answers[key][-1]
            if last_status == 409:
                # Only a replica killed while it held the key leaves it so after the lease.
                self.assertEqual(last_code, "idempotency_outcome_unknown", key)
                stranded.append(key)

        executed = sum(1 for k in keys if counts.get(k) == 1)
        print("\n%d kills, %d keys executed, %d left in doubt, %d answers, %d dropped connections"
              % (kills[0], executed, len(stranded), sum(len(a) for a in answers.values()), dropped[0]),
              file=sys.stderr)
        self.assertGreaterEqual(kills[0], max(3, int(SECONDS / 2)))
        self.assertGreater(executed, len(keys) // 2)
        # A replica holds at most one request per client when it is killed.
        self.assertLessEqual(len(stranded), kills[0] * CLIENTS)


if __name__ == "__main__":
    harness.main()
