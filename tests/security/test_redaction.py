"""Secrets never appear in any output (SPEC §12): every binary started with password-bearing URLs
in every form against real servers that require them, and errors provoked (a wrong password, a
server that is down). The password's bytes, raw or percent-encoded, must appear in no output
(stdout, stderr, /metrics, /readyz) and in no file the processes write.

    test_redaction.py --bin-dir BUILD_DIR [unittest args]

Servers: the PostgreSQL scripts/test starts (a role with a password is made for the test and
required by a pg_hba line of its own, removed at the end), a private Redis with requirepass and an
ACL user, and the shared RabbitMQ node's password-protected user.
"""
import argparse
import os
import signal
import subprocess
import sys
import time
import unittest
import urllib.parse
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "common"))
import brokers  # noqa: E402
import tls_certs  # noqa: E402
from scratch import run_in_scratch_dir  # noqa: E402

ARGS = None
# Characters that need percent-encoding in a URL, and a distinctive run to search for.
PASSWORD = "Pw-7q%s@:/?#&=+ x" % uuid.uuid4().hex[:8]
WRONG = "Wrong-9z%s@:/" % uuid.uuid4().hex[:8]
ENC = urllib.parse.quote(PASSWORD, safe="")
WRONG_ENC = urllib.parse.quote(WRONG, safe="")


def forms(secret):
    """Every way a secret may show: raw, percent-encoded both ways, and its distinctive core."""
    core = secret[:10]
    return {secret, urllib.parse.quote(secret, safe=""), urllib.parse.quote(secret), core,
            urllib.parse.quote(core, safe="")}


def bin_path(*parts):
    return os.path.join(ARGS.bin_dir, *parts)


