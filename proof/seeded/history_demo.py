#!/usr/bin/env python3
"""The seeded claim bug (memory-claim-read-then-write.patch) against the history checker: 40 keys,
each sent by 16 clients at once through a gateway on the memory store; the run's history (every
try, every execution the fixture upstream recorded) goes to tests/common/history.py. With the
patch applied the checker must report a key executed twice; without it, nothing.

    proof/seeded/history_demo.py --gateway build/release/gateway/idem-gateway \
        --upstream-bin build/release/testing/fixture_upstream/idem-fixture-upstream

(docs/verification.md, "The seeded bug": apply the patch, rebuild, run this, revert.)
"""
import argparse
import json
import os
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "gateway"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "common"))
import harness  # noqa: E402
import history  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--gateway", required=True)
    parser.add_argument("--upstream-bin", required=True)
    args = parser.parse_args()
    harness.ARGS = argparse.Namespace(gateway=os.path.abspath(args.gateway),
                                      upstream_bin=os.path.abspath(args.upstream_bin), store="memory")
    work = tempfile.mkdtemp(prefix="idem-seeded-")
    upstream = harness.Upstream(work)
    gateway = harness.Gateway(work, upstream.url, "memory:", '[[route]]\nmethod = "POST"\npath = "/echo/**"\n')
    record = history.History(os.path.join(work, "history.jsonl"))
    lock = threading.Lock()
    try:
        for n in range(40):
            key = "seeded-%04d-%s" % (n, os.urandom(6).hex())
            start = threading.Event()

            def client():
                start.wait()
                sent = time.monotonic()
                r = gateway.request("POST", "/echo/seeded", '{"n":1}', key=key)
                with lock:
                    record.op(key, sent, r.status, r.execution_id if r.status == 200 else None, r.replayed,
                              r.body if r.status == 200 else None, None if r.status == 200 else r.json().get("code"))
            threads = [threading.Thread(target=client) for _ in range(16)]
            for t in threads:
                t.start()
            start.set()
            for t in threads:
                t.join()
        lines = harness.request(upstream.port, "GET", "/history").body.decode().splitlines()
        for e in (json.loads(line) for line in lines if line):
            record.execution(e["key"], e["execution_id"], e["attempt"] or None)
        record.close()
        ok, text = history.report(history.load(record.path), policy="unknown")
        print(text)
        print("history checker: %s" % ("no violation" if ok else "VIOLATIONS FOUND"))
        return 0 if ok else 1
    finally:
        gateway.stop()
        upstream.stop()


if __name__ == "__main__":
    sys.exit(main())
