#!/usr/bin/env python3
"""The outbox's cost in instructions per payment: idem-payments under callgrind, outbox off and on.

    python3 bench/consumers/outbox_instructions.py --build build/release [--warm 5s] [--measure 20s]

Instruction counts do not move with the host's speed or its other tenants, which the payments/s
figures of run.py and outbox_ab.py do by several points. For each mode: idem-payments
(--idempotency inprocess, SQLite FULL, a fresh database) runs under `valgrind --tool=callgrind
--separate-threads=yes`; wrk (-t2 -c32, bench/consumers/payment.lua) loads it for --warm, the
counters are zeroed (callgrind_control -z), wrk loads it for --measure, and the counters are dumped
(callgrind_control -d). Printed: instructions per payment in all and per thread (the store's
writer thread sets the pace), and the outbox's share.
"""
import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run import PaymentsLoad, start_payments  # noqa: E402


def thread_totals(out_prefix):
    """{thread: instructions} from the dump callgrind_control -d asked for: part 1 of each
    thread's output (part 2 is what ran after it, dumped at exit)."""
    totals = {}
    for path in glob.glob(out_prefix + "*"):
        with open(path, errors="replace") as f:
            text = f.read()
        part = re.search(r"^part: *(\d+)", text, re.M)
        thread = re.search(r"^thread: *(\d+)", text, re.M)
        summary = re.search(r"^summary: *(\d+)", text, re.M)
        if part and thread and summary and int(part.group(1)) == 1:
            totals[int(thread.group(1))] = int(summary.group(1))
    return totals


def measure(binary, work, outbox, warm, duration):
    db = os.path.join(work, "payments-%s.db" % ("on" if outbox else "off"))
    prefix = os.path.join(work, "callgrind-%s.out" % ("on" if outbox else "off"))
    p, port = start_payments(binary, db, outbox, start_seconds=120,
                             under=["valgrind", "--tool=callgrind", "--separate-threads=yes",
                                    "--callgrind-out-file=" + prefix])
    try:
        PaymentsLoad(p, port, db, warm).result()
        subprocess.run(["callgrind_control", "-z", str(p.pid)], check=True, capture_output=True)
        load = PaymentsLoad(p, port, db, duration)
        load.result()
        subprocess.run(["callgrind_control", "-d", str(p.pid)], check=True, capture_output=True)
        count = load.payments() - load.count0
    finally:
        p.terminate()
        p.wait()
    totals = thread_totals(prefix)
    if not totals or count == 0:
        raise RuntimeError("no callgrind dump or no payments (%d) in %s" % (count, work))
    return count, totals


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", required=True)
    parser.add_argument("--warm", default="5s")
    parser.add_argument("--measure", default="20s")
    args = parser.parse_args()
    binary = os.path.join(args.build, "examples", "payments", "idem-payments")
    if not os.access(binary, os.X_OK):
        sys.exit("no %s: build first" % binary)
    if not shutil.which("valgrind") or not shutil.which("callgrind_control"):
        sys.exit("valgrind (callgrind) is needed")
    work = tempfile.mkdtemp(prefix="idem-outbox-instructions.", dir="/var/tmp")
    try:
        result = {}
        for outbox in (False, True):
            count, totals = measure(binary, work, outbox, args.warm, args.measure)
            result[outbox] = (count, totals)
            busiest = sorted(totals.items(), key=lambda kv: -kv[1])[:3]
            print("outbox %s: %d payments, %.1fk instructions per payment; busiest threads: %s"
                  % ("on" if outbox else "off", count, sum(totals.values()) / count / 1e3,
                     ", ".join("#%d %.1fk" % (t, n / count / 1e3) for t, n in busiest)), flush=True)
        per = {o: sum(t.values()) / c for o, (c, t) in result.items()}
        writer = {o: max(t.values()) / c for o, (c, t) in result.items()}
        print("outbox's share: +%.1f %% of the instructions per payment, +%.1f %% of the busiest thread's"
              % ((per[True] / per[False] - 1) * 100, (writer[True] / writer[False] - 1) * 100))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
