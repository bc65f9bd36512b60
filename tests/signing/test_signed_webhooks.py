"""End to end: the webhooks idem-relay and idem-consume send are signed per Standard Webhooks
(docs/webhooks.md, "Sending"), and the reference library's verifier agrees.

  - idem-relay publishes a SQLite outbox to a webhook sink (a receiver here) with two secret
    files (webhook_secret_file = [old, new]);
  - idem-consume takes a Redis stream (a private redis-server) and delivers to a handler (the same
    receiver) with one secret file of two lines (sign_secret_file).

Every request the receiver gets is checked with `Webhook.verify` of the npm package
standardwebhooks (testing/webhook_signers/verify.mjs): it verifies with either secret alone; with a
secret neither sender has, with one byte of the body changed, or at a faked clock 6 minutes
after its timestamp (a replay) it fails, with the library's reason. webhook-id is the message id
(the Idempotency-Key). The secrets appear in neither program's log (at debug level) nor /metrics.
A secret file others can read stops each program at start, naming the file, not the secret.

Binaries from the environment (set by ctest): IDEM_RELAY_BIN, IDEM_CONSUME_BIN,
IDEM_BROKER_TOOL_BIN, IDEM_NODE, IDEM_WEBHOOK_SIGNERS (after scripts/deps' npm ci: the test
fails, never skips, without them).
"""
import base64
import http.server
import json
import os
import secrets as random_secrets
import sqlite3
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "common"))
import brokers  # noqa: E402
from ports import free_port  # noqa: E402
from procs import Proc  # noqa: E402
from scratch import run_in_scratch_dir  # noqa: E402

MESSAGES = 25


def fail(message):
    print("FAIL: " + message, file=sys.stderr, flush=True)
    sys.exit(1)


def log(message):
    print(message, flush=True)


def new_secret():
    return "whsec_" + base64.b64encode(random_secrets.token_bytes(32)).decode()


def write_secret_file(path, lines, mode=0o600):
    with open(path, "w") as f:
        f.write("".join(line + "\n" for line in lines))
    os.chmod(path, mode)
    return path


class Receiver:
    """Records every POST (path, headers, exact body) and answers 200."""

    def __init__(self):
        self.requests = []
        self.lock = threading.Lock()
        receiver = self

        class Handle(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                headers = {k.lower(): v for k, v in self.headers.items()}
                with receiver.lock:
                    receiver.requests.append({"path": self.path, "headers": headers, "body": body,
                                              "received": time.time()})
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handle)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path):
        return "http://127.0.0.1:%d%s" % (self.server.server_address[1], path)

    def at(self, path):
        with self.lock:
            return [r for r in self.requests if r["path"] == path]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


class Verifier:
    """testing/webhook_signers/verify.mjs: the reference library's Webhook.verify, one line each."""

    def __init__(self):
        self.node = brokers.env("IDEM_NODE")
        self.dir = brokers.env("IDEM_WEBHOOK_SIGNERS")
        if not os.path.isdir(os.path.join(self.dir, "node_modules", "standardwebhooks")):
            raise RuntimeError("%s has no node_modules: run scripts/deps (npm ci)" % self.dir)

    def verify(self, checks):
        """[(secret, request, body, now or None)] -> [answer dicts], in order."""
        lines = []
        for secret, request, body, now in checks:
            req = {"secret": secret, "headers": {k: v for k, v in request["headers"].items() if k.startswith("webhook-")},
                   "body_base64": base64.b64encode(body).decode()}
            if now is not None:
                req["now"] = now
            lines.append(json.dumps(req) + "\n")
        out = subprocess.run([self.node, os.path.join(self.dir, "verify.mjs")], input="".join(lines),
                             capture_output=True, text=True, timeout=120, cwd=self.dir)
        answers = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
        if len(answers) != len(checks):
            fail("verify.mjs answered %d of %d: %s" % (len(answers), len(checks), out.stderr[-2000:]))
        return answers


