#!/usr/bin/env python3
"""The outbox's cost by hand: interleaved rounds of idem-payments --outbox off and on.

    python3 bench/consumers/outbox_ab.py --build build/release [--rounds 8] [--duration 8s]

Each round starts idem-payments (--idempotency inprocess, SQLite FULL) on a fresh database with
the outbox off, then on, and drives each for --duration with wrk (-t2 -c32,
bench/consumers/payment.lua: a fresh Idempotency-Key per request). It prints every round's
payments/s and CPU µs per payment, then the median per-round cost (1 - on/off). run.py measures
the same pair inside the full consumers benchmark; this one runs more rounds of just the pair,
because on this machine the pair's cost moves by several points from one round to the next.
"""
import argparse
import os
import shutil
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run import payments_rate  # noqa: E402  (run.py's pair, measured the same way)


def one_run(binary, work, outbox, duration):
    db = os.path.join(work, "payments.db")
    try:
        r = payments_rate(binary, db, outbox == "on", duration)
        return r["payments_per_s"], r["cpu_us_per_payment"]
    finally:
        for name in os.listdir(work):
            os.unlink(os.path.join(work, name))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", required=True)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--duration", default="8s")
    args = parser.parse_args()
    binary = os.path.join(args.build, "examples", "payments", "idem-payments")
    if not os.access(binary, os.X_OK):
        sys.exit("no %s: build first" % binary)
    work = tempfile.mkdtemp(prefix="idem-outbox-ab.", dir="/var/tmp")  # a real disk, as users have
    try:
        off, on = [], []
        for i in range(args.rounds):
            off.append(one_run(binary, work, "off", args.duration))
            on.append(one_run(binary, work, "on", args.duration))
            print("round %d: off %.0f payments/s %.0f µs, on %.0f payments/s %.0f µs, cost %.1f %%"
                  % (i, off[-1][0], off[-1][1], on[-1][0], on[-1][1], (1 - on[-1][0] / off[-1][0]) * 100), flush=True)
        cost = statistics.median(1 - b[0] / a[0] for a, b in zip(off, on))
        print("median: off %.0f payments/s %.0f µs, on %.0f payments/s %.0f µs, per-round cost %.1f %%"
              % (statistics.median(r[0] for r in off), statistics.median(r[1] for r in off),
                 statistics.median(r[0] for r in on), statistics.median(r[1] for r in on), cost * 100))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
