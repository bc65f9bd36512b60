"""Refunds end to end: 48 payments refunded concurrently, each through 3 keys at once, each key sent
3 times (two copies racing, then a late retry), while the payees spend what they received (so that
some refunds find the money gone and, in-process, some plans may go stale between planning and
applying).

- every payment is refunded at most once: the one refund the ledger holds, if any, is the one the
  201 answers named, whichever key got it; the other keys are told 409 payment_already_refunded
  (or 402 insufficient_funds);
- every copy of a key gets the same answer (the same refund for a 201);
- the payments of a payee that spent everything beforehand are all refused 402, and nothing moves;
- the ledger's invariants hold (harness.Ledger: each balance what its payments, refunds and
  bonuses make it);
- the outbox holds one payment.refunded per refund, the 201's body as its refund, with the payment
  id as ordering key, after the payment's payment.succeeded;
- with IDEM_RELAY_BIN and IDEM_NOTIFIER_BIN (set by ctest when they are built): idem-relay
  publishes the outbox to idem-notifier's webhook all along, and it drains with no dead row (the
  notifier lets payment.refunded pass) and one receipt per payment.

    refund_test.py inprocess   idem-payments --idempotency inprocess
    refund_test.py gateway     idem-gateway in front of idem-payments --idempotency off
"""
import json
import os
import queue
import random
import sqlite3
import subprocess
import sys
import threading
import time

import harness as h

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from scratch import run_in_scratch_dir  # noqa: E402

RELAY_BIN = os.environ.get("IDEM_RELAY_BIN", "")
NOTIFIER_BIN = os.environ.get("IDEM_NOTIFIER_BIN", "")
PAYEES, PAYMENTS, KEYS, COPIES, WORKERS = 8, 48, 3, 3, 12


def main():
    run_in_scratch_dir("idem-refunds-", run)


class Chain:
    """idem-relay publishing the ledger's outbox to idem-notifier's webhook."""

    def __init__(self, tmp, ledger_db):
        self.ledger_db = ledger_db
        self.notifier_db = os.path.join(tmp, "notifier.db")
        notifier_port, admin_port = h.free_port(), h.free_port()
        self.notifier = subprocess.Popen(
            [NOTIFIER_BIN, "--db", self.notifier_db, "--listen", "127.0.0.1:%d" % notifier_port],
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(tmp, "notifier.log"), "ab"))
        h.wait_http(notifier_port, "/healthz", self.notifier, "idem-notifier")
        self.relay = subprocess.Popen(
            [RELAY_BIN, "--outbox", "sqlite:" + ledger_db, "--sink", "http://127.0.0.1:%d/events" % notifier_port,
             "--admin-listen", "127.0.0.1:%d" % admin_port, "--log-level", "warn"],
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(tmp, "relay.log"), "ab"))
        h.wait_http(admin_port, "/healthz", self.relay, "idem-relay")

    def outbox(self):
        """(pending rows, dead rows as (message_id, last_error))."""
        db = sqlite3.connect(self.ledger_db, timeout=30)
        try:
            (pending,), = db.execute("SELECT COUNT(*) FROM idem_outbox WHERE state = 'pending'")
            return pending, db.execute("SELECT message_id, last_error FROM idem_outbox WHERE state = 'dead'").fetchall()
        finally:
            db.close()

    def receipts(self):
        db = sqlite3.connect(self.notifier_db, timeout=30)
        try:
            return dict(db.execute("SELECT payment_id, COUNT(*) FROM receipts GROUP BY payment_id"))
        finally:
            db.close()

    def check_drained(self, ledger):
        deadline = time.monotonic() + 120
        while True:
            pending, dead = self.outbox()
            if dead:
                h.fail("dead outbox rows (the notifier refused them): %s" % dead[:5])
            if pending == 0:
                break
            if time.monotonic() > deadline:
                h.fail("the outbox did not drain in 120 s: %d pending" % pending)
            time.sleep(0.2)
        time.sleep(0.5)  # a redelivery in flight would show as a second receipt
        payments = {p for (p,) in ledger.query("SELECT id FROM payments")}
        receipts = self.receipts()
        if set(receipts) != payments or set(receipts.values()) != {1}:
            h.fail("expected one receipt per payment: %d payments, receipts %s"
                   % (len(payments), sorted(receipts.items())[:10]))
        out_of_order = ledger.query(
            "SELECT r.ordering_key FROM idem_outbox r JOIN idem_outbox s ON s.ordering_key = r.ordering_key "
            "AND s.message_id = r.ordering_key || '/payment.succeeded' "
            "WHERE r.message_id = r.ordering_key || '/payment.refunded' AND (r.state <> 'sent' OR r.sent_ms < s.sent_ms)")
        if out_of_order:
            h.fail("refunds not sent, or sent before their payment: %s" % out_of_order[:5])
        return len(payments)

    def stop(self):
        return {"relay": h.stop(self.relay), "notifier": h.stop(self.notifier)}