def check_signed(who, requests, expected_ids, old, new, verifier):
    """Every request genuine by the reference library with either secret alone; forgeries and a
    replay refused by it, for the reason that applies."""
    ids = [r["headers"].get("webhook-id") for r in requests]
    if sorted(set(ids)) != sorted(expected_ids):
        fail("%s: webhook-ids %s, expected %s" % (who, sorted(set(filter(None, ids))), sorted(expected_ids)))
    stranger = new_secret()
    checks, expect = [], []
    for r in requests:
        h = r["headers"]
        if h.get("idempotency-key") != h["webhook-id"]:
            fail("%s: webhook-id %r is not the Idempotency-Key %r" % (who, h["webhook-id"], h.get("idempotency-key")))
        signatures = h.get("webhook-signature", "").split(" ")
        if len(signatures) != 2 or not all(s.startswith("v1,") for s in signatures):
            fail("%s: webhook-signature is not one v1 signature per secret: %r" % (who, h.get("webhook-signature")))
        ts = int(h["webhook-timestamp"])
        if abs(ts - r["received"]) > 30:
            fail("%s: webhook-timestamp %d is not the time it was sent (%.0f)" % (who, ts, r["received"]))
        body = r["body"]
        changed = bytearray(body)
        changed[len(changed) // 2] ^= 0x01  # one bit of one byte
        checks += [(old, r, body, None), (new, r, body, None),
                   (stranger, r, body, None),
                   (old, r, bytes(changed), None),
                   (new, r, body, ts + 360)]  # the same request replayed 6 minutes later
        expect += [None, None, "No matching signature found", "No matching signature found", "Message timestamp too old"]
    answers = verifier.verify(checks)
    for (secret, r, _, now), want, got in zip(checks, expect, answers):
        which = "old" if secret == old else "new" if secret == new else "another"
        if want is None and not got["ok"]:
            fail("%s: %s not verified with the %s secret: %s" % (who, r["headers"]["webhook-id"], which, got["error"]))
        if want is not None and (got["ok"] or got["error"] != want):
            fail("%s: %s (%s secret%s) should fail with %r, got %r" %
                 (who, r["headers"]["webhook-id"], which, ", replayed" if now else "", want, got))
    log("%s: %d requests, each verified by standardwebhooks with either secret alone; a stranger's secret, "
        "a changed body and a replay 6 minutes later refused" % (who, len(requests)))


def check_no_secret(who, proc, admin_port, secret_values):
    status, metrics = brokers.http_get(admin_port, "/metrics")
    if status != 200:
        fail("%s: /metrics answered %d" % (who, status))
    text = proc.log() + metrics
    for s in secret_values:
        for shown in (s, s[len("whsec_"):]):
            if shown in text:
                fail("%s: a secret is in its log or /metrics" % who)
    if "signing with 2 secret(s)" not in proc.log():
        fail("%s: its start line does not say it signs with 2 secrets: %s" % (who, proc.log()[-1000:]))


def check_refuses_open_file(who, argv, workdir, open_file, secret):
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=workdir)
    if out.returncode != 2 or open_file not in out.stderr or "mode 0644" not in out.stderr:
        fail("%s with a secret file others can read: exit %d, %r" % (who, out.returncode, out.stderr[-500:]))
    if secret in out.stderr or secret[len("whsec_"):] in out.stderr:
        fail("%s: the refusal shows the secret" % who)


