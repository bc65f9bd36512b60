"""scripts/run exactly as the README says: start it in the background, send the README's curl
lines (the 60-second tour) and the three lines scripts/run prints, check the answers (201, the
replay with Idempotent-Replayed: true, 422), then SIGINT: the script exits 0 and both processes
are gone.

IDEM_RUN_BUILD_DIR (optional) reuses a configured build directory instead of the README's
default Release build in build/run. The ledger and the store go to a fresh IDEM_RUN_VAR.
"""
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


def readme_curl_lines():
    text = open(os.path.join(ROOT, "README.md")).read()
    tour = text.split("## The 60-second tour", 1)
    if len(tour) != 2:
        fail("README.md has no '## The 60-second tour' section")
    section = tour[1].split("\n## ", 1)[0]
    lines = [line[2:] for line in section.splitlines() if line.startswith("$ curl")]
    if len(lines) < 3:
        fail("the README tour has %d curl lines, expected at least 3" % len(lines))
    return lines


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


def check_receipt(readme, first):
    """The tour's last line shows the payment's one receipt (the outbox, idem-relay and
    idem-notifier carried it there); its payment id is the one the first answer gave."""
    lines = [line for line in readme if "/v1/receipts/" in line]
    if len(lines) != 1:
        fail("the README tour should end with one curl of /v1/receipts/PAYMENT_ID")
    payment = json.loads(first.strip().splitlines()[-1])["id"]
    line = re.sub(r"/v1/receipts/pay_[0-9a-f]+", "/v1/receipts/" + payment, lines[0])
    deadline = time.monotonic() + 15
    while True:
        out = run_curl(line)
        try:
            receipts = json.loads(out)["receipts"]
            break
        except (ValueError, KeyError):
            if time.monotonic() > deadline:
                fail("no receipt for %s within 15 s: %s" % (payment, out))
            time.sleep(0.2)
    if len(receipts) != 1 or receipts[0]["event_id"] != payment + "/payment.succeeded":
        fail("expected one receipt for %s: %s" % (payment, out))


def main():
    readme = readme_curl_lines()
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
        pids = [int(p) for p in re.findall(r"\bpid (\d+)", text)]
        if len(pids) != 4:
            fail("expected four pids in the banner:\n" + text)
        printed = [l.strip() for l in banner if l.strip().startswith("curl -si")]
        if len(printed) != 3:
            fail("expected three curl -si lines in the banner:\n" + text)

        outputs = [run_curl(line) for line in readme if "/v1/receipts/" not in line]
        check_three(outputs, "README tour")
        check_receipt(readme, outputs[0])
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
        print("scripts/run: README tour and printed lines answered 201 / replay / 422, the receipt came; "
              "SIGINT stopped pids %s"
              % pids, flush=True)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
        shutil.rmtree(var, ignore_errors=True)


if __name__ == "__main__":
    main()