def run(tmp):
    mode = sys.argv[1]
    random.seed(7)
    db = os.path.join(tmp, "payments.db")
    procs, chain = [], None
    try:
        started, port = h.start_payments(tmp, db, mode)
        procs.extend(started)
        if RELAY_BIN and NOTIFIER_BIN:
            chain = Chain(tmp, db)
        else:
            h.log("IDEM_RELAY_BIN or IDEM_NOTIFIER_BIN unset: the outbox is checked, not relayed")
        deadline = time.monotonic() + 180
        payers = h.open_accounts(port, PAYEES, 1_000_000)
        payees = h.open_accounts(port, PAYEES, 0)
        shop, = h.open_accounts(port, 1, 0)
        ledger = h.Ledger(db)

        payments = {}  # payment id -> (payee, amount)
        for n in range(PAYMENTS):
            payee = payees[n % PAYEES]
            amount = random.randint(100, 1000)
            r = h.send_until_final(port, "/v1/payments", {"from": payers[n % PAYEES], "to": payee, "amount": amount,
                                                          "currency": "EUR"}, h.new_key(), deadline)
            if r.status != 201:
                h.fail("payment %d: %d %s" % (n, r.status, r.body))
            payments[r.json()["id"]] = (payee, amount)

        # One payee spends everything first: each of its payments' refunds must be refused.
        broke = payees[0]
        (received,), = ledger.query("SELECT balance FROM accounts WHERE id = ?", (broke,))
        r = h.send_until_final(port, "/v1/payments", {"from": broke, "to": shop, "amount": received, "currency": "EUR"},
                               h.new_key(), deadline)
        if r.status != 201:
            h.fail("the broke payee's spending: %d %s" % (r.status, r.body))
        ledger.check(context="after the payments")

        answers = {}  # payment id -> {key: [Response per copy]}
        lock = threading.Lock()
        errors = []
        work = queue.Queue()
        for p in payments:
            work.put(p)

        def refund(payment):
            keys = {h.new_key(): [None] * COPIES for _ in range(KEYS)}

            def send(key, c):
                keys[key][c] = h.send_until_final(port, "/v1/refunds", {"payment": payment}, key, deadline)
            # Each key's first two copies race each other and the other keys' copies; then each
            # key's late retry.
            racers = [threading.Thread(target=send, args=(k, c)) for k in keys for c in range(COPIES - 1)]
            for t in racers:
                t.start()
            for t in racers:
                t.join()
            for k in keys:
                send(k, COPIES - 1)
            with lock:
                answers[payment] = keys

        def worker():
            try:
                while True:
                    try:
                        payment = work.get_nowait()
                    except queue.Empty:
                        return
                    refund(payment)
            except SystemExit:
                errors.append("a refund worker gave up")

        def spend(payee, seed):
            rng = random.Random(seed)
            try:
                for _ in range(6):
                    r = h.send_until_final(port, "/v1/payments", {"from": payee, "to": shop,
                                                                  "amount": rng.randint(100, 600), "currency": "EUR"},
                                           h.new_key(), deadline)
                    if r.status not in (201, 402):
                        errors.append("spending of %s: %d %s" % (payee, r.status, r.body))
                    time.sleep(rng.uniform(0, 0.02))
            except SystemExit:
                errors.append("a spender gave up")

        started = time.monotonic()
        threads = [threading.Thread(target=worker) for _ in range(WORKERS)]
        threads += [threading.Thread(target=spend, args=(p, i)) for i, p in enumerate(payees[1:])]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            h.fail("%d errors, first: %s" % (len(errors), errors[0]))

        refunds = {p: (i, k, a) for (i, p, k, a) in ledger.query("SELECT id, payment_id, request_key, amount FROM refunds")}
        accepted_refunds, statuses = {}, {}
        for payment, keys in answers.items():
            refunded = set()
            for key, copies in keys.items():
                status = {c.status for c in copies}
                ids = {c.json().get("id") for c in copies}
                codes = {c.code for c in copies}
                if len(status) != 1 or len(codes) != 1 or (status == {201} and len(ids) != 1):
                    h.fail("payment %s, key %s: the copies were answered differently: %s"
                           % (payment, key, [(c.status, c.body) for c in copies]))
                status = status.pop()
                statuses[status] = statuses.get(status, 0) + 1
                if status == 201:
                    body = copies[0].json()
                    if body["payment"] != payment or body["amount"] != payments[payment][1] or body["object"] != "refund":
                        h.fail("payment %s, key %s: the refund answered is not this payment's: %s" % (payment, key, body))
                    if not copies[-1].replayed:
                        h.fail("payment %s, key %s: the late retry executed again instead of replaying" % (payment, key))
                    refunded.add(body["id"])
                    accepted_refunds[key] = body["id"]
                elif status == 409:
                    if codes != {"payment_already_refunded"}:
                        h.fail("payment %s, key %s: 409 %s" % (payment, key, copies[0].body))
                    if payment not in refunds:
                        h.fail("payment %s, key %s: told already refunded, but the ledger has no refund" % (payment, key))
                elif status != 402 or codes != {"insufficient_funds"}:
                    h.fail("payment %s, key %s: unexpected answer %d %s" % (payment, key, status, copies[0].body))
            if len(refunded) > 1:
                h.fail("payment %s refunded %d times: %s" % (payment, len(refunded), sorted(refunded)))
            held = refunds.get(payment)
            if (held[0] if held else None) != (refunded.pop() if refunded else None):
                h.fail("payment %s: the ledger's refund %s is not the one the clients were told" % (payment, held))
            if payments[payment][0] == broke and held:
                h.fail("payment %s: refunded from a payee that had spent everything" % payment)
        ledger.check(context="after the refunds", accepted_refunds=accepted_refunds)
        if not statuses.get(201) or not statuses.get(409) or not statuses.get(402):
            h.fail("the run should see refunds made, refused as done and refused for funds: %s" % statuses)
        (broke_balance,), = ledger.query("SELECT balance FROM accounts WHERE id = ?", (broke,))
        if broke_balance != 0:
            h.fail("the broke payee's balance moved: %d" % broke_balance)

        # One payment.refunded per refund, the client's 201 as its body, after its payment's event,
        # both keyed by the payment.
        events = {m: (i, k, json.loads(b)) for (i, m, k, b) in ledger.query(
            "SELECT id, message_id, ordering_key, CAST(body AS TEXT) FROM idem_outbox")}
        told = {a.json()["id"]: a.json() for keys in answers.values() for copies in keys.values()
                for a in copies if a.status == 201}
        for payment in payments:
            succeeded = events.get(payment + "/payment.succeeded")
            if not succeeded or succeeded[1] != payment:
                h.fail("payment %s: its payment.succeeded is missing or not keyed by it: %s" % (payment, succeeded))
            refunded = events.get(payment + "/payment.refunded")
            if payment not in refunds:
                if refunded:
                    h.fail("payment %s: a payment.refunded without a refund" % payment)
                continue
            if not refunded or refunded[1] != payment or refunded[0] < succeeded[0]:
                h.fail("payment %s: payment.refunded missing, not keyed by the payment or before its payment: %s"
                       % (payment, refunded))
            if refunded[2] != {"type": "payment.refunded", "refund": told[refunds[payment][0]]}:
                h.fail("payment %s: the event's body is not the 201 the client got: %s" % (payment, refunded[2]))
        relayed = ""
        if chain:
            chain.check_drained(ledger)
            codes = chain.stop()
            chain = None
            if set(codes.values()) != {0}:
                h.fail("relay/notifier exit codes %s" % codes)
            relayed = "; relayed to idem-notifier: no dead row, one receipt per payment"
        h.log("refunds %s: %d payments, %d keys x %d copies each in %.1f s; answers per key %s; %d refunded, "
              "each once; events keyed by payment%s"
              % (mode, PAYMENTS, KEYS, COPIES, time.monotonic() - started, dict(sorted(statuses.items())),
                 len(refunds), relayed))
    finally:
        if chain:
            chain.stop()
        for p in reversed(procs):
            h.stop(p)
    for p in procs:
        if p.returncode != 0:
            h.fail("a process exited with %s after SIGTERM" % p.returncode)


if __name__ == "__main__":
    main()