def relay_half(tmp, receiver, verifier, old, new):
    db_path = os.path.join(tmp, "service.db")
    db = sqlite3.connect(db_path)  # the service's database: it exists before the relay (which never makes it)
    db.execute("CREATE TABLE payments (id TEXT PRIMARY KEY)")
    db.commit()
    db.close()
    old_file = write_secret_file(os.path.join(tmp, "relay-old.secret"), [old])
    new_file = write_secret_file(os.path.join(tmp, "relay-new.secret"), [new])
    admin_port = free_port()
    base = ('outbox = "sqlite:%s"\nsink = "%s"\nlog_level = "debug"\npoll_interval = "20ms"\n'
            % (db_path, receiver.url("/relay")))
    config = os.path.join(tmp, "relay.toml")
    with open(config, "w") as f:
        f.write(base + 'admin_listen = "127.0.0.1:%d"\nwebhook_secret_file = ["%s", "%s"]\n'
                % (admin_port, old_file, new_file))
    relay = Proc("relay", [brokers.env("IDEM_RELAY_BIN"), "--config", config], tmp)
    try:
        def ready():
            if not relay.alive():
                fail("idem-relay exited: " + relay.log()[-2000:])
            db = sqlite3.connect(db_path, timeout=30)
            try:
                return db.execute("SELECT count(*) FROM sqlite_master WHERE name = 'idem_outbox'").fetchone()[0] == 1
            finally:
                db.close()
        brokers.wait_until(ready, 30, what="idem-relay made the outbox")
        ids = ["evt-relay-%03d" % i for i in range(MESSAGES)]
        db = sqlite3.connect(db_path, timeout=30)
        for i, message_id in enumerate(ids):
            body = json.dumps({"id": message_id, "amount": i * 100, "note": "reçu n°%d" % i},
                              ensure_ascii=False).encode()
            db.execute("INSERT INTO idem_outbox (message_id, body) VALUES (?, ?)", (message_id, body))
        db.commit()
        db.close()
        brokers.wait_until(lambda: len({r["headers"].get("webhook-id") for r in receiver.at("/relay")}) >= MESSAGES,
                           60, what="the relay's %d webhooks" % MESSAGES)
        check_signed("idem-relay", receiver.at("/relay"), ids, old, new, verifier)
        check_no_secret("idem-relay", relay, admin_port, [old, new])
    finally:
        relay.stop()
    open_file = write_secret_file(os.path.join(tmp, "relay-open.secret"), [old], mode=0o644)
    open_config = os.path.join(tmp, "relay-open.toml")
    with open(open_config, "w") as f:
        f.write(base + 'admin_listen = "off"\nwebhook_secret_file = ["%s", "%s"]\n' % (new_file, open_file))
    check_refuses_open_file("idem-relay", [brokers.env("IDEM_RELAY_BIN"), "--config", open_config], tmp, open_file, old)
    log("idem-relay: a secret file others can read stops it at start")


def consume_half(tmp, receiver, verifier, old, new):
    private = brokers.PrivateRedis(tmp)
    consume = None
    try:
        broker = brokers.Broker("redis_streams", private=private)
        tool = brokers.BrokerTool(brokers.env("IDEM_BROKER_TOOL_BIN"))
        broker.declare(tool)
        secret_file = write_secret_file(os.path.join(tmp, "consume.secret"), [old, new])
        admin_port = free_port()
        config = os.path.join(tmp, "consume.toml")
        base = ('source = "%s"\ndeliver = "%s"\nstore = "sqlite:%s"\nlog_level = "debug"\nname = "signed"\n'
                % (broker.source_url(), receiver.url("/consume"), os.path.join(tmp, "consume.db")))
        with open(config, "w") as f:
            f.write(base + 'admin_listen = "127.0.0.1:%d"\nsign_secret_file = "%s"\n' % (admin_port, secret_file))
        consume = Proc("consume", [brokers.env("IDEM_CONSUME_BIN"), "--config", config], tmp)
        ids = ["evt-consume-%03d" % i for i in range(MESSAGES)]
        messages = [{"id": m, "body": json.dumps({"id": m, "amount": i, "note": "naïve"}, ensure_ascii=False),
                     "headers": {"event-type": "payment.succeeded"}} for i, m in enumerate(ids)]
        tool.publish(broker.sink_url(), messages)

        def delivered():
            if not consume.alive():
                fail("idem-consume exited: " + consume.log()[-2000:])
            return len({r["headers"].get("webhook-id") for r in receiver.at("/consume")}) >= MESSAGES
        brokers.wait_until(delivered, 60, what="idem-consume's %d deliveries" % MESSAGES)
        check_signed("idem-consume", receiver.at("/consume"), ids, old, new, verifier)
        check_no_secret("idem-consume", consume, admin_port, [old, new])
        consume.stop()
        open_file = write_secret_file(os.path.join(tmp, "consume-open.secret"), [old], mode=0o644)
        open_config = os.path.join(tmp, "consume-open.toml")
        with open(open_config, "w") as f:
            f.write(base + 'admin_listen = "off"\nsign_secret_file = "%s"\n' % open_file)
        check_refuses_open_file("idem-consume", [brokers.env("IDEM_CONSUME_BIN"), "--config", open_config], tmp,
                                open_file, old)
        log("idem-consume: a secret file others can read stops it at start")
    finally:
        if consume:
            consume.stop()
        private.stop()


def main():
    verifier = Verifier()
    old, new = new_secret(), new_secret()

    def body(tmp):
        receiver = Receiver()
        try:
            relay_half(tmp, receiver, verifier, old, new)
            consume_half(tmp, receiver, verifier, old, new)
        finally:
            receiver.close()
    run_in_scratch_dir("idem-signed-webhooks-", body)
    log("PASS")


if __name__ == "__main__":
    main()
