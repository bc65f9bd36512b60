"""End to end: examples/ledger_consumer (idem::process_once_in_transaction on SQLite) as a queue
would drive it. Every message must be posted to the ledger exactly once:

  storm   three consumer processes on one ledger, each delivered a shuffled stream in which every
          message appears one to three times (a queue's redeliveries, spread across consumers),
          plus conflicting reuses of ids, unparsable lines and a frozen account
  crash   one consumer SIGKILLed at random moments while it works through the stream, restarted
          and redelivered everything each time (nothing was acked durably), until a run finishes;
          after every kill the ledger's balances match its postings

    ledger_consumer_test.py storm|crash   (IDEM_LEDGER_CONSUMER_BIN: the binary)
"""
import collections
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from scratch import run_in_scratch_dir  # noqa: E402

BIN = os.environ["IDEM_LEDGER_CONSUMER_BIN"]
ACCOUNTS = ["acct_%d" % i for i in range(8)]
KILLS = int(os.environ.get("IDEM_CONSUMER_KILLS", "40"))


def messages(n, seed):
    rng = random.Random(seed)
    return [{"id": "m-%05d" % i, "account": rng.choice(ACCOUNTS), "amount": rng.randint(1, 10_000)}
            for i in range(n)]


def start(db, *extra):
    return subprocess.Popen([BIN, "--db", db, *extra], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def ledger(db):
    """(postings per message id, balance per account, sum of postings per account)."""
    con = sqlite3.connect(db, timeout=10)
    try:
        postings = collections.Counter(r[0] for r in con.execute("SELECT message_id FROM postings"))
        balances = dict(con.execute("SELECT account, balance FROM balances"))
        sums = dict(con.execute("SELECT account, sum(amount) FROM postings GROUP BY account"))
        return postings, balances, sums
    finally:
        con.close()


def check_consistent(db, context):
    postings, balances, sums = ledger(db)
    doubled = {k: v for k, v in postings.items() if v > 1}
    assert not doubled, "%s: messages posted more than once: %s" % (context, sorted(doubled.items())[:5])
    assert balances == sums, "%s: balances %s do not match the postings %s" % (context, balances, sums)
    return postings, balances


def expected_balances(msgs, frozen=()):
    out = collections.Counter()
    for m in msgs:
        if m["account"] not in frozen:
            out[m["account"]] += m["amount"]
    return dict(out)


def run_to_end(db, lines, *extra, timeout=120):
    proc = start(db, *extra)
    out, err = proc.communicate("".join(lines), timeout=timeout)
    assert proc.returncode == 0, "consumer exited %d: %s" % (proc.returncode, err[-2000:])
    return [tuple(l.rsplit(" ", 1)) for l in out.splitlines()], err


def storm(tmp):
    db = os.path.join(tmp, "ledger.db")
    msgs = messages(300, seed=7)
    rng = random.Random(8)
    deliveries = [m for m in msgs for _ in range(rng.randint(1, 3))]
    rng.shuffle(deliveries)
    lines = [json.dumps(m) + "\n" for m in deliveries]
    # A producer bug: an id reused for another posting. Sent only after the original was
    # processed (second pass below), it must be refused, never applied.
    conflicting = [json.dumps(dict(m, amount=m["amount"] + 1)) + "\n" for m in msgs[:10]]
    junk = ["not json\n", '{"id": "m-x", "account": "acct_1"}\n', '{"id": "bad id", "account": "acct_1", "amount": 1}\n']
    frozen = "acct_7"

    # Create the files once, so three processes do not race to create the schema.
    run_to_end(db, [], "--frozen", frozen)

    # Three consumers at once, each delivered a third of the stream (with junk mixed in).
    parts = [lines[i::3] for i in range(3)]
    parts[0] = parts[0][:50] + junk + parts[0][50:]
    results = [None] * 3

    def consume(i):
        results[i] = run_to_end(db, parts[i], "--frozen", frozen, "--work-delay-ms", "1")

    threads = [threading.Thread(target=consume, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    outcomes = collections.defaultdict(list)
    for out, _ in results:
        for mid, status in out:
            outcomes[mid].append(status)
    assert outcomes["-"] == ["rejected"], outcomes["-"]
    assert outcomes["m-x"] == ["rejected"], outcomes["m-x"]
    assert outcomes["bad id"] == ["invalid_id"], outcomes["bad id"]
    for m in msgs:
        got = outcomes[m["id"]]
        if m["account"] == frozen:
            assert set(got) <= {"handler_failed", "in_progress"}, (m["id"], got)
        else:
            assert got.count("processed") <= 1, (m["id"], got)
            assert set(got) <= {"processed", "duplicate", "in_progress"}, (m["id"], got)
    check_consistent(db, "after the concurrent consumers")

    # The queue redelivers what was not acked (in_progress, handler_failed): here, everything
    # once more, with the conflicting reuses. Every unfrozen message ends processed once.
    out, _ = run_to_end(db, [json.dumps(m) + "\n" for m in msgs] + conflicting, "--frozen", frozen)
    second = collections.defaultdict(list)
    for mid, status in out:
        second[mid].append(status)
    for m in msgs[:10]:
        if m["account"] != frozen:
            assert second[m["id"]][-1] == "conflict", (m["id"], second[m["id"]])
    processed_total = collections.Counter()
    for mid, got in list(outcomes.items()) + list(second.items()):
        processed_total[mid] += got.count("processed")
    for m in msgs:
        if m["account"] == frozen:
            assert processed_total[m["id"]] == 0, m
        else:
            assert processed_total[m["id"]] == 1, (m["id"], outcomes[m["id"]], second[m["id"]])
    postings, balances = check_consistent(db, "after the redelivery")
    assert balances == expected_balances(msgs, frozen=(frozen,)), (balances, expected_balances(msgs, (frozen,)))
    assert len(postings) == sum(1 for m in msgs if m["account"] != frozen)

    # The account thaws: its messages are processed on their next delivery, once.
    frozen_msgs = [m for m in msgs if m["account"] == frozen]
    for _ in range(2):
        out, _ = run_to_end(db, [json.dumps(m) + "\n" for m in frozen_msgs])
    assert all(status == "duplicate" for _, status in out), out
    _, balances = check_consistent(db, "after the thaw")
    assert balances == expected_balances(msgs), balances
    print("storm: %d messages, %d deliveries across 3 consumers, each posted once" % (len(msgs), len(lines)))


def crash(tmp):
    db = os.path.join(tmp, "ledger.db")
    msgs = messages(600, seed=11)
    lease_ms = 300
    rng = random.Random(12)
    kills = runs = 0
    # Create the ledger first: a consumer killed while starting would leave no tables to check.
    run_to_end(db, [])
    while kills < KILLS:
        runs += 1
        assert runs < 20 * KILLS, "only %d of %d runs were killed" % (kills, runs)
        proc = start(db, "--lease-ms", str(lease_ms), "--work-delay-ms", "2")
        # The queue delivers the whole backlog again (nothing was acked durably), in another
        # order each time, so unposted messages come up while the consumer is being killed.
        lines = [json.dumps(m) + "\n" for m in msgs]
        rng.shuffle(lines)
        feeder = threading.Thread(target=_feed, args=(proc, lines))
        feeder.start()
        time.sleep(rng.uniform(0.005, 0.15))
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            kills += 1
        proc.wait()
        feeder.join()
        proc.stdout.close()
        proc.stderr.close()
        check_consistent(db, "after kill %d" % kills)
    # A message whose holder was killed mid-transaction is in progress until its lease runs out;
    # after that, one more delivery of everything posts whatever is left.
    time.sleep(lease_ms / 1000 * 2)
    out, _ = run_to_end(db, [json.dumps(m) + "\n" for m in msgs])
    statuses = collections.Counter(status for _, status in out)
    assert set(statuses) <= {"processed", "duplicate"}, statuses
    postings, balances = check_consistent(db, "at the end")
    assert len(postings) == len(msgs), "%d of %d messages posted" % (len(postings), len(msgs))
    assert balances == expected_balances(msgs), (balances, expected_balances(msgs))
    print("crash: %d kills in %d runs (%d messages posted by the last), then every one of %d messages "
          "posted exactly once" % (kills, runs, statuses["processed"], len(msgs)))


def _feed(proc, lines):
    try:
        proc.stdin.write("".join(lines))
        proc.stdin.close()
    except (BrokenPipeError, OSError):
        pass


def main():
    run_in_scratch_dir("idem-consumer-", {"storm": storm, "crash": crash}[sys.argv[1]])


if __name__ == "__main__":
    main()