class Secrets(unittest.TestCase):
    outputs = []  # (what, text): every output collected, checked at the end of each test

    @classmethod
    def setUpClass(cls):
        cls.tmp_holder = []
        import tempfile
        cls.dir = tempfile.mkdtemp(prefix="idem-redaction-")
        cls.pg = PostgresRole(PASSWORD)
        cls.redis = brokers.PrivateRedis(cls.dir)
        redis_cli(cls.redis.port, "CONFIG", "SET", "requirepass", PASSWORD)
        redis_cli(cls.redis.port, "ACL", "SETUSER", "alice", "on", ">" + PASSWORD, "~*", "&*", "+@all",
                  password=PASSWORD)
        cls.amqp_password = os.environ["IDEM_TEST_AMQP_PASSWORD"]
        # Kafka: the mock cluster has no SASL, so every login is refused (the secret still goes
        # into librdkafka's configuration and its error paths); the topic exists.
        cls.kafka = brokers.PrivateKafka(cls.dir)
        cls.kafka.topic("redaction", 1)
        cls.kafka.topic("redaction.dead-letter", 1)
        # SQS: fauxqs takes any credentials, so the secrets go to a queue that does not exist.
        cls.sqs = brokers.PrivateSqs(cls.dir)

    @classmethod
    def tearDownClass(cls):
        cls.pg.drop()
        cls.redis.stop()
        cls.kafka.stop()
        cls.sqs.stop()
        import shutil
        shutil.rmtree(cls.dir, ignore_errors=True)

    def setUp(self):
        self.collected = []

    def run_bin(self, what, argv, timeout=30, env=None):
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, cwd=self.dir)
        self.collected.append((what, out.stdout + out.stderr))
        return out

    def check_clean(self, secrets):
        for what, text in self.collected:
            for s in secrets:
                self.assertNotIn(s, text, "%s printed a secret:\n%s" % (what, text))
        for root, _, files in os.walk(self.dir):
            for name in files:
                path = os.path.join(root, name)
                if name.endswith((".db", ".db-wal", ".db-shm", ".aof", ".rdb")) or "appendonly" in path:
                    continue  # databases: what the stores keep, not what a process prints
                with open(path, "rb") as f:
                    data = f.read()
                for s in secrets:
                    self.assertNotIn(s.encode(), data, "%s holds a secret" % path)

    # --- the stores' URLs --------------------------------------------------------------------

    def store_urls(self, password, enc):
        pg = self.pg
        redis = self.redis.port
        return {
            "postgres user:pass@": "postgres://%s:%s@127.0.0.1:%d/%s" % (pg.role, enc, pg.port, pg.db),
            "postgres ?password=": "postgres://%s@127.0.0.1:%d/%s?password=%s" % (pg.role, pg.port, pg.db, enc),
            "redis :pass@": "redis://:%s@127.0.0.1:%d" % (enc, redis),
            "redis user:pass@": "redis://alice:%s@127.0.0.1:%d" % (enc, redis),
            "redis pass@": "redis://%s@127.0.0.1:%d" % (enc, redis),
        }

    def test_idemctl_with_good_and_wrong_passwords(self):
        for name, url in self.store_urls(PASSWORD, ENC).items():
            for extra in ([], ["--json"]):
                out = self.run_bin("idemctl stats %s" % name, [bin_path("cli", "idemctl"), "stats", "--store", url] + extra)
                self.assertEqual(out.returncode, 0, "%s: %s" % (name, out.stderr))
                out = self.run_bin("idemctl list %s" % name, [bin_path("cli", "idemctl"), "list", "--store", url] + extra)
                self.assertEqual(out.returncode, 0, "%s: %s" % (name, out.stderr))
        for name, url in self.store_urls(WRONG, WRONG_ENC).items():
            out = self.run_bin("idemctl stats wrong %s" % name, [bin_path("cli", "idemctl"), "stats", "--store", url])
            self.assertEqual(out.returncode, 1, "%s: %s" % (name, out.stdout + out.stderr))
            self.assertIn("idemctl:", out.stderr)
        # An argument CLI11 does not expect is echoed in its usage error: redacted too.
        url = self.store_urls(PASSWORD, ENC)["postgres user:pass@"]
        out = self.run_bin("idemctl stray url", [bin_path("cli", "idemctl"), "stats", "--store", url, url])
        self.assertEqual(out.returncode, 2)
        self.check_clean(forms(PASSWORD) | forms(WRONG))

    def test_gateway_logs_metrics_and_errors(self):
        upstream = brokers.Handler()
        try:
            for name, url in self.store_urls(PASSWORD, ENC).items():
                port, admin = brokers.free_port(), brokers.free_port()
                log = os.path.join(self.dir, "gateway-%s.log" % name.replace(" ", "_").replace("/", "_"))
                with open(log, "wb") as err:
                    p = subprocess.Popen([bin_path("gateway", "idem-gateway"), "--listen", "127.0.0.1:%d" % port,
                                          "--admin-listen", "127.0.0.1:%d" % admin, "--store", url, "--upstream",
                                          "http://127.0.0.1:%d" % upstream.server.server_address[1]],
                                         stdout=err, stderr=subprocess.STDOUT, cwd=self.dir)
                try:
                    brokers.wait_until(lambda: ready(admin), 30, what="gateway on %s" % name)
                    for path in ("/readyz", "/metrics", "/healthz"):
                        self.collected.append(("gateway %s %s" % (name, path), brokers.http_get(admin, path)[1]))
                finally:
                    p.terminate()
                    p.wait(30)
                with open(log) as f:
                    text = f.read()
                self.assertIn("store ", text)  # the start-up line names the store, redacted
            for name, url in self.store_urls(WRONG, WRONG_ENC).items():
                out = self.run_bin("gateway wrong %s" % name, [bin_path("gateway", "idem-gateway"), "--listen",
                                                              "127.0.0.1:0", "--admin-listen", "off", "--store", url])
                self.assertEqual(out.returncode, 1, out.stderr)
            # A server that is down: the store URL with the right password, a closed port.
            down = "postgres://%s:%s@127.0.0.1:%d/%s" % (self.pg.role, ENC, brokers.free_port(), self.pg.db)
            out = self.run_bin("gateway down", [bin_path("gateway", "idem-gateway"), "--listen", "127.0.0.1:0",
                                                "--admin-listen", "off", "--store", down])
            self.assertEqual(out.returncode, 1)
            # A bad configuration naming the URL.
            out = self.run_bin("gateway bad flag", [bin_path("gateway", "idem-gateway"), "--store",
                                                    "postgres://u:%s@h/db" % ENC, "--nonsense"])
            self.assertEqual(out.returncode, 2)
        finally:
            upstream.stop()
        self.check_clean(forms(PASSWORD) | forms(WRONG))

    def test_gateway_webhook_secrets(self):
        """A webhook route's signing secret (docs/webhooks.md) and the signatures clients send
        appear in no output: logs of genuine and forged events, refusals, /metrics, a start and a
        reload refused for a world-readable secret file."""
        import hashlib
        import hmac
        import http.client
        import signal
        import tempfile
        secret = "whsec_Rd%s" % uuid.uuid4().hex
        wrong = "whsec_Wr%s" % uuid.uuid4().hex
        # Outside self.dir: check_clean reads every file there, and this one holds the secret.
        secret_dir = tempfile.mkdtemp(prefix="idem-redaction-secret-")
        secret_file = os.path.join(secret_dir, "stripe.secret")
        with open(secret_file, "w") as f:
            f.write(secret + "\n")
        os.chmod(secret_file, 0o600)
        upstream = brokers.Handler()
        signatures = []

        def stripe_header(key, body):
            t = str(int(time.time()))
            mac = hmac.new(key.encode(), (t + "." + body).encode(), hashlib.sha256).hexdigest()
            signatures.append(mac)
            return "t=%s,v1=%s" % (t, mac)

        def post(port, body, header):
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            try:
                c.request("POST", "/hooks/stripe", body, {"Stripe-Signature": header, "Content-Type": "application/json"})
                r = c.getresponse()
                return r.status, r.read().decode("utf-8", "replace")
            finally:
                c.close()

        config = os.path.join(self.dir, "webhook.toml")
        with open(config, "w") as f:
            f.write('[[route]]\nmethod = "POST"\npath = "/hooks/stripe"\n'
                    'webhook = { provider = "stripe", secret_file = "%s" }\n' % secret_file)
        port, admin = brokers.free_port(), brokers.free_port()
        log = os.path.join(self.dir, "gateway-webhook.log")
        try:
            with open(log, "wb") as err:
                p = subprocess.Popen([bin_path("gateway", "idem-gateway"), "--config", config, "--listen",
                                      "127.0.0.1:%d" % port, "--admin-listen", "127.0.0.1:%d" % admin, "--store",
                                      "sqlite:" + os.path.join(self.dir, "webhook.db"), "--upstream",
                                      "http://127.0.0.1:%d" % upstream.server.server_address[1]],
                                     stdout=err, stderr=subprocess.STDOUT, cwd=self.dir)
            try:
                brokers.wait_until(lambda: ready(admin), 30, what="gateway with a webhook route")
                body = '{"id":"evt_redaction_%s","object":"event"}' % uuid.uuid4().hex[:8]
                status, text = post(port, body, stripe_header(secret, body))
                self.assertEqual(status, 200, text)
                status, text = post(port, body, stripe_header(secret, body))  # a replay
                self.assertEqual(status, 200, text)
                status, text = post(port, body, stripe_header(wrong, body))
                self.assertEqual(status, 400, text)
                self.collected.append(("webhook refusal", text))
                status, text = post(port, body + " ", stripe_header(secret, body))
                self.assertEqual(status, 400, text)
                self.collected.append(("webhook refusal (body changed)", text))
                for path in ("/readyz", "/metrics"):
                    self.collected.append(("gateway webhook %s" % path, brokers.http_get(admin, path)[1]))
                # A reload with a secret file others may read: refused, and said so without the secret.
                os.chmod(secret_file, 0o644)
                p.send_signal(signal.SIGHUP)
                brokers.wait_until(lambda: "reload failed" in open(log).read(), 10, what="the refused reload")
            finally:
                p.terminate()
                p.wait(30)
            with open(log) as f:
                text = f.read()
            self.assertIn("verdict=signature_invalid", text)
            self.assertIn("chmod 600", text)
            # And a start with it: exit 2, one line naming the file.
            out = self.run_bin("gateway webhook bad secret file", [bin_path("gateway", "idem-gateway"), "--config", config,
                                                                  "--listen", "127.0.0.1:0", "--admin-listen", "off",
                                                                  "--store", "memory:"])
            self.assertEqual(out.returncode, 2, out.stderr)
            self.assertIn("secret_file", out.stderr)
        finally:
            upstream.stop()
            import shutil
            shutil.rmtree(secret_dir, ignore_errors=True)
        self.check_clean(forms(secret) | forms(wrong) | set(signatures))

    def test_sidecar_signing_secrets(self):
        """The secrets idem-relay's webhook sink and idem-consume sign with (docs/webhooks.md,
        "Sending") appear in no output: logs at debug level while signing, /readyz, /metrics, and
        a start refused for a secret file others may read."""
        import base64
        import shutil
        import sqlite3
        import tempfile
        secret = "whsec_" + base64.b64encode(uuid.uuid4().bytes + uuid.uuid4().bytes).decode()
        # Outside self.dir: check_clean reads every file there, and this one holds the secret.
        secret_dir = tempfile.mkdtemp(prefix="idem-redaction-signing-")
        secret_file = os.path.join(secret_dir, "signing.secret")
        with open(secret_file, "w") as f:
            f.write(secret + "\n")
        os.chmod(secret_file, 0o600)
        handler = brokers.Handler()
        tag = uuid.uuid4().hex[:8]
        try:
            # idem-relay: a SQLite outbox to a webhook, signed.
            db_path = os.path.join(self.dir, "signing-outbox-%s.db" % tag)
            sqlite3.connect(db_path).close()  # the service's database: the relay never makes it
            relay_config = os.path.join(self.dir, "relay-signing.toml")
            with open(relay_config, "w") as f:
                f.write('outbox = "sqlite:%s"\nsink = "%s"\npoll_interval = "20ms"\nwebhook_secret_file = "%s"\n'
                        % (db_path, handler.url, secret_file))
            admin = brokers.free_port()
            log = os.path.join(self.dir, "relay-signing.log")
            with open(log, "wb") as err:
                p = subprocess.Popen([bin_path("relay", "idem-relay"), "--config", relay_config, "--admin-listen",
                                      "127.0.0.1:%d" % admin, "--log-level", "debug"],
                                     stdout=err, stderr=subprocess.STDOUT, cwd=self.dir)
            try:
                brokers.wait_until(lambda: ready(admin), 30, what="idem-relay signing")
                db = sqlite3.connect(db_path, timeout=30)
                db.execute("INSERT INTO idem_outbox (message_id, body) VALUES (?, ?)", ("evt-signed-" + tag, b'{"a":1}'))
                db.commit()
                db.close()
                brokers.wait_until(lambda: ("evt-signed-" + tag) in handler.call_counts(), 30, what="the signed webhook")
                self.assertIn("webhook-signature", {k.lower() for k in handler.headers["evt-signed-" + tag]})
                for path in ("/readyz", "/metrics"):
                    self.collected.append(("relay signing %s" % path, brokers.http_get(admin, path)[1]))
            finally:
                p.terminate()
                self.assertEqual(p.wait(30), 0)
            # idem-consume: a Redis stream (password-protected) to the handler, signed.
            stream = "signing-%s" % tag
            source = "redis+stream://:%s@127.0.0.1:%d/%s?group=g" % (ENC, self.redis.port, stream)
            consume_config = os.path.join(self.dir, "consume-signing.toml")
            with open(consume_config, "w") as f:
                f.write('store = "sqlite:%s"\nsign_secret_file = "%s"\n'
                        % (os.path.join(self.dir, "consume-signing.db"), secret_file))
            tool = brokers.BrokerTool(bin_path("tests", "tools", "idem-broker-tool"))
            tool.take(source, idle_ms=50)  # the group, before the message
            tool.publish("redis+stream://:%s@127.0.0.1:%d/%s" % (ENC, self.redis.port, stream),
                         [{"id": "evt-consumed-" + tag, "body": '{"b":2}'}])
            admin = brokers.free_port()
            log = os.path.join(self.dir, "consume-signing.log")
            with open(log, "wb") as err:
                p = subprocess.Popen([bin_path("consume", "idem-consume"), "--config", consume_config, "--source", source,
                                      "--deliver", handler.url, "--admin-listen", "127.0.0.1:%d" % admin,
                                      "--log-level", "debug"], stdout=err, stderr=subprocess.STDOUT, cwd=self.dir)
            try:
                brokers.wait_until(lambda: ("evt-consumed-" + tag) in handler.call_counts(), 30,
                                   what="the signed delivery")
                self.assertIn("webhook-signature", {k.lower() for k in handler.headers["evt-consumed-" + tag]})
                for path in ("/readyz", "/metrics"):
                    self.collected.append(("consume signing %s" % path, brokers.http_get(admin, path)[1]))
            finally:
                p.terminate()
                self.assertEqual(p.wait(30), 0)
            # A secret file others may read: each refuses to start, naming the file, not the secret.
            os.chmod(secret_file, 0o644)
            out = self.run_bin("relay signing open secret file", [bin_path("relay", "idem-relay"), "--config",
                                                                  relay_config, "--admin-listen", "off"])
            self.assertEqual(out.returncode, 2, out.stderr)
            self.assertIn("chmod 600", out.stderr)
            out = self.run_bin("consume signing open secret file", [bin_path("consume", "idem-consume"), "--config",
                                                                    consume_config, "--source", source, "--deliver",
                                                                    handler.url, "--admin-listen", "off"])
            self.assertEqual(out.returncode, 2, out.stderr)
            self.assertIn("chmod 600", out.stderr)
        finally:
            handler.stop()
            shutil.rmtree(secret_dir, ignore_errors=True)
        self.check_clean(forms(secret) | {secret[len("whsec_"):]} | forms(PASSWORD))

    # --- the brokers' URLs -------------------------------------------------------------------

    def amqp_url(self, password, query):
        base = urllib.parse.urlsplit(os.environ["IDEM_TEST_AMQP_URL"])
        host = base.netloc.rpartition("@")[2]
        return "amqp://idem:%s@%s/%%2f?%s" % (urllib.parse.quote(password, safe=""), host, query)

    def test_consume_relay_and_consumers(self):
        amqp = self.amqp_password
        handler = brokers.Handler()
        queue = "redaction-" + uuid.uuid4().hex[:8]
        store = "sqlite:%s" % os.path.join(self.dir, "consume.db")
        try:
            sources = {
                "amqp": self.amqp_url(amqp, "queue=" + queue),
                "stream :pass@": "redis+stream://:%s@127.0.0.1:%d/s-%s?group=g" % (ENC, self.redis.port, queue),
                "stream user:pass@": "redis+stream://alice:%s@127.0.0.1:%d/s2-%s?group=g" % (ENC, self.redis.port, queue),
            }
            for name, source in sources.items():
                admin = brokers.free_port()
                log = os.path.join(self.dir, "consume-%s.log" % uuid.uuid4().hex[:6])
                with open(log, "wb") as err:
                    p = subprocess.Popen([bin_path("consume", "idem-consume"), "--source", source, "--deliver",
                                          handler.url, "--store", store, "--admin-listen", "127.0.0.1:%d" % admin,
                                          "--log-level", "debug"], stdout=err, stderr=subprocess.STDOUT, cwd=self.dir)
                try:
                    brokers.wait_until(lambda: ready(admin), 30, what="idem-consume on %s" % name)
                    for path in ("/readyz", "/metrics"):
                        self.collected.append(("consume %s %s" % (name, path), brokers.http_get(admin, path)[1]))
                finally:
                    p.terminate()
                    self.assertEqual(p.wait(30), 0)
            kafka = "kafka://%%s%s/redaction?group=g&security_protocol=sasl_plaintext" % self.kafka.bootstrap
            wrong_sources = {
                "amqp": self.amqp_url(WRONG, "queue=" + queue),
                "stream": "redis+stream://alice:%s@127.0.0.1:%d/s-%s?group=g" % (WRONG_ENC, self.redis.port, queue),
                "kafka user:pass@": kafka % ("alice:%s@" % WRONG_ENC),
                "kafka sasl_password=": (kafka % "") + "&sasl_username=alice&sasl_password=" + WRONG_ENC,
                "sqs key:secret@": "sqs+http://AKIDREDACTION:%s@127.0.0.1:%d/000000000000/nowhere?region=us-east-1"
                                   % (WRONG_ENC, self.sqs.port),
                "sqs token=": "sqs+http://AKIDREDACTION:x@127.0.0.1:%d/000000000000/nowhere?region=us-east-1&token=%s"
                              % (self.sqs.port, WRONG_ENC),
            }
            for name, source in wrong_sources.items():
                out = self.run_bin("consume wrong %s" % name, [bin_path("consume", "idem-consume"), "--source", source,
                                                              "--deliver", handler.url, "--store", store,
                                                              "--admin-listen", "off"])
                self.assertEqual(out.returncode, 1, out.stderr)
                out = self.run_bin("ledger wrong %s" % name, [bin_path("examples", "ledger_consumer", "idem-ledger-consumer"),
                                                             "--db", os.path.join(self.dir, "ledger.db"), "--source", source])
                self.assertEqual(out.returncode, 1, out.stderr)
                out = self.run_bin("notifier wrong %s" % name, [bin_path("examples", "notifier", "idem-notifier"),
                                                               "--db", os.path.join(self.dir, "notifier.db"), "--source", source])
                self.assertEqual(out.returncode, 1, out.stderr)

            # idem-relay: a PostgreSQL outbox with a password, sinks with passwords, good and wrong.
            outbox = "postgres://%s:%s@127.0.0.1:%d/%s" % (self.pg.role, ENC, self.pg.port, self.pg.db)
            self.run_bin("idemctl outbox stats", [bin_path("cli", "idemctl"), "outbox", "stats", "--outbox", outbox])
            admin = brokers.free_port()
            log = os.path.join(self.dir, "relay.log")
            with open(log, "wb") as err:
                p = subprocess.Popen([bin_path("relay", "idem-relay"), "--outbox", outbox, "--sink",
                                      self.amqp_url(amqp, "exchange=&routing_key=" + queue),
                                      "--admin-listen", "127.0.0.1:%d" % admin, "--log-level", "debug"],
                                     stdout=err, stderr=subprocess.STDOUT, cwd=self.dir)
            try:
                brokers.wait_until(lambda: ready(admin), 30, what="idem-relay")
                for path in ("/readyz", "/metrics"):
                    self.collected.append(("relay %s" % path, brokers.http_get(admin, path)[1]))
            finally:
                p.terminate()
                self.assertEqual(p.wait(30), 0)
            for name, sink in {"amqp": self.amqp_url(WRONG, "exchange=&routing_key=" + queue),
                               "stream": "redis+stream://alice:%s@127.0.0.1:%d/x" % (WRONG_ENC, self.redis.port),
                               "kafka": "kafka://alice:%s@%s/redaction?security_protocol=sasl_plaintext"
                                        % (WRONG_ENC, self.kafka.bootstrap),
                               "sqs": "sqs+http://AKIDREDACTION:%s@127.0.0.1:%d/000000000000/nowhere?region=us-east-1"
                                      % (WRONG_ENC, self.sqs.port),
                               "webhook": "http://hook:%s@127.0.0.1:1/events" % WRONG_ENC}.items():
                out = self.run_bin("relay wrong sink %s" % name, [bin_path("relay", "idem-relay"), "--outbox", outbox,
                                                                 "--sink", sink, "--admin-listen", "off"], timeout=20) \
                    if name != "webhook" else None
                if out is not None:
                    self.assertEqual(out.returncode, 1, out.stderr)
            wrong_outbox = "postgres://%s:%s@127.0.0.1:%d/%s" % (self.pg.role, WRONG_ENC, self.pg.port, self.pg.db)
            out = self.run_bin("relay wrong outbox", [bin_path("relay", "idem-relay"), "--outbox", wrong_outbox,
                                                      "--sink", "http://127.0.0.1:1/x", "--admin-listen", "off"])
            self.assertEqual(out.returncode, 1, out.stderr)
        finally:
            handler.stop()
        self.check_clean(forms(PASSWORD) | forms(WRONG) | forms(amqp))


    # --- TLS: key passphrases and amqps:// passwords --------------------------------------

    def amqps_url(self, password, query):
        base = urllib.parse.urlsplit(os.environ["IDEM_TEST_AMQPS_URL"])
        host = base.netloc.rpartition("@")[2]
        ca = urllib.parse.quote(os.environ["IDEM_TEST_TLS_CA"], safe="")
        return "amqps://idem:%s@%s/%%2f?%s&cacertfile=%s" % (urllib.parse.quote(password, safe=""), host, query, ca)

    def test_tls_key_passphrases_and_amqps_passwords(self):
        """A client key's passphrase (idem-consume's handler_key_passphrase_file, idem-relay's
        webhook_key_passphrase_file, an amqps:// URL's passphrasefile=) and an amqps:// URL's
        password appear in no output: running at debug level, /readyz, /metrics, a wrong
        passphrase, a wrong password."""
        import shutil
        import sqlite3
        import tempfile
        passphrase = tls_certs.PASSPHRASE
        wrong_passphrase = "Wr0ng-passphrase-" + uuid.uuid4().hex[:8]
        # Outside self.dir: check_clean reads every file there, and these hold the passphrases.
        secret_dir = tempfile.mkdtemp(prefix="idem-redaction-tls-")
        good_file = os.path.join(secret_dir, "key.pass")
        wrong_file = os.path.join(secret_dir, "wrong.pass")
        for path, text in ((good_file, passphrase), (wrong_file, wrong_passphrase)):
            with open(path, "w") as f:
                f.write(text + "\n")
            os.chmod(path, 0o600)
        cert, key = brokers.test_pki("encrypted-key")
        server_cert, server_key = brokers.test_pki("server")
        ca = os.environ["IDEM_TEST_TLS_CA"]
        handler = brokers.Handler(tls={"cert": server_cert, "key": server_key})
        amqp = self.amqp_password
        tag = uuid.uuid4().hex[:8]
        queue = "redaction-tls-" + tag
        try:
            # idem-consume: an amqps:// source with the password, an https:// handler, the
            # client key encrypted, its passphrase from a file.
            def consume_config(name, passphrase_file):
                path = os.path.join(self.dir, name + ".toml")
                with open(path, "w") as f:
                    f.write('store = "sqlite:%s"\nhandler_ca_file = "%s"\nhandler_cert_file = "%s"\n'
                            'handler_key_file = "%s"\nhandler_key_passphrase_file = "%s"\n'
                            % (os.path.join(self.dir, "consume-tls.db"), ca, cert, key, passphrase_file))
                return path
            source = self.amqps_url(amqp, "queue=" + queue)
            tool = brokers.BrokerTool(bin_path("tests", "tools", "idem-broker-tool"))
            tool.take(source, idle_ms=50)  # the queue, before the message
            tool.publish(self.amqps_url(amqp, "exchange=&routing_key=" + queue), [{"id": "tls-" + tag, "body": "{}"}])
            admin = brokers.free_port()
            log = os.path.join(self.dir, "consume-tls.log")
            with open(log, "wb") as err:
                p = subprocess.Popen([bin_path("consume", "idem-consume"), "--config", consume_config("consume-tls", good_file),
                                      "--source", source, "--deliver", handler.url, "--admin-listen",
                                      "127.0.0.1:%d" % admin, "--log-level", "debug"],
                                     stdout=err, stderr=subprocess.STDOUT, cwd=self.dir)
            try:
                brokers.wait_until(lambda: ("tls-" + tag) in handler.call_counts(), 30, what="the delivery over TLS")
                for path in ("/readyz", "/metrics"):
                    self.collected.append(("consume tls %s" % path, brokers.http_get(admin, path)[1]))
            finally:
                p.terminate()
                self.assertEqual(p.wait(30), 0)
            with open(log) as f:
                self.collected.append(("consume tls log", f.read()))
            out = self.run_bin("consume wrong passphrase", [bin_path("consume", "idem-consume"), "--config",
                                                           consume_config("consume-tls-wrong", wrong_file),
                                                           "--source", source, "--deliver", handler.url,
                                                           "--admin-listen", "off"])
            self.assertEqual(out.returncode, 2, out.stderr)
            self.assertIn("is the passphrase right?", out.stderr)
            out = self.run_bin("consume amqps wrong password", [bin_path("consume", "idem-consume"), "--source",
                                                               self.amqps_url(WRONG, "queue=" + queue), "--deliver",
                                                               handler.url, "--store", "memory:", "--admin-listen", "off"])
            self.assertEqual(out.returncode, 1, out.stderr)
            self.assertIn("refused the login", out.stderr)
            # An amqps:// URL's own passphrasefile=, wrong: refused before connecting.
            out = self.run_bin("consume amqps wrong passphrasefile", [
                bin_path("consume", "idem-consume"), "--source",
                self.amqps_url(amqp, "queue=%s&certfile=%s&keyfile=%s&passphrasefile=%s" % (queue, cert, key, wrong_file)),
                "--deliver", handler.url, "--store", "memory:", "--admin-listen", "off"])
            self.assertEqual(out.returncode, 1, out.stderr)
            self.assertIn("is the passphrase right?", out.stderr)

            # idem-relay: an https:// webhook, the key's passphrase from a file; an amqps:// sink.
            db_path = os.path.join(self.dir, "tls-outbox-%s.db" % tag)
            sqlite3.connect(db_path).close()

            def relay_config(name, sink, passphrase_file=None):
                path = os.path.join(secret_dir, name + ".toml")  # the sink's password is in it
                with open(path, "w") as f:
                    f.write('outbox = "sqlite:%s"\nsink = "%s"\npoll_interval = "20ms"\n' % (db_path, sink))
                    if passphrase_file:
                        f.write('webhook_ca_file = "%s"\nwebhook_cert_file = "%s"\nwebhook_key_file = "%s"\n'
                                'webhook_key_passphrase_file = "%s"\n' % (ca, cert, key, passphrase_file))
                return path
            for name, config in (("webhook", relay_config("relay-tls", handler.url, good_file)),
                                 ("amqps", relay_config("relay-amqps", self.amqps_url(amqp, "exchange=&routing_key=" + queue)))):
                admin = brokers.free_port()
                log = os.path.join(self.dir, "relay-%s.log" % name)
                with open(log, "wb") as err:
                    p = subprocess.Popen([bin_path("relay", "idem-relay"), "--config", config, "--admin-listen",
                                          "127.0.0.1:%d" % admin, "--log-level", "debug"],
                                         stdout=err, stderr=subprocess.STDOUT, cwd=self.dir)
                try:
                    brokers.wait_until(lambda: ready(admin), 30, what="idem-relay %s" % name)
                    for path in ("/readyz", "/metrics"):
                        self.collected.append(("relay %s %s" % (name, path), brokers.http_get(admin, path)[1]))
                finally:
                    p.terminate()
                    self.assertEqual(p.wait(30), 0)
                with open(log) as f:
                    self.collected.append(("relay %s log" % name, f.read()))
            out = self.run_bin("relay wrong passphrase", [bin_path("relay", "idem-relay"), "--config",
                                                         relay_config("relay-tls-wrong", handler.url, wrong_file),
                                                         "--admin-listen", "off"])
            self.assertEqual(out.returncode, 2, out.stderr)
            self.assertIn("is the passphrase right?", out.stderr)
            out = self.run_bin("relay amqps wrong password", [bin_path("relay", "idem-relay"), "--config",
                                                             relay_config("relay-amqps-wrong",
                                                                          self.amqps_url(WRONG, "exchange=&routing_key=" + queue)),
                                                             "--admin-listen", "off"], timeout=20)
            self.assertEqual(out.returncode, 1, out.stderr)
        finally:
            handler.stop()
            shutil.rmtree(secret_dir, ignore_errors=True)
        # Nor any line of the private keys used.
        key_lines = set()
        for path in (key, brokers.test_pki("client-a")[1]):
            with open(path) as f:
                key_lines |= {line.strip() for line in f if len(line.strip()) > 16 and "-----" not in line}
        self.assertTrue(key_lines)
        self.check_clean(forms(passphrase) | forms(wrong_passphrase) | forms(amqp) | forms(WRONG) | key_lines)

    def test_gateway_tls_key_passphrase(self):
        """idem-gateway's [tls] key_passphrase_file: the passphrase and the private key's lines
        appear in no output at debug level (start, a request over TLS, /metrics, a reload) nor
        when the passphrase is wrong or the key file readable by others; file paths may."""
        import shutil
        import ssl
        import tempfile
        import urllib.request
        passphrase = tls_certs.PASSPHRASE
        wrong_passphrase = "Wr0ng-passphrase-" + uuid.uuid4().hex[:8]
        secret_dir = tempfile.mkdtemp(prefix="idem-redaction-gw-tls-")  # outside self.dir: check_clean reads it
        good_file = os.path.join(secret_dir, "key.pass")
        wrong_file = os.path.join(secret_dir, "wrong.pass")
        for path, text in ((good_file, passphrase), (wrong_file, wrong_passphrase)):
            with open(path, "w") as f:
                f.write(text + "\n")
            os.chmod(path, 0o600)
        cert, key = brokers.test_pki("encrypted-key")
        ca = os.environ["IDEM_TEST_TLS_CA"]
        try:
            def config(name, passphrase_file, key_file=key):
                path = os.path.join(self.dir, name + ".toml")
                tls_port = brokers.free_port()
                with open(path, "w") as f:
                    f.write('log_level = "debug"\nstore = "memory:"\nupstream = "http://127.0.0.1:9"\n'
                            '[tls]\nlisten = "127.0.0.1:%d"\ncert_file = "%s"\nkey_file = "%s"\n'
                            'key_passphrase_file = "%s"\n' % (tls_port, cert, key_file, passphrase_file))
                return path, tls_port
            path, tls_port = config("gateway-tls", good_file)
            port, admin = brokers.free_port(), brokers.free_port()
            log = os.path.join(self.dir, "gateway-tls.log")
            with open(log, "wb") as err:
                p = subprocess.Popen([bin_path("gateway", "idem-gateway"), "--config", path, "--listen",
                                      "127.0.0.1:%d" % port, "--admin-listen", "127.0.0.1:%d" % admin],
                                     stdout=err, stderr=subprocess.STDOUT, cwd=self.dir)
            try:
                brokers.wait_until(lambda: ready(admin), 30, what="idem-gateway with an encrypted TLS key")
                ctx = ssl.create_default_context(cafile=ca)
                req = urllib.request.Request("https://localhost:%d/x" % tls_port, data=b"{}", method="POST",
                                             headers={"Idempotency-Key": "redaction-tls-" + uuid.uuid4().hex})
                try:
                    urllib.request.urlopen(req, context=ctx, timeout=10)
                except urllib.error.HTTPError as e:
                    self.assertEqual(e.code, 502)  # nothing listens upstream: the TLS hop is what counts
                p.send_signal(signal.SIGHUP)  # the files read again
                def reloaded():
                    with open(log) as f:
                        return "in force" in f.read()
                brokers.wait_until(reloaded, 10, what="the reload")
                self.collected.append(("gateway tls /metrics", brokers.http_get(admin, "/metrics")[1]))
            finally:
                p.terminate()
                self.assertEqual(p.wait(30), 0)
            with open(log) as f:
                self.collected.append(("gateway tls log", f.read()))
            wrong, _ = config("gateway-tls-wrong", wrong_file)
            out = self.run_bin("gateway tls wrong passphrase", [bin_path("gateway", "idem-gateway"), "--config", wrong])
            self.assertEqual(out.returncode, 2, out.stderr)
            self.assertIn("does not decrypt it", out.stderr)
            readable = os.path.join(secret_dir, "readable.key")
            shutil.copy(key, readable)
            os.chmod(readable, 0o644)
            loose, _ = config("gateway-tls-loose", good_file, readable)
            out = self.run_bin("gateway tls readable key", [bin_path("gateway", "idem-gateway"), "--config", loose])
            self.assertEqual(out.returncode, 2, out.stderr)
            self.assertIn(readable, out.stderr)  # the path is named; the key is not
        finally:
            shutil.rmtree(secret_dir, ignore_errors=True)
        with open(key) as f:
            key_lines = {line.strip() for line in f if len(line.strip()) > 16 and "-----" not in line}
        self.assertTrue(key_lines)
        self.check_clean(forms(passphrase) | forms(wrong_passphrase) | key_lines)


