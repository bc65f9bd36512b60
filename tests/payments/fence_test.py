"""The attempt fence end to end (issue 19 §3, docs/security.md "The fence contract for
upstreams"): the gateway's lease is 1 s and the first attempt of a payment is held 3 s inside the
service (--hold-attempt 1:3000), so the client's retry after the lease takes the key over and
executes as attempt 2; when the first attempt's write finally runs, the service refuses it
(409 idempotency_attempt_stale) because it saw attempt 2 for the key. The money moved once, and
the key replays attempt 2's payment. Repeated for several keys at once, with reexecute (the policy
that would charge twice without the fence).
"""
import os
import sys
import threading
import time

import harness as h

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from scratch import run_in_scratch_dir  # noqa: E402

KEYS = 6


def run(tmp):
    db = os.path.join(tmp, "payments.db")
    svc_port, gw_port = h.free_port(), h.free_port()
    service = h.start_service(svc_port, db, "off", log_path=os.path.join(tmp, "svc.log"),
                              extra=["--hold-attempt", "1:3000"])
    config = os.path.join(tmp, "gateway.toml")
    # A lease shorter than the upstream call on purpose: the window the fence closes.
    h.write_gateway_config(config, gw_port, svc_port, os.path.join(tmp, "idem.db"), lease="1s",
                           on_lease_expiry="reexecute", top='upstream_timeout = "10s"')
    gateway = h.start_gateway(config, gw_port, log_path=os.path.join(tmp, "gw.log"))
    try:
        ledger = h.Ledger(db)
        # Opened on the service itself: a write without Idempotency-Attempt is not held.
        accounts = h.open_accounts(svc_port, 2, 1_000_000)
        keys = [h.new_key() for _ in range(KEYS)]
        body = {"from": accounts[0], "to": accounts[1], "amount": 700, "currency": "EUR"}
        first = {}

        def slow_first(key):
            first[key] = h.request(gw_port, "POST", "/v1/payments", body, key, timeout=20)
        threads = [threading.Thread(target=slow_first, args=(k,)) for k in keys]
        for t in threads:
            t.start()
        time.sleep(1.5)  # past the 1 s lease, while every first attempt is still held
        retries = {k: h.request(gw_port, "POST", "/v1/payments", body, k, timeout=20) for k in keys}
        for t in threads:
            t.join(30)
        for k in keys:
            r = retries[k]
            if r.status != 201:
                h.fail("key %s: the retry (attempt 2) got %d %s" % (k, r.status, r.body))
            f = first[k]
            if f.status != 409 or f.code != "idempotency_attempt_stale":
                h.fail("key %s: the late first attempt was not refused as stale: %d %s" % (k, f.status, f.body))
        time.sleep(0.2)
        ledger.check(context="after the late first attempts")
        rows = ledger.query("SELECT request_key, id, amount FROM payments")
        by_key = {}
        for key, payment_id, amount in rows:
            by_key.setdefault(key, []).append(payment_id)
        for k in keys:
            if by_key.get(k) != [retries[k].json()["id"]]:
                h.fail("key %s: payments %s, the client was told %s" % (k, by_key.get(k), retries[k].json()["id"]))
            again = h.request(gw_port, "POST", "/v1/payments", body, k)
            if again.status != 201 or not again.replayed or again.json()["id"] != retries[k].json()["id"]:
                h.fail("key %s: a later retry did not replay attempt 2's payment: %d %s" % (k, again.status, again.body))
        (balance, opening), = ledger.query("SELECT balance, opening FROM accounts WHERE id = ?", (accounts[1],))
        if balance - opening != 700 * KEYS:
            h.fail("the payee received %d, expected %d (700 once per key)" % (balance - opening, 700 * KEYS))
        h.log("fence: %d keys, each: attempt 1 held 3 s, attempt 2 paid, attempt 1 refused as stale; "
              "money moved once per key" % KEYS)
    finally:
        h.stop(gateway)
        h.stop(service)


if __name__ == "__main__":
    run_in_scratch_dir("idem-fence-", run)
