"""End to end: examples/ledger_consumer --source on a real broker (RabbitMQ, a Redis stream, a Kafka
topic on librdkafka's mock cluster, an SQS queue on fauxqs), process_once_in_transaction on SQLite. Three consumer processes share the ledger; they are
SIGKILLed in a loop (IDEM_CONSUMER_KILLS, default 20) and the broker is restarted mid-run. Every
message must be posted exactly once (0 duplicates, 0 lost), the balances must match the postings,
and nothing may be left in the queue.

    ledger_broker_test.py --broker amqp|redis_streams|kafka|sqs --consumer PATH --tool PATH
"""
import argparse
import collections
import os
import random
import sqlite3
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "common"))
sys.path.insert(0, os.path.join(HERE, "..", "gateway"))
import brokers  # noqa: E402
from harness import Process  # noqa: E402
from scratch import run_in_scratch_dir  # noqa: E402

KILLS = int(os.environ.get("IDEM_CONSUMER_KILLS", "20"))
ACCOUNTS = ["acct_%d" % i for i in range(8)]


def ledger(db):
    con = sqlite3.connect(db, timeout=30)
    try:
        postings = collections.Counter(r[0] for r in con.execute("SELECT message_id FROM postings"))
        balances = dict(con.execute("SELECT account, balance FROM balances"))
        sums = dict(con.execute("SELECT account, sum(amount) FROM postings GROUP BY account"))
        return postings, balances, sums
    finally:
        con.close()


def run(args, workdir):
    private = brokers.private_server(args.broker, workdir)
    try:
        broker = brokers.Broker(args.broker, private=private)
        tool = brokers.BrokerTool(args.tool)
        broker.declare(tool)
        db = os.path.join(workdir, "ledger.db")
        rng = random.Random(3)
        n = 3000
        amounts = {"m-%05d" % i: (rng.choice(ACCOUNTS), rng.randint(1, 10_000)) for i in range(n)}
        messages = []
        for mid, (account, amount) in amounts.items():
            for _ in range(rng.randint(1, 2)):
                messages.append({"id": mid, "body": '{"account":"%s","amount":%d}' % (account, amount)})
        rng.shuffle(messages)

        argv = [args.consumer, "--db", db, "--source", broker.source_url(), "--lease-ms", "3000", "--workers", "4",
                "--prefetch", "16"]
        consumers = [Process("ledger-%d" % i, argv, workdir) for i in range(3)]
        started = [time.monotonic()] * 3  # a SIGTERM before a process's main() runs kills it outright
        publisher = threading.Thread(target=tool.publish, args=(broker.sink_url(), messages))
        publisher.start()
        kills = 0
        restarted = False
        while kills < KILLS:
            time.sleep(rng.uniform(0.3, 0.7))
            i = rng.randrange(len(consumers))
            consumers[i].kill()
            kills += 1
            if kills == KILLS // 2 and not restarted:
                restarted = True
                brokers.restart_broker(args.broker, private, down_seconds=brokers.outage_seconds(args.broker))
            consumers[i] = Process("ledger-%d" % i, argv, workdir)
            started[i] = time.monotonic()
        publisher.join()

        def all_posted():
            for c in consumers:
                if not c.alive():
                    raise AssertionError("a consumer exited: %s" % c.log()[-2000:])
            return len(ledger(db)[0]) == n
        brokers.wait_until(all_posted, 300, interval=0.5, what="every message posted")
        # Copies a killed consumer held come back and are retried until its lease on their key
        # expires, then answered as duplicates: wait until none is pending.
        brokers.wait_until(broker.settled, 60, interval=0.5, what="every delivery acknowledged")
        for i, c in enumerate(consumers):
            time.sleep(max(0.0, started[i] + 1.0 - time.monotonic()))  # let one just restarted start
            code = c.stop(timeout=30)
            if code != 0:
                raise AssertionError("consumer exited %s: %s" % (code, c.log()[-2000:]))
        postings, balances, sums = ledger(db)
        twice = {k: v for k, v in postings.items() if v != 1}
        assert not twice, "posted more than once: %s" % list(twice.items())[:10]
        assert sorted(postings) == sorted(amounts), "lost: %s" % sorted(set(amounts) - set(postings))[:10]
        assert balances == sums, "balances do not match postings"
        expected = collections.Counter()
        for account, amount in amounts.values():
            expected[account] += amount
        assert balances == dict(expected), "balances differ from what was sent"
        left = broker.take_left(tool)
        assert left == [], "left in the queue: %s" % left[:5]
        dead = broker.take_dead_letters(tool, idle_ms=500)
        assert dead == [], "dead-lettered: %s" % dead[:5]
        print("ledger over %s: %d messages (%d deliveries), %d kills, broker restarted: posted once each"
              % (args.broker, n, len(messages), kills))
    finally:
        if private:
            private.stop()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--broker", choices=["amqp", "redis_streams", "kafka", "sqs"], required=True)
    parser.add_argument("--consumer", required=True)
    parser.add_argument("--tool", required=True)
    args = parser.parse_args()
    run_in_scratch_dir("idem-ledger-broker-", lambda d: run(args, d))


if __name__ == "__main__":
    main()
