#!/usr/bin/env python3
"""The outbox's cost by hand: idem-payments --outbox off and on, measured in pairs.

    python3 bench/consumers/outbox_ab.py --build build/release [--rounds 40] [--duration 3s]
                                         [--method sliced|fresh|together]

Each measurement drives idem-payments (--idempotency inprocess, SQLite FULL) with wrk (-t2 -c32,
bench/consumers/payment.lua: a fresh Idempotency-Key per request) for --duration. It prints every
pair's payments/s and CPU µs per payment, then the median per-pair cost (1 - on/off).

--method sliced (the default) is run.py's payments_pairs: both services started once, each on its
own fresh database, warmed with one discarded slice, then loaded in turn, one --duration slice at a
time, in ABBA order (off-on, on-off, ...). On this machine the host's speed drifts by more than the
outbox costs over tens of seconds; short alternating slices put both halves of a pair in the same
phase of that drift, and the ABBA order cancels a linear trend inside a pair. Both databases grow
alike.

--method fresh starts a new service on a new database for every half of every round: the off half,
then the on half. The most exposed to the host's drift, and to anything that differs between one
process start and the next.

--method together runs both services at the same time, each under its own wrk, sharing the two
cores: whatever else the host runs slows both alike. It measures what the outbox adds to each
payment's work rather than the rate of one service alone (each gets about half the machine).
"""
import argparse
import os
import shutil
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run import PaymentsLoad, payments_pairs, start_payments  # noqa: E402  (run.py's pair, measured the same way)


def cpu_times():
    """The host's CPU time so far, in ticks: (all, stolen by the hypervisor)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:9]]
    return sum(fields), fields[7]


def clear(work):
    for name in os.listdir(work):
        os.unlink(os.path.join(work, name))


def payments_rate(binary, db, outbox, duration):
    """idem-payments (start_payments) on a fresh `db`, driven alone by wrk for `duration`."""
    p, port = start_payments(binary, db, outbox)
    try:
        return PaymentsLoad(p, port, db, duration).result()
    finally:
        p.terminate()
        p.wait()


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


def sliced(binary, work, rounds, duration):
    """run.py's payments_pairs, every pair printed: ([off], [on])."""
    try:
        return payments_pairs(binary, work, rounds, duration, on_pair=report)
    finally:
        clear(work)


def report(i, off, on):
    print("pair %d: off %.0f payments/s %.0f µs, on %.0f payments/s %.0f µs, cost %.1f %%"
          % (i, off["payments_per_s"], off["cpu_us_per_payment"], on["payments_per_s"], on["cpu_us_per_payment"],
             (1 - on["payments_per_s"] / off["payments_per_s"]) * 100), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", required=True)
    parser.add_argument("--rounds", type=int, default=40, help="pairs to measure")
    parser.add_argument("--duration", default="3s", help="wrk's -d for each half of a pair")
    parser.add_argument("--method", choices=("sliced", "fresh", "together"), default="sliced")
    args = parser.parse_args()
    binary = os.path.join(args.build, "examples", "payments", "idem-payments")
    if not os.access(binary, os.X_OK):
        sys.exit("no %s: build first" % binary)
    work = tempfile.mkdtemp(prefix="idem-outbox-ab.", dir="/var/tmp")  # a real disk, as users have
    start = cpu_times()
    try:
        if args.method == "sliced":
            off, on = sliced(binary, work, args.rounds, args.duration)
        else:
            off, on = [], []
            for i in range(args.rounds):
                if args.method == "together":
                    a, b = together(binary, work, args.duration, on_first=i % 2 == 1)
                else:
                    a = one_run(binary, work, False, args.duration)
                    b = one_run(binary, work, True, args.duration)
                off.append(a)
                on.append(b)
                report(i, a, b)
        cost = statistics.median(1 - b["payments_per_s"] / a["payments_per_s"] for a, b in zip(off, on))

        def median(runs, field):
            return statistics.median(r[field] for r in runs)

        print("median: off %.0f payments/s %.0f µs, on %.0f payments/s %.0f µs, per-pair cost %.1f %%"
              % (median(off, "payments_per_s"), median(off, "cpu_us_per_payment"), median(on, "payments_per_s"),
                 median(on, "cpu_us_per_payment"), cost * 100))
        end = cpu_times()
        # Time the hypervisor gave to other guests: the noise every pair above shares.
        print("host steal: %.1f %% of CPU time" % (100 * (end[1] - start[1]) / max(end[0] - start[0], 1)))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
