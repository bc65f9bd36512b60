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
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid):
    fields = open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_run(binary, work, outbox, duration):
    port = free_port()
    db = os.path.join(work, "payments.db")
    p = subprocess.Popen([binary, "--listen", "127.0.0.1:%d" % port, "--db", db, "--idempotency", "inprocess",
                          "--outbox", outbox], stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):
            try:
                urllib.request.urlopen("http://127.0.0.1:%d/healthz" % port, timeout=1)
                break
            except OSError:
                time.sleep(0.05)
        else:
            raise RuntimeError("idem-payments did not answer /healthz")
        con = sqlite3.connect(db, timeout=30)
        con.execute("INSERT INTO accounts (id, currency, balance, opening, created) VALUES "
                    "('acct_a', 'EUR', 4000000000000, 4000000000000, 0), ('acct_b', 'EUR', 0, 0, 0)")
        con.commit()
        con.close()
        cpu0 = cpu_seconds(p.pid)
        out = subprocess.run(["wrk", "-t2", "-c32", "-d" + duration, "-s",
                              os.path.join(ROOT, "bench", "consumers", "payment.lua"), "http://127.0.0.1:%d" % port],
                             capture_output=True, text=True, timeout=600)
        cpu = cpu_seconds(p.pid) - cpu0
        if out.returncode != 0 or "Non-2xx" in out.stdout:
            raise RuntimeError("wrk failed or payments answered non-2xx:\n" + out.stdout + out.stderr)
        rate = float([l for l in out.stdout.splitlines() if l.startswith("Requests/sec")][0].split()[1])
        (count,), = sqlite3.connect(db).execute("SELECT COUNT(*) FROM payments").fetchall()
        return rate, cpu * 1e6 / max(count, 1)
    finally:
        p.terminate()
        p.wait()
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
