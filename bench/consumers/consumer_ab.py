#!/usr/bin/env python3
"""Two builds of the in-process consumer, side by side: idem-consume-bench inprocess of binary A
and binary B on the same broker and store, in interleaved rounds.

    python3 bench/consumers/consumer_ab.py A_BENCH B_BENCH [--rounds 4] [--messages 20000]
                                           [--brokers amqp,redis_streams] [--stores memory,sqlite,redis]

A_BENCH and B_BENCH are idem-consume-bench binaries (build/release/bench/consumers/; copy one
aside before rebuilding the other). Each round runs every broker x store pair once per binary, in
the order A B on odd rounds and B A on even ones, each on a fresh queue (or stream) with the same
messages published by that binary, each store fresh (a SQLite file, a Redis database, a
PostgreSQL database of its own). RabbitMQ, Redis and PostgreSQL are started fresh under a
temporary directory (scripts/lib/servers.sh) and stopped at exit. Prints every run, then per pair
the medians of messages/s and CPU µs per message and the B/A ratios. On these shared cores one
case's rate moves by tens of percent between rounds: read the ratios of many rounds.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import urllib.parse

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SERVERS = os.path.join(ROOT, "scripts", "lib", "servers.sh")
sys.path.insert(0, os.path.join(ROOT, "tests", "common"))
from stores import read_servers_env  # noqa: E402


class Rig:
    def __init__(self, args, work):
        self.args, self.work, self.n = args, work, 0
        needed = set()
        if "amqp" in args.brokers:
            needed.add("rabbitmq")
        if "redis_streams" in args.brokers or "redis" in args.stores:
            needed.add("redis")
        if "postgres" in args.stores:
            needed.add("postgres")
        subprocess.run(["bash", SERVERS, "start", os.path.join(work, "servers")] + sorted(needed), check=True,
                       stdout=subprocess.DEVNULL)
        self.env = read_servers_env(os.path.join(work, "servers", "env"))

    def urls(self, broker):
        self.n += 1
        name = "ab-%d-%d" % (os.getpid(), self.n)
        if broker == "amqp":
            base = self.env["IDEM_TEST_AMQP_URL"].rstrip("/")
            return "%s?queue=%s" % (base, name), "%s?exchange=&routing_key=%s" % (base, name)
        netloc = urllib.parse.urlsplit(self.env["IDEM_TEST_REDIS_URL"]).netloc
        return "redis+stream://%s/%s?group=bench" % (netloc, name), "redis+stream://%s/%s" % (netloc, name)

    def store_url(self, store):
        if store == "memory":
            return "memory:"
        if store == "sqlite":
            return "sqlite:%s" % os.path.join(self.work, "store-%d.db" % self.n)
        if store == "postgres":
            base = self.env["IDEM_TEST_POSTGRES_URL"]
            subprocess.run(["psql", base, "-qc", "CREATE DATABASE ab_%d" % self.n], check=True, stdout=subprocess.DEVNULL)
            parts = urllib.parse.urlsplit(base)
            return urllib.parse.urlunsplit(parts._replace(path="/ab_%d" % self.n))
        return self.env["IDEM_TEST_REDIS_URL"] + "/%d" % (self.n % 15 + 1)

    def run(self, binary, broker, store):
        source, sink = self.urls(broker)
        if broker == "amqp":  # declare the queue before publishing: take nothing from it once
            subprocess.run([binary, "raw", source, "0"], check=True, stdout=subprocess.DEVNULL)
        subprocess.run([binary, "publish", sink, str(self.args.messages)], check=True, stdout=subprocess.DEVNULL)
        out = subprocess.run([binary, "inprocess", source, str(self.args.messages), self.store_url(store)],
                             check=True, capture_output=True, text=True, timeout=600)
        return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("a")
    parser.add_argument("b")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--messages", type=int, default=20000)
    parser.add_argument("--brokers", default="amqp,redis_streams")
    parser.add_argument("--stores", default="memory,sqlite,redis")
    args = parser.parse_args()
    args.brokers, args.stores = args.brokers.split(","), args.stores.split(",")
    for b in args.brokers:
        if b not in ("amqp", "redis_streams"):
            parser.error("--brokers: amqp and redis_streams only (Kafka and SQS: bench/consumers/run.py)")
    for s in args.stores:
        if s not in ("memory", "sqlite", "redis", "postgres"):
            parser.error("--stores: memory, sqlite, redis, postgres")
    for binary in (args.a, args.b):
        if not os.access(binary, os.X_OK):
            parser.error("not an executable: %s" % binary)
    work = tempfile.mkdtemp(prefix="idem-consumer-ab-")
    os.chmod(work, 0o755)  # the servers drop root (rabbitmq, postgres) and must reach it
    results = {}
    try:
        rig = Rig(args, work)
        for r in range(args.rounds):
            for broker in args.brokers:
                for store in args.stores:
                    for side in ("A", "B") if r % 2 == 0 else ("B", "A"):
                        got = rig.run(args.a if side == "A" else args.b, broker, store)
                        results.setdefault((broker, store, side), []).append(got)
                        print("round %d  %-13s %-8s %s  %8.0f messages/s  %6.1f us CPU/message"
                              % (r + 1, broker, store, side, got["msgs_per_s"], got["cpu_us_per_msg"]), flush=True)
    finally:
        subprocess.run(["bash", SERVERS, "stop", os.path.join(work, "servers")], stdout=subprocess.DEVNULL)
        shutil.rmtree(work, ignore_errors=True)
    print("| broker | store | A (messages/s) | B | B/A | CPU per message, B/A |\n|---|---|---:|---:|---:|---:|")
    for broker in args.brokers:
        for store in args.stores:
            med = {side: (statistics.median(g["msgs_per_s"] for g in results[(broker, store, side)]),
                          statistics.median(g["cpu_us_per_msg"] for g in results[(broker, store, side)]))
                   for side in ("A", "B")}
            print("| %s | %s | %.0f | %.0f | %.2f | %.2f |" % (broker, store, med["A"][0], med["B"][0],
                                                               med["B"][0] / med["A"][0], med["B"][1] / med["A"][1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