def ready(port):
    try:
        return brokers.http_get(port, "/readyz", timeout=1)[0] == 200
    except OSError:
        return False


def redis_cli(port, *args, password=None):
    argv = ["redis-cli", "-p", str(port)]
    env = dict(os.environ)
    if password:
        env["REDISCLI_AUTH"] = password  # not on the command line
    out = subprocess.run(argv + list(args), capture_output=True, text=True, env=env, timeout=10)
    if out.returncode != 0 or out.stdout.startswith("ERR"):
        raise RuntimeError("redis-cli %s: %s %s" % (args[0], out.stdout, out.stderr))
    return out.stdout


class PostgresRole:
    """A role of the test's own on the shared PostgreSQL, which must log in with its password:
    a pg_hba line for it alone (scram-sha-256) ahead of the server's trust lines."""

    def __init__(self, password):
        url = urllib.parse.urlsplit(os.environ["IDEM_TEST_POSTGRES_URL"])
        self.port = url.port
        self.admin_db = url.path.lstrip("/")
        self.admin_user = url.username
        self.role = "idem_secret_%s" % uuid.uuid4().hex[:8]
        self.db = self.role  # a database of its own: the stores' tables there are its own
        self.hba = os.path.join(os.environ["IDEM_TEST_POSTGRES_DATA"], "pg_hba.conf")
        self.line = "host all %s 127.0.0.1/32 scram-sha-256  # test_redaction\n" % self.role
        with open(self.hba) as f:
            original = f.read()
        with open(self.hba, "w") as f:
            f.write(self.line + original)
        quoted = password.replace("'", "''")
        self.psql("CREATE ROLE %s LOGIN PASSWORD '%s'" % (self.role, quoted))
        self.psql("CREATE DATABASE %s OWNER %s" % (self.db, self.role))
        self.psql("SELECT pg_reload_conf()")
        time.sleep(0.5)

    def psql(self, sql):
        out = subprocess.run(["psql", "-h", "127.0.0.1", "-p", str(self.port), "-U", self.admin_user, "-d", self.admin_db,
                              "-v", "ON_ERROR_STOP=1", "-q", "-c", sql], capture_output=True, text=True, timeout=30)
        if out.returncode != 0:
            raise RuntimeError("psql: %s" % out.stderr)

    def drop(self):
        with open(self.hba) as f:
            text = f.read()
        with open(self.hba, "w") as f:
            f.write(text.replace(self.line, ""))
        self.psql("SELECT pg_reload_conf()")
        self.psql("DROP DATABASE IF EXISTS %s WITH (FORCE)" % self.db)
        self.psql("DROP ROLE IF EXISTS %s" % self.role)


def main():
    global ARGS
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--bin-dir", required=True)
    ARGS, rest = parser.parse_known_args()
    ARGS.bin_dir = os.path.abspath(ARGS.bin_dir)  # the processes run in a scratch directory
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
