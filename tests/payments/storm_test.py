"""Retry storm: 50 clients x 20 payments, each sent 3 times with the same key (two of the three
concurrently) -> exactly 1,000 payments, and every answer for a key names the same payment.

    storm_test.py inprocess   idem-payments --idempotency inprocess
    storm_test.py gateway     idem-gateway in front of idem-payments --idempotency off
"""
import os
import random
import sys
import threading
import time

import harness as h

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from scratch import run_in_scratch_dir  # noqa: E402

CLIENTS, PAYMENTS, COPIES = 50, 20, 3


def main():
    run_in_scratch_dir("idem-storm-", run)


def run(tmp):
    mode = sys.argv[1]
    random.seed(6)
    db = os.path.join(tmp, "payments.db")
    procs = []
    try:
        started, port = h.start_payments(tmp, db, mode)
        procs.extend(started)

        accounts = h.open_accounts(port, CLIENTS, 1_000_000)
        ledger = h.Ledger(db)
        before = ledger.check(context="before")
        accepted = {}
        lock = threading.Lock()
        errors = []
        deadline = time.monotonic() + 150

        def client(i):
            try:
                for n in range(PAYMENTS):
                    key = h.new_key()
                    body = {"from": accounts[i], "to": accounts[(i + 1 + n) % CLIENTS],
                            "amount": random.randint(1, 100), "currency": "EUR"}
                    answers = [None] * COPIES

                    def send(c):
                        answers[c] = h.send_until_final(port, "/v1/payments", body, key, deadline)

                    # Copies 0 and 1 race each other; copy 2 is a late retry.
                    racers = [threading.Thread(target=send, args=(c,)) for c in range(COPIES - 1)]
                    for t in racers:
                        t.start()
                    for t in racers:
                        t.join()
                    send(COPIES - 1)
                    ids = {a.json().get("id") for a in answers}
                    if any(a.status != 201 for a in answers) or len(ids) != 1:
                        errors.append("key %s: answers %s" % (key, [(a.status, a.body) for a in answers]))
                        return
                    if not any(a.replayed for a in answers[1:]):
                        errors.append("key %s: no copy was a replay" % key)
                    with lock:
                        accepted[key] = ids.pop()
            except SystemExit:
                errors.append("client %d gave up" % i)

        started = time.monotonic()
        threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            h.fail("%d errors, first: %s" % (len(errors), errors[0]))
        count = ledger.check(accepted=accepted, context="after the storm") - before
        if count != CLIENTS * PAYMENTS or len(accepted) != CLIENTS * PAYMENTS:
            h.fail("expected %d payments, the ledger has %d (%d keys accepted)" % (CLIENTS * PAYMENTS, count, len(accepted)))
        h.log("storm %s: %d payments from %d requests in %.1f s; invariants hold"
              % (mode, count, CLIENTS * PAYMENTS * COPIES, time.monotonic() - started))
    finally:
        for p in reversed(procs):
            h.stop(p)
    for p in procs:
        if p.returncode != 0:
            h.fail("a process exited with %s after SIGTERM" % p.returncode)


if __name__ == "__main__":
    main()
