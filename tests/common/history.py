"""Histories of the chaos tests, and the one checker that verifies them (Python 3 stdlib only).

A chaos test (replica crashes, payments crash loops, consumer kill loops) writes a JSONL history:
  {"type": "op", "key": K, "attempt": n, "sent": t, "answered": t, "status": s,
   "execution": id or null, "replayed": bool, "body": sha256 of the answer's body or null}
      one client operation (one try of a key); status null when no answer came
  {"type": "exec", "key": K, "execution": id, "attempt": n or null[, "group": G, "seq": n]}
      one execution of the upstream (or a handler's effect), as the upstream itself recorded it;
      with an ordering group (an aggregate, the ordering key) and the event's place in it (1, 2, ...)
  {"type": "event", "what": "kill" | "lease_expired" | ..., "at": t, ...}
      what the test did meanwhile
  {"type": "parked", "key": K}
      a key left for an operator (on_lease_expiry = "unknown": its message dead-lettered as
      outcome_unknown): acknowledged, and accounted for without an execution

check() verifies, and on failure names the offending key with its excerpt of the history:
  - at most one execution per key; with on_lease_expiry = "reexecute" a second is allowed only as
    a takeover (a higher attempt number than the one before it, i.e. after a lease expiry),
    never two of one attempt;
  - every 2xx for a key carries that key's execution id (an execution recorded for that key);
  - every replay is byte-equal to the first stored response (all 2xx bodies of a key agree);
  - no answer for one key carries another key's response (its execution id is another key's);
  - no acknowledged operation lost: a key answered 2xx has an execution;
  - in order per group: the first executions of a group's keys, in the order they were recorded,
    carry seq 1, 2, 3, ... (no step back, no gap, no seq twice).

    python3 history.py check FILE [--policy unknown|reexecute]   exit 1 and the excerpts on failure
"""
import argparse
import collections
import hashlib
import json
import sys
import threading
import time


def body_digest(body):
    if body is None:
        return None
    if isinstance(body, str):
        body = body.encode()
    return hashlib.sha256(body).hexdigest()


class History:
    """A JSONL history file, appended to from any thread."""

    def __init__(self, path):
        self.path = path
        self.lock = threading.Lock()
        self.file = open(path, "a")
        self.attempts = collections.Counter()

    def _write(self, record):
        with self.lock:
            self.file.write(json.dumps(record, sort_keys=True) + "\n")
            self.file.flush()

    def op(self, key, sent, status, execution=None, replayed=False, body=None, code=None):
        with self.lock:
            self.attempts[key] += 1
            attempt = self.attempts[key]
        self._write({"type": "op", "key": key, "attempt": attempt, "sent": sent, "answered": time.monotonic(),
                     "status": status, "execution": execution, "replayed": bool(replayed), "code": code,
                     "body": body_digest(body)})

    def execution(self, key, execution, attempt=None, group=None, seq=None):
        record = {"type": "exec", "key": key, "execution": execution, "attempt": attempt}
        if group is not None:
            record.update(group=group, seq=seq)
        self._write(record)

    def parked(self, key):
        self._write({"type": "parked", "key": key})

    def event(self, what, **fields):
        self._write(dict({"type": "event", "what": what, "at": time.monotonic()}, **fields))

    def close(self):
        self.file.close()


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def check(records, policy="unknown"):
    """The violations found, each (key, sentence); empty when the history holds."""
    ops = collections.defaultdict(list)
    execs = collections.defaultdict(list)
    owner = {}  # execution id -> key
    parked = {r["key"] for r in records if r["type"] == "parked"}
    for r in records:
        if r["type"] == "op":
            ops[r["key"]].append(r)
        elif r["type"] == "exec":
            execs[r["key"]].append(r)
            owner[r["execution"]] = r["key"]
    problems = []
    for key, runs in execs.items():
        if len(runs) <= 1:
            continue
        if policy != "reexecute":
            problems.append((key, "executed %d times" % len(runs)))
            continue
        attempts = [r.get("attempt") for r in runs]
        numbers = [int(a) for a in attempts if a not in (None, "")]
        if len(numbers) != len(attempts) or len(set(numbers)) != len(numbers) or numbers != sorted(numbers):
            problems.append((key, "executed %d times, not each as a takeover with a higher attempt number (%s)"
                             % (len(runs), attempts)))
    for key, tries in ops.items():
        ok = [t for t in tries if t["status"] is not None and 200 <= t["status"] < 300]
        mine = {r["execution"] for r in execs.get(key, [])}
        for t in ok:
            e = t.get("execution")
            if e is None:
                continue
            if e in owner and owner[e] != key:
                problems.append((key, "answered with the response of key %s (execution %s)" % (owner[e], e)))
            elif e not in mine:
                problems.append((key, "answered 2xx with execution %s, which never ran for it" % e))
        bodies = {t["body"] for t in ok if t.get("body") is not None}
        if len(bodies) > 1:
            problems.append((key, "2xx answers with %d different bodies: a replay differs from the stored response"
                             % len(bodies)))
        if ok and not execs.get(key) and key not in parked:
            problems.append((key, "answered 2xx but no execution is recorded: an acknowledged operation was lost"))
    problems.extend(check_order(records))
    return problems


def check_order(records):
    """Per ordering group: the seqs of its keys' first executions, in recorded order, are 1..n."""
    firsts = collections.defaultdict(list)  # group -> seqs of first executions, in recorded order
    executed = set()
    for r in records:
        if r["type"] != "exec" or r.get("group") is None or r["key"] in executed:
            continue
        executed.add(r["key"])
        firsts[r["group"]].append(r.get("seq"))
    problems = []
    for group, seqs in firsts.items():
        if seqs != list(range(1, len(seqs) + 1)):
            at = next(i for i, s in enumerate(seqs) if s != i + 1)
            problems.append((group, "executed out of order: event %d of the group ran as its #%d (the first %d: %s)"
                             % (seqs[at] if seqs[at] is not None else -1, at + 1, min(len(seqs), 30), seqs[:30])))
    return problems


def excerpt(records, key, limit=20):
    lines = [json.dumps(r, sort_keys=True) for r in records if key in (r.get("key"), r.get("group"))]
    return "\n".join(lines[:limit]) + ("\n... %d more" % (len(lines) - limit) if len(lines) > limit else "")


def report(records, policy="unknown"):
    """Checks `records`; returns (ok, text): a summary, or every violation with its excerpt."""
    problems = check(records, policy)
    n_ops = sum(1 for r in records if r["type"] == "op")
    n_exec = sum(1 for r in records if r["type"] == "exec")
    if not problems:
        return True, "history: %d operations, %d executions, every check holds" % (n_ops, n_exec)
    text = ["history: %d violations (%d operations, %d executions)" % (len(problems), n_ops, n_exec)]
    for key, sentence in problems[:10]:
        text.append("- key %s: %s\n%s" % (key, sentence, excerpt(records, key)))
    return False, "\n".join(text)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["check"])
    parser.add_argument("file")
    parser.add_argument("--policy", choices=["unknown", "reexecute"], default="unknown")
    args = parser.parse_args()
    ok, text = report(load(args.file), args.policy)
    print(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
