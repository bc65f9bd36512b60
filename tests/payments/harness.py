"""Shared helpers for the payments end-to-end tests: processes, an HTTP client, invariants.

Python 3 stdlib only. Binaries come from IDEM_PAYMENTS_BIN and IDEM_GATEWAY_BIN (set by ctest).
"""
import http.client
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
import uuid

PAYMENTS_BIN = os.environ.get("IDEM_PAYMENTS_BIN", "")
GATEWAY_BIN = os.environ.get("IDEM_GATEWAY_BIN", "")
AUTH = "Bearer sk_test_payments"


def fail(message):
    print("FAIL: " + message, flush=True)
    sys.exit(1)


def log(message):
    print(message, flush=True)


# A port that was free a moment ago and that this process never handed out before
# (tests/common/ports.py; the caller retries if another process takes it).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from ports import free_port  # noqa: E402,F401


def new_key():
    return str(uuid.uuid4())


class Response:
    def __init__(self, status, headers, body):
        self.status = status
        self.headers = headers
        self.body = body

    def json(self):
        return json.loads(self.body) if self.body else {}

    def header(self, name):
        for k, v in self.headers:
            if k.lower() == name.lower():
                return v
        return None

    @property
    def replayed(self):
        return self.header("Idempotent-Replayed") == "true"

    @property
    def code(self):
        try:
            return self.json().get("code")
        except ValueError:
            return None


