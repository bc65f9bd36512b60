"""Crash: a process is SIGKILLed at random moments (>= 100 times) while scripted clients keep their
keys and retry. After every kill the ledger's invariants hold; at the end every operation has
ended with exactly one effect, and the run's history (every try, every payment the ledger holds,
every kill: history.jsonl) passes the history checker (tests/common/history.py).

    crash_test.py inprocess   kills idem-payments --idempotency inprocess (restarted at once)
    crash_test.py gateway     kills idem-gateway (on_lease_expiry = "unknown") in front of
                              idem-payments --idempotency off
    crash_test.py gateway-ask the same with on_lease_expiry = "ask": the service's lookup
                              resolves what the kills leave in progress, so no key may end
                              outcome_unknown
"""
import os
import random
import signal
import sys
import threading
import time

import harness as h

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from scratch import run_in_scratch_dir  # noqa: E402
import history  # noqa: E402

KILLS = int(os.environ.get("IDEM_PAYMENTS_KILLS", "100"))
CLIENTS = 4
ACCOUNTS = 8


def main():
    run_in_scratch_dir("idem-crash-", run)


def run(tmp):
    mode = sys.argv[1]
    random.seed(66)
    db = os.path.join(tmp, "payments.db")
    svc_log, gw_log = os.path.join(tmp, "svc.log"), os.path.join(tmp, "gw.log")
    svc_port = h.free_port()
    lease_ms = 300
    state = {"victim": None}
    service = None

    if mode == "inprocess":
        port = svc_port

        def start_victim():
            return h.start_service(svc_port, db, "inprocess", lease_ms=lease_ms, log_path=svc_log)
    else:
        service = h.start_service(svc_port, db, "off", log_path=svc_log)
        port = h.free_port()
        config = os.path.join(tmp, "gateway.toml")
        h.write_gateway_config(config, port, svc_port, os.path.join(tmp, "idem.db"),
                               lease="%dms" % lease_ms, on_lease_expiry="ask" if mode == "gateway-ask" else "unknown")

        def start_victim():
            return h.start_gateway(config, port, log_path=gw_log)

    state["victim"] = start_victim()
    ledger = h.Ledger(db)
    try:
        accounts = h.open_accounts(port, ACCOUNTS, 100_000)
        ledger.check(context="after opening the accounts")
        accepted, refused, unknown = {}, set(), set()
        record = history.History(os.path.join(tmp, "history.jsonl"))
        lock = threading.Lock()
        stop = threading.Event()
        errors = []
        deadline = time.monotonic() + 170 + KILLS * 0.5  # the clients give up after this

        def client(i):
            rnd = random.Random(i)
            try:
                while not stop.is_set():
                    key = h.new_key()  # the client's journal: it keeps this key until a final answer
                    a, b = rnd.sample(accounts, 2)
                    body = {"from": a, "to": b, "amount": rnd.randint(1, 20_000), "currency": "EUR"}
                    r = h.send_until_final(port, "/v1/payments", body, key, deadline,
                                           accept_unknown=(mode == "gateway"), record=record)
                    with lock:
                        if r.status == 201:
                            accepted[key] = r.json()["id"]
                        elif r.status == 402:
                            refused.add(key)
                        elif r.status == 409:
                            unknown.add(key)
                        else:
                            errors.append("key %s: %d %s" % (key, r.status, r.body))
            except SystemExit:
                errors.append("client %d gave up" % i)

        threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
        for t in threads:
            t.start()
        started = time.monotonic()
        for n in range(KILLS):
            time.sleep(random.uniform(0.005, 0.12))
            victim = state["victim"]
            record.event("kill", mode=mode)
            victim.send_signal(signal.SIGKILL)
            victim.wait()
            ledger.check(context="after kill %d" % (n + 1))
            state["victim"] = start_victim()
        stop.set()
        for t in threads:
            t.join()
        if errors:
            h.fail("%d errors, first: %s" % (len(errors), errors[0]))
        count = ledger.check(accepted=accepted, context="at the end")
        rows = dict(ledger.query("SELECT request_key, id FROM payments"))
        for key in refused:
            if key in rows:
                h.fail("key %s was refused (402) but has payment %s" % (key, rows[key]))
        unknown_done = sum(1 for k in unknown if k in rows)
        # The payments the ledger holds are the executions: one per key at most, whatever the mode.
        for key, payment in ledger.query("SELECT request_key, id FROM payments WHERE request_key <> ''"):
            record.execution(key, payment)
        record.close()
        ok, text = history.report(history.load(record.path), policy="unknown")
        h.log(text)
        if not ok:
            h.fail("the history checker failed")
        # Every payment belongs to an operation a client made, and each at most once.
        known = set(accepted) | refused | unknown
        strays = [k for k in rows if k not in known and k]
        if strays:
            h.fail("payments for keys no client finished: %s" % strays[:5])
        if mode != "gateway" and unknown:
            h.fail("%s mode answered outcome_unknown" % mode)
        if count != len(accepted) + unknown_done:
            h.fail("payments %d != accepted %d + unknown-but-executed %d" % (count, len(accepted), unknown_done))
        h.log("crash %s: %d kills in %.1f s; %d payments accepted, %d refused (402), %d outcome unknown "
              "(%d of them executed, once); invariants held after every kill"
              % (mode, KILLS, time.monotonic() - started, len(accepted), len(refused), len(unknown), unknown_done))
    finally:
        h.stop(state["victim"])
        if service:
            h.stop(service)


if __name__ == "__main__":
    main()
