"""scripts/run exactly as the README says: start it in the background, run the README tour's
commands and compare what they print with the tour's transcript, headers and all (times, ids and
dates masked), send the three lines scripts/run prints and check their answers (201, the replay
with Idempotent-Replayed: true, 422), then SIGINT: the script exits 0 and its processes are gone.
Also: scripts/run prints at most a screenful, and no compiler warning, before its instructions.

IDEM_RUN_BUILD_DIR (optional) reuses a configured build directory instead of the README's
default Release build in build/run. The ledger and the store go to a fresh IDEM_RUN_VAR, so the
README's own key is new and its first line executes.
"""
import difflib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def fail(message):
    print("FAIL: " + message, flush=True)
    sys.exit(1)


SCREENFUL = 24  # lines scripts/run may print before "idem is running:"

# What changes from run to run, masked in the transcript and in the answers alike.
MASKS = [
    (re.compile(r'"(created|sent_at)":\d+'), r'"\1":<time>'),
    (re.compile(r"\bpay_[0-9a-f]+"), "pay_<id>"),
    (re.compile(r"(?im)^(Idempotency-Key-Expires|Date): .*$"), r"\1: <date>"),
]


def mask(text):
    for pattern, replacement in MASKS:
        text = pattern.sub(replacement, text)
    return text


def readme_tour():
    """The tour's console blocks as [(command, transcript)], and its balance line as (command,
    the answer's beginning)."""
    text = open(os.path.join(ROOT, "README.md")).read()
    tour = text.split("## The 60-second tour", 1)
    if len(tour) != 2:
        fail("README.md has no '## The 60-second tour' section")
    section = tour[1].split("\n## ", 1)[0]
    steps = []
    for block in re.findall(r"```console\n(.*?)```", section, re.S):
        lines = block.rstrip("\n").split("\n")
        if not lines[0].startswith("$ curl "):
            fail("a console block of the tour does not start with '$ curl': %r" % lines[0])
        steps.append((lines[0][2:], "\n".join(lines[1:])))
    if len(steps) < 4:
        fail("the README tour has %d console blocks, expected at least 4" % len(steps))
    balance = re.search(r"`(curl -s localhost:8080/v1/accounts/acct_alice)` gives\s+`(\{[^`]*?),\.\.\.\}`",
                        section)
    if not balance:
        fail("the README tour should say what `curl -s localhost:8080/v1/accounts/acct_alice` gives")
    return steps, (balance.group(1), balance.group(2))


def compare(command, transcript, answer):
    """The answer as curl printed it (CRLF header lines) against the README's transcript."""
    got = mask(answer.replace("\r\n", "\n").rstrip("\n"))
    want = mask(transcript.rstrip("\n"))
    if got != want:
        diff = "\n".join(difflib.unified_diff(want.split("\n"), got.split("\n"), "README.md", "answer",
                                              lineterm=""))
        fail("the README's transcript of\n  %s\ndiffers from the answer (masked):\n%s" % (command, diff))


def run_curl(line):
    out = subprocess.run(["bash", "-c", line], capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        fail("%s\nexited %d: %s" % (line, out.returncode, out.stderr))
    return out.stdout


def check_three(outputs, where):
    first, replay, mismatch = outputs[:3]
    if not first.startswith("HTTP/1.1 201") or "Idempotent-Replayed" in first:
        fail("%s: the payment should be a fresh 201:\n%s" % (where, first))
    if not replay.startswith("HTTP/1.1 201") or "Idempotent-Replayed: true" not in replay:
        fail("%s: the second line should be a replay:\n%s" % (where, replay))
    if first.strip().splitlines()[-1] != replay.strip().splitlines()[-1]:
        fail("%s: the replay's body differs:\n%s\n%s" % (where, first, replay))
    if not mismatch.startswith("HTTP/1.1 422") or "idempotency_key_mismatch" not in mismatch:
        fail("%s: the third line should be 422 idempotency_key_mismatch:\n%s" % (where, mismatch))


def run_tour(steps, balance):
    """Each command of the tour, compared with its transcript. The receipt's command names the
    payment the first answer made; it may take a moment to arrive (relay, notifier)."""
    answers = []
    for command, transcript in steps:
        if "/v1/receipts/" in command:
            payment = json.loads(answers[0].strip().splitlines()[-1])["id"]
            command = re.sub(r"/v1/receipts/pay_[0-9a-f]+", "/v1/receipts/" + payment, command)
            deadline = time.monotonic() + 15
            while True:
                answer = run_curl(command)
                try:
                    if json.loads(answer)["receipts"]:
                        break
                except (ValueError, KeyError):
                    pass
                if time.monotonic() > deadline:
                    fail("no receipt for %s within 15 s: %s" % (payment, answer))
                time.sleep(0.2)
        else:
            answer = run_curl(command)
        compare(command, transcript, answer)
        answers.append(answer)
    command, beginning = balance
    answer = run_curl(command)
    if not answer.startswith(beginning):
        fail("%s gave %s; the README says it begins %s" % (command, answer, beginning))
    return answers


def main():
    steps, balance = readme_tour()
    var = tempfile.mkdtemp(prefix="idem-run-")
    env = dict(os.environ, IDEM_RUN_VAR=var)
    proc = subprocess.Popen([os.path.join(ROOT, "scripts", "run")], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    banner = []
    deadline = time.monotonic() + 840
    try:
        for line in proc.stdout:
            banner.append(line)
            if "Ctrl-C stops all four" in line:
                break
            if time.monotonic() > deadline:
                fail("scripts/run did not start in time")
        else:
            fail("scripts/run exited %s before it was ready:\n%s" % (proc.wait(), "".join(banner[-30:])))
        text = "".join(banner)
        before = text.split("idem is running:", 1)[0].rstrip("\n").split("\n")
        if len(before) > SCREENFUL:
            fail("scripts/run printed %d lines before its instructions (at most %d):\n%s"
                 % (len(before), SCREENFUL, "\n".join(before)))
        if re.search(r"\bwarning\b", text, re.I):
            fail("scripts/run printed a warning:\n" + text)
        pids = [int(p) for p in re.findall(r"\bpid (\d+)", text)]
        if len(pids) != 4:
            fail("expected four pids in the banner:\n" + text)
        printed = [l.strip() for l in banner if l.strip().startswith("curl -si")]
        if len(printed) != 3:
            fail("expected three curl -si lines in the banner:\n" + text)

        check_three(run_tour(steps, balance), "README tour")
        check_three([run_curl(line) for line in printed], "scripts/run's lines")

        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=60)
        if rc != 0:
            fail("scripts/run exited %d after SIGINT" % rc)
        for pid in pids:
            try:
                os.kill(pid, 0)
                fail("process %d still runs after scripts/run stopped" % pid)
            except ProcessLookupError:
                pass
        print("scripts/run: %d line(s) before its instructions; the README tour's %d answers match its "
              "transcript; the printed lines answered 201 / replay / 422; SIGINT stopped pids %s"
              % (len(before), len(steps), pids), flush=True)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
        shutil.rmtree(var, ignore_errors=True)


if __name__ == "__main__":
    main()
