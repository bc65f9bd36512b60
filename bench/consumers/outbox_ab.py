#!/usr/bin/env python3
"""The outbox's cost by hand: rounds of idem-payments --outbox off and on.

    python3 bench/consumers/outbox_ab.py --build build/release [--rounds 8] [--duration 8s] [--together]

Each round starts idem-payments (--idempotency inprocess, SQLite FULL) on a fresh database with
the outbox off, then on, and drives each for --duration with wrk (-t2 -c32,
bench/consumers/payment.lua: a fresh Idempotency-Key per request). It prints every round's
payments/s and CPU µs per payment, then the median per-round cost (1 - on/off). run.py measures
the same pair inside the full consumers benchmark; this one runs more rounds of just the pair,
because on this machine the pair's cost moves by several points from one round to the next.

With --together both services run at the same time, each under its own wrk, sharing the two
cores: whatever else the host runs then slows both alike, and the per-round cost measures what
the outbox adds to each payment's work rather than how busy the host was in each half of the
round. It is not the rate of one service alone (each gets about half the machine).
"""
import argparse
import os
import shutil
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run import PaymentsLoad, payments_rate, start_payments  # noqa: E402  (run.py's pair, measured the same way)


def clear(work):
    for name in os.listdir(work):
        os.unlink(os.path.join(work, name))


def one_run(binary, work, outbox, duration):
    try:
        return payments_rate(binary, os.path.join(work, "payments.db"), outbox, duration)
    finally:
        clear(work)


def together(binary, work, duration, on_first):
    """Both services at once, each under its own wrk: (off, on)."""
    started = {}
    try:
        for outbox in ((True, False) if on_first else (False, True)):
            db = os.path.join(work, "payments-%s.db" % ("on" if outbox else "off"))
            started[outbox] = (start_payments(binary, db, outbox), db)
        loads = {outbox: PaymentsLoad(p, port, db, duration) for outbox, ((p, port), db) in started.items()}
        results = {outbox: load.result() for outbox, load in loads.items()}
        return results[False], results[True]
    finally:
        for (p, _), _ in started.values():
            p.terminate()
            p.wait()
        clear(work)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", required=True)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--duration", default="8s")
    parser.add_argument("--together", action="store_true", help="run the two services at the same time")
    args = parser.parse_args()
    binary = os.path.join(args.build, "examples", "payments", "idem-payments")
    if not os.access(binary, os.X_OK):
        sys.exit("no %s: build first" % binary)
    work = tempfile.mkdtemp(prefix="idem-outbox-ab.", dir="/var/tmp")  # a real disk, as users have
    try:
        off, on = [], []
        for i in range(args.rounds):
            if args.together:
                a, b = together(binary, work, args.duration, on_first=i % 2 == 1)
                off.append(a)
                on.append(b)
            else:
                off.append(one_run(binary, work, False, args.duration))
                on.append(one_run(binary, work, True, args.duration))
            print("round %d: off %.0f payments/s %.0f µs, on %.0f payments/s %.0f µs, cost %.1f %%"
                  % (i, off[-1]["payments_per_s"], off[-1]["cpu_us_per_payment"], on[-1]["payments_per_s"],
                     on[-1]["cpu_us_per_payment"], (1 - on[-1]["payments_per_s"] / off[-1]["payments_per_s"]) * 100),
                  flush=True)
        cost = statistics.median(1 - b["payments_per_s"] / a["payments_per_s"] for a, b in zip(off, on))

        def median(runs, field):
            return statistics.median(r[field] for r in runs)

        print("median: off %.0f payments/s %.0f µs, on %.0f payments/s %.0f µs, per-round cost %.1f %%"
              % (median(off, "payments_per_s"), median(off, "cpu_us_per_payment"), median(on, "payments_per_s"),
                 median(on, "cpu_us_per_payment"), cost * 100))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