def request(port, method, path, body=None, key=None, auth=AUTH, timeout=10.0):
    """One request on a fresh connection. Raises OSError / http.client errors on network failure."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        headers = {"Authorization": auth}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if key is not None:
            headers["Idempotency-Key"] = key
        conn.request(method, path, body=data, headers=headers)
        r = conn.getresponse()
        return Response(r.status, r.getheaders(), r.read().decode())
    finally:
        conn.close()


FINAL_STATUSES = {200, 201, 400, 402, 404, 422}


def send_until_final(port, path, body, key, deadline, accept_unknown=False, record=None):
    """Sends (path, body, key) until the answer is final, as a client keeping its key would:
    connection errors, 409 in_use, 5xx are retried; 409 payment_already_refunded is final (the
    refund happened, under another key). Returns the final Response. `record` (a
    tests/common/history.py History) gets every try, with the payment id of a 2xx as its
    execution."""
    while True:
        if time.monotonic() > deadline:
            fail("no final answer for key %s before the deadline" % key)
        sent = time.monotonic()
        try:
            r = request(port, "POST", path, body, key)
        except (OSError, http.client.HTTPException):
            if record is not None:
                record.op(key, sent, None)
            time.sleep(0.02 + random.random() * 0.03)
            continue
        if record is not None:
            ok = 200 <= r.status < 300
            record.op(key, sent, r.status, r.json().get("id") if ok else None, r.replayed, r.body if ok else None, r.code)
        if r.status in FINAL_STATUSES or (r.status == 409 and r.code == "payment_already_refunded"):
            return r
        if r.status == 409 and r.code == "idempotency_outcome_unknown" and accept_unknown:
            return r
        if r.status in (409, 502, 503, 504) or r.status >= 500:
            time.sleep(0.02 + random.random() * 0.05)
            continue
        fail("unexpected answer %d %s for key %s" % (r.status, r.body, key))


def wait_http(port, path, proc, what, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            fail("%s exited with %s during start-up" % (what, proc.returncode))
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            conn.request("GET", path)
            if conn.getresponse().status == 200:
                return
        except (OSError, http.client.HTTPException):
            pass
        time.sleep(0.01)
    fail("%s did not answer %s on port %d" % (what, path, port))


def start_service(port, db, mode, lease_ms=60000, log_path=None, extra=()):
    args = [PAYMENTS_BIN, "--listen", "127.0.0.1:%d" % port, "--db", db, "--idempotency", mode,
            "--lease-ms", str(lease_ms)] + list(extra)
    err = open(log_path, "ab") if log_path else subprocess.DEVNULL
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=err)
    wait_http(port, "/healthz", proc, "idem-payments")
    return proc


def write_gateway_config(path, port, upstream_port, store, lease="60s", on_lease_expiry="reexecute", top=""):
    """A gateway in front of the service, a route for each POST (refunds too). With
    on_lease_expiry = "ask", POST /v1/payments asks the service's lookup
    (GET /v1/payments/by-idempotency-key/{key}) about keys whose holder vanished; the other
    routes park theirs (unknown)."""
    default_policy = "unknown" if on_lease_expiry == "ask" else on_lease_expiry
    with open(path, "w") as f:
        f.write(f'''listen = "127.0.0.1:{port}"
admin_listen = "off"
upstream = "http://127.0.0.1:{upstream_port}"
store = "sqlite:{store}"
log_level = "warn"
lookup_timeout = "200ms"
{top}
[idempotency]
lease = "{lease}"
allow_short_lease = true
on_lease_expiry = "{default_policy}"
[tenant]
from = "authorization"
''')
        for route in ("/v1/payments", "/v1/refunds", "/v1/orders", "/v1/bonuses", "/v1/accounts"):
            f.write(f'[[route]]\nmethod = "POST"\npath = "{route}"\n')
            if route == "/v1/payments" and on_lease_expiry == "ask":
                f.write('on_lease_expiry = "ask"\nask = "GET /v1/payments/by-idempotency-key/{key}"\n')


def start_gateway(config, port, log_path=None):
    err = open(log_path, "ab") if log_path else subprocess.DEVNULL
    proc = subprocess.Popen([GATEWAY_BIN, "--config", config], stdout=subprocess.DEVNULL, stderr=err)
    # The gateway passes GET through: /healthz of the service answers once the gateway listens.
    wait_http(port, "/healthz", proc, "idem-gateway")
    return proc


def start_payments(tmp, db, mode):
    """The payments service on `db` as a test runs it: in-process idempotency ("inprocess"), or
    without it behind idem-gateway (any other mode). Returns (processes started, port to send to)."""
    svc_port = free_port()
    if mode == "inprocess":
        return [start_service(svc_port, db, "inprocess", log_path=os.path.join(tmp, "svc.log"))], svc_port
    procs = [start_service(svc_port, db, "off", log_path=os.path.join(tmp, "svc.log"))]
    port = free_port()
    config = os.path.join(tmp, "gateway.toml")
    write_gateway_config(config, port, svc_port, os.path.join(tmp, "idem.db"))
    procs.append(start_gateway(config, port, log_path=os.path.join(tmp, "gw.log")))
    return procs, port


def stop(proc, sig=signal.SIGTERM):
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    return proc.returncode


def open_accounts(port, count, balance, currency="EUR"):
    ids = []
    deadline = time.monotonic() + 60
    for _ in range(count):
        r = send_until_final(port, "/v1/accounts", {"currency": currency, "balance": balance}, new_key(), deadline)
        if r.status != 201:
            fail("opening an account: %d %s" % (r.status, r.body))
        ids.append(r.json()["id"])
    return ids


class Ledger:
    """Read-only view of the ledger database, for invariants (the service may be running)."""

    def __init__(self, path):
        self.path = path

    def query(self, sql, args=()):
        db = sqlite3.connect("file:%s?mode=ro" % self.path, uri=True, timeout=10)
        try:
            return db.execute(sql, args).fetchall()
        finally:
            db.close()

    # Each account's balance as its rows say it should be: its opening balance and bonuses, plus
    # what payments and refunds moved in, minus what they moved out (a refund moves its payment's
    # amount back, from the payee to the payer). One statement: one snapshot of a running ledger.
    EXPECTED_BALANCES = """
        WITH moved(account, amount) AS (
          SELECT id, opening FROM accounts
          UNION ALL SELECT account, amount FROM bonuses
          UNION ALL SELECT to_account, amount FROM payments
          UNION ALL SELECT from_account, -amount FROM payments
          UNION ALL SELECT p.from_account, r.amount FROM refunds r JOIN payments p ON p.id = r.payment_id
          UNION ALL SELECT p.to_account, -r.amount FROM refunds r JOIN payments p ON p.id = r.payment_id),
        expected(account, balance) AS (SELECT account, SUM(amount) FROM moved GROUP BY account)
        SELECT a.id, a.balance, e.balance FROM accounts a LEFT JOIN expected e ON e.account = a.id
        WHERE e.balance IS NULL OR a.balance <> e.balance"""

    def check(self, accepted=None, unknown=None, context="", accepted_refunds=None):
        """The invariants: money conserved, every account's balance what its payments, refunds
        and bonuses make it, no negative balance, no key with two payments (or two refunds);
        every refund the whole of an existing payment, at most one per payment; every accepted
        key (key -> payment id) has exactly its one payment, every accepted refund key (key ->
        refund id) its one refund; unknown keys at most one. Returns the number of payments."""
        where = " (%s)" % context if context else ""
        (total, opening), = self.query("SELECT COALESCE(SUM(balance),0), COALESCE(SUM(opening),0) FROM accounts")
        (bonuses,), = self.query("SELECT COALESCE(SUM(amount),0) FROM bonuses")
        if total != opening + bonuses:
            fail("money not conserved%s: balances %d, opening %d + bonuses %d" % (where, total, opening, bonuses))
        wrong = self.query(self.EXPECTED_BALANCES)
        if wrong:
            fail("balances that their payments, refunds and bonuses do not explain%s (account, balance, expected): %s"
                 % (where, wrong[:5]))
        negative = self.query("SELECT id, balance FROM accounts WHERE balance < 0")
        if negative:
            fail("negative balances%s: %s" % (where, negative))
        dups = self.query("SELECT request_key, COUNT(*) FROM payments WHERE request_key <> '' "
                          "GROUP BY request_key HAVING COUNT(*) > 1")
        if dups:
            fail("keys with more than one payment%s: %s" % (where, dups[:5]))
        twice = self.query("SELECT payment_id, COUNT(*) FROM refunds GROUP BY payment_id HAVING COUNT(*) > 1")
        if twice:
            fail("payments refunded more than once%s: %s" % (where, twice[:5]))
        unlike = self.query("SELECT r.id, r.payment_id, r.amount, p.amount FROM refunds r LEFT JOIN payments p "
                            "ON p.id = r.payment_id WHERE p.id IS NULL OR r.amount <> p.amount OR r.currency <> p.currency")
        if unlike:
            fail("refunds that are not the whole of a payment%s (refund, payment, amount, payment's): %s"
                 % (where, unlike[:5]))
        dups = self.query("SELECT request_key, COUNT(*) FROM refunds WHERE request_key <> '' "
                          "GROUP BY request_key HAVING COUNT(*) > 1")
        if dups:
            fail("keys with more than one refund%s: %s" % (where, dups[:5]))
        refunds = dict(self.query("SELECT request_key, id FROM refunds"))
        for key, refund_id in (accepted_refunds or {}).items():
            if refunds.get(key) != refund_id:
                fail("accepted refund key %s: client saw %s, ledger has %s%s" % (key, refund_id, refunds.get(key), where))
        rows = dict(self.query("SELECT request_key, id FROM payments"))
        for key, payment_id in (accepted or {}).items():
            if rows.get(key) != payment_id:
                fail("accepted key %s: client saw %s, ledger has %s%s" % (key, payment_id, rows.get(key), where))
        for key in unknown or ():
            pass  # at most one, checked by `dups` above
        (count,), = self.query("SELECT COUNT(*) FROM payments")
        return count
