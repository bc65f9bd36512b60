#!/usr/bin/env python3
"""The receipt sender in any language: an HTTP handler behind idem-consume (docs/outbox.md).

idem-consume POSTs each payment.succeeded event here with Idempotency-Key: <event id>. The handler
writes the receipt and the key in one SQLite transaction, with a UNIQUE index on the key: the one
delivery no sidecar can dedupe alone (its 2xx came back just before idem-consume died, and the
event is delivered again) hits the index and is answered 200 without a second receipt. An event of
another type (payment.refunded) is answered 200 and left alone; one it cannot use, 422.

    receipts_handler.py --db receipts.db --listen 127.0.0.1:8090

Python 3 standard library only. GET /v1/receipts/PAYMENT_ID shows the receipt.
"""
import argparse
import http.server
import json
import sqlite3
import threading
import time

SCHEMA = """
CREATE TABLE IF NOT EXISTS receipts (
  idempotency_key TEXT NOT NULL UNIQUE,  -- the event id: a second delivery cannot add a row
  payment_id TEXT NOT NULL, payer TEXT NOT NULL, amount INTEGER NOT NULL, currency TEXT NOT NULL,
  sent_at INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS receipts_payment ON receipts (payment_id);
"""


def make_handler(db_path):
    local = threading.local()

    def connection():
        if not hasattr(local, "db"):
            local.db = sqlite3.connect(db_path, timeout=10, isolation_level=None)
            local.db.execute("PRAGMA journal_mode=WAL")
            local.db.execute("PRAGMA synchronous=FULL")
        return local.db

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def answer(self, status, body):
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            key = self.headers.get("Idempotency-Key")
            if self.path != "/events" or not key:
                return self.answer(400, {"error": "POST /events with an Idempotency-Key"})
            try:
                event = json.loads(body)
                kind = event["type"]
                if not isinstance(kind, str):
                    raise TypeError("type")
                if kind != "payment.succeeded":
                    return self.answer(200, {"ignored": kind})  # not ours: acknowledged, nothing sent
                payment = event["payment"]
                row = (key, payment["id"], payment["from"], int(payment["amount"]), payment["currency"], int(time.time()))
            except (ValueError, KeyError, TypeError):
                return self.answer(422, {"error": "not a payment.succeeded event"})  # dead-lettered
            db = connection()
            try:
                db.execute("BEGIN IMMEDIATE")
                inserted = db.execute(
                    "INSERT INTO receipts (idempotency_key, payment_id, payer, amount, currency, sent_at) "
                    "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (idempotency_key) DO NOTHING", row).rowcount
                db.execute("COMMIT")
            except sqlite3.Error as e:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                return self.answer(503, {"error": str(e)})  # idem-consume retries
            self.answer(200, {"receipt": payment["id"], "duplicate": inserted == 0})

        def do_GET(self):
            if self.path == "/healthz":
                return self.answer(200, {"status": "ok"})
            prefix = "/v1/receipts/"
            if not self.path.startswith(prefix):
                return self.answer(404, {"error": "not found"})
            rows = connection().execute("SELECT idempotency_key, payer, amount, currency, sent_at FROM receipts "
                                        "WHERE payment_id = ?", (self.path[len(prefix):],)).fetchall()
            if not rows:
                return self.answer(404, {"error": "no receipt for this payment"})
            self.answer(200, {"object": "receipts", "receipts": [
                {"event_id": r[0], "payer": r[1], "amount": r[2], "currency": r[3], "sent_at": r[4]} for r in rows]})

    return Handler


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", required=True)
    parser.add_argument("--listen", default="127.0.0.1:8090")
    args = parser.parse_args()
    with sqlite3.connect(args.db) as db:
        db.executescript(SCHEMA)
    host, _, port = args.listen.rpartition(":")
    server = http.server.ThreadingHTTPServer((host, int(port)), make_handler(args.db))
    server.daemon_threads = True
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
