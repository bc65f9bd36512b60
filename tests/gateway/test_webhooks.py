#!/usr/bin/env python3
"""Webhook routes (docs/webhooks.md): provider events, signed by the providers' own libraries
(Stripe's SDK, webhooks.generateTestHeaderString; the Standard Webhooks reference library,
Webhook.sign: testing/webhook_signers), received through idem-gateway on a real store.

- Genuine events, each sent 1-5 times, its copies concurrent or spread over seconds: each is
  forwarded exactly once (the upstream counts by key), every copy is answered 2xx or 409.
- Forged ones (wrong secret, one body byte changed, another event's signature, missing headers,
  timestamps 10 minutes old or ahead, an unsupported scheme, a huge signature header) are refused
  400 with their reason; the upstream saw nothing and the store holds no record for them.
- GitHub's profile and a custom template (signed with Python's hmac): once each, forgeries refused.
- Secret rotation by SIGHUP under load: old + new secret, then the new one only; no genuine event
  is refused while both are configured; a bad secret file on reload keeps the running secrets.
- No secret and no signature appears in the gateway's log or /metrics.

    python3 test_webhooks.py --gateway PATH --upstream-bin PATH --store sqlite|postgres|redis

Needs IDEM_NODE (node) and IDEM_WEBHOOK_SIGNERS (testing/webhook_signers, after `npm ci`, which
scripts/deps runs): fails, never skips, without them.
"""

import base64
import hashlib
import hmac
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import GatewayTestCase, new_key, shared_store_url  # noqa: E402

# Events per provider per store; each sent 1-5 times. 2 providers x 3 stores x 340 = 2,040 events.
EVENTS = int(os.environ.get("IDEM_WEBHOOK_EVENTS", "340"))
RUN = uuid.uuid4().hex[:10]  # this run's ids: the shared stores hold other runs' records too
STRIPE_PATH = "/echo/stripe"
STANDARD_PATH = "/echo/standard"


class Signer:
    """sign.mjs as one long-lived node process: a JSON request per line, the headers back."""

    def __init__(self):
        node = os.environ.get("IDEM_NODE")
        root = os.environ.get("IDEM_WEBHOOK_SIGNERS")
        if not node or not root:
            raise RuntimeError("IDEM_NODE and IDEM_WEBHOOK_SIGNERS must be set (tests/gateway/CMakeLists.txt)")
        if not os.path.isdir(os.path.join(root, "node_modules", "stripe")):
            raise RuntimeError("%s/node_modules is missing: run scripts/deps (npm ci there)" % root)
        self.proc = subprocess.Popen([node, os.path.join(root, "sign.mjs")], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, cwd=root)
        self.lock = threading.Lock()

    def sign(self, **req):
        with self.lock:
            self.proc.stdin.write(json.dumps(req) + "\n")
            self.proc.stdin.flush()
            answer = json.loads(self.proc.stdout.readline())
        if "error" in answer:
            raise RuntimeError("sign.mjs: %s" % answer["error"])
        return answer

    def stripe(self, secret, payload, timestamp=None):
        ts = int(time.time()) if timestamp is None else timestamp
        return list(self.sign(provider="stripe", secret=secret, payload=payload, timestamp=ts).items())

    def standard(self, secret, msg_id, payload, timestamp=None):
        ts = int(time.time()) if timestamp is None else timestamp
        return list(self.sign(provider="standard", secret=secret, id=msg_id, payload=payload, timestamp=ts).items())

    def stop(self):
        self.proc.stdin.close()
        self.proc.wait(10)


def stripe_secret():
    return "whsec_" + uuid.uuid4().hex + uuid.uuid4().hex[:8]


def standard_secret():
    return "whsec_" + base64.b64encode(os.urandom(24)).decode()


def write_secret(path, secrets, mode=0o600):
    with open(path, "w") as f:
        f.write("".join(s + "\n" for s in secrets))
    os.chmod(path, mode)


def stripe_event(n):
    event_id = "evt_%s_%05d" % (RUN, n)
    body = json.dumps({"id": event_id, "object": "event", "type": "payment_intent.succeeded",
                       "data": {"object": {"id": "pi_%d" % n, "amount": 1000 + n}}})
    return event_id, body


def standard_event(n):
    return "msg_%s_%05d" % (RUN, n), json.dumps({"type": "invoice.paid", "data": {"n": n, "run": RUN}})


def tenant_of(path):
    return "webhook " + path


def idemctl_path():
    path = os.path.normpath(os.path.join(os.path.dirname(harness.ARGS.gateway), "..", "cli", "idemctl"))
    if not os.access(path, os.X_OK):
        raise RuntimeError("idemctl not found next to the gateway's build: %s (build the idemctl target)" % path)
    return path


class WebhookTest(GatewayTestCase):
    CONFIG = None

    @classmethod
    def start_class_processes(cls):
        cls.signer = Signer()
        cls._owned.append(cls.signer)
        cls.url = cls.store_url() if harness.ARGS.store == "sqlite" else shared_store_url()
        cls.stripe_secret, cls.standard_secret = stripe_secret(), standard_secret()
        cls.stripe_file = os.path.join(cls.workdir, "stripe.secret")
        cls.standard_file = os.path.join(cls.workdir, "standard.secret")
        write_secret(cls.stripe_file, [cls.stripe_secret])
        write_secret(cls.standard_file, [cls.standard_secret])
        # GitHub and the custom template have no npm library of reference here: signed with
        # Python's hmac, as their documentation describes.
        cls.github_secret, cls.custom_secret = "gh-" + uuid.uuid4().hex, "acme-" + uuid.uuid4().hex
        cls.github_file = os.path.join(cls.workdir, "github.secret")
        cls.custom_file = os.path.join(cls.workdir, "custom.secret")
        write_secret(cls.github_file, [cls.github_secret])
        write_secret(cls.custom_file, [cls.custom_secret])
        cls.config = """
[[route]]
method = "POST"
path = "%s"
webhook = { provider = "stripe", secret_file = "%s" }

[[route]]
method = "POST"
path = "%s"
webhook = { provider = "standard", secret_file = "%s" }

[[route]]
method = "POST"
path = "/echo/github"
webhook = { provider = "github", secret_file = "%s" }

[[route]]
method = "POST"
path = "/echo/custom"
[route.webhook]
provider = "custom"
secret_file = "%s"
signature_header = "X-Acme-Signature"
prefix = "v1="
encoding = "base64"
signed = "{timestamp}.{body}"
timestamp_header = "X-Acme-Timestamp"
key_pointer = "/event/id"

[[route]]
method = "POST"
path = "/echo/plain"
""" % (STRIPE_PATH, cls.stripe_file, STANDARD_PATH, cls.standard_file, cls.github_file, cls.custom_file)
        cls.gateway = cls.start_gateway(cls.config, store=cls.url)
        cls.used_signatures = []  # every signature value sent: none may show in the log

    def record(self, path, key):
        """idemctl get on the gateway's store: the record, or None when there is none."""
        out = subprocess.run([idemctl_path(), "get", "--store", self.url, "--json", tenant_of(path), key],
                             capture_output=True, text=True, timeout=60)
        if out.returncode == 0:
            return json.loads(out.stdout)
        self.assertIn("no record", out.stderr, out)
        return None

    def send(self, path, body, headers):
        for name, value in headers:
            if "signature" in name.lower():
                self.used_signatures.append(value)
        return self.gateway.request("POST", path, body, headers + [("Content-Type", "application/json")])

    # -- genuine events --------------------------------------------------------------------------

    def test_genuine_events_are_forwarded_once_each(self):
        rng = random.Random(38)
        signer = self.signer
        tasks = []  # (send at, path, event id, body, n)
        events = []
        t0 = time.monotonic() + 1.0
        for n in range(EVENTS):
            for path, make in ((STRIPE_PATH, stripe_event), (STANDARD_PATH, standard_event)):
                event_id, body = make(n)
                events.append((path, event_id))
                copies = rng.randint(1, 5)
                start = t0 + rng.uniform(0, 4.0)
                concurrent = rng.random() < 0.5
                for c in range(copies):
                    # Concurrent copies leave together; spread ones over up to three seconds.
                    at = start if concurrent else start + rng.uniform(0, 3.0)
                    tasks.append((at, path, event_id, body, c))
        tasks.sort(key=lambda t: t[0])

        def deliver(task):
            at, path, event_id, body, _ = task
            # Each delivery is signed anew, as providers do (a fresh timestamp per attempt).
            if path == STRIPE_PATH:
                headers = signer.stripe(self.stripe_secret, body)
            else:
                headers = signer.standard(self.standard_secret, event_id, body)
            harness.sleep_until(at)
            r = self.send(path, body, headers)
            return path, event_id, r

        started = time.monotonic()
        with ThreadPoolExecutor(max_workers=48) as pool:
            results = list(pool.map(deliver, tasks))
        elapsed = time.monotonic() - started

        answered = {}
        seen_verified = set()
        replays = in_use = 0
        for path, event_id, r in results:
            self.assertIn(r.status, (200, 409), "%s %s: %r" % (path, event_id, r))
            if r.status == 409:
                in_use += 1
                self.assertProblem(r, 409, "idempotency_key_in_use")
                self.assertIsNotNone(r.header("Retry-After"), r)
            else:
                answered.setdefault((path, event_id), 0)
                answered[(path, event_id)] += 1
                replays += r.replayed
                if not r.replayed:
                    echoed = dict((k.lower(), v) for k, v in r.json()["headers"])
                    seen_verified.add(echoed.get("idem-webhook-verified"))
                    self.assertEqual(echoed.get("idempotency-key"), event_id, r)
        self.assertEqual(seen_verified, {"stripe", "standard"})
        # Every event's first copy executed (a 409 went to copies that overlapped it; a provider
        # retries those later and meets the replay), and no event executed twice.
        for path, event_id in events:
            self.assertIn((path, event_id), answered, "no copy of %s %s was answered 2xx" % (path, event_id))
            self.assertEqual(self.upstream.executions(event_id), 1, "%s %s" % (path, event_id))
        print("%d events, %d deliveries in %.1f s (%s): %d replayed, %d answered 409"
              % (len(events), len(tasks), elapsed, harness.ARGS.store, replays, in_use), file=sys.stderr)
        # Both duplicate paths were taken: copies after the first answer, copies during it.
        self.assertGreater(replays, 0)
        self.assertGreater(in_use, 0)
        # The record is the event's, in the route's tenant, kept a week.
        rec = self.record(STRIPE_PATH, events[0][1])
        self.assertIsNotNone(rec)
        metrics = self.gateway.metrics()
        self.assertGreaterEqual(metrics["idem_webhooks_verified_total"], len(tasks))

    # -- forgeries -------------------------------------------------------------------------------

    def assertRefused(self, path, event_id, body, headers, reason):
        before = self.upstream.total()
        r = self.send(path, body, headers)
        doc = self.assertProblem(r, 400, reason)
        self.assertEqual(self.upstream.total(), before, "the upstream saw a refused request")
        self.assertIsNone(self.record(path, event_id), "the store holds a record for a refused event")
        for _, value in headers:
            if len(value) > 20:
                self.assertNotIn(value, doc["detail"])
        return doc

    def test_forged_stripe_events_are_refused(self):
        s = self.signer
        eid, body = stripe_event(90001)
        other_id, other_body = stripe_event(90002)
        now = int(time.time())
        cases = [
            ("wrong secret", body, s.stripe(stripe_secret(), body), "signature_invalid"),
            ("one body byte changed", body.replace("payment_intent", "payment_intenu"),
             s.stripe(self.stripe_secret, body), "signature_invalid"),
            ("another event's signature", body, s.stripe(self.stripe_secret, other_body), "signature_invalid"),
            ("no Stripe-Signature", body, [], "signature_missing"),
            ("10 minutes old", body, s.stripe(self.stripe_secret, body, now - 600), "timestamp_outside_tolerance"),
            ("10 minutes ahead", body, s.stripe(self.stripe_secret, body, now + 600), "timestamp_outside_tolerance"),
            ("v0 only (unsupported scheme)", body,
             [("Stripe-Signature", s.stripe(self.stripe_secret, body)[0][1].replace("v1=", "v0="))], "signature_invalid"),
            ("huge header", body,
             [("Stripe-Signature", s.stripe(self.stripe_secret, body)[0][1] + ",v1=" + "a" * 12000)], "signature_invalid"),
        ]
        refusals_before = self.gateway.metrics()
        for name, sent_body, headers, reason in cases:
            with self.subTest(name):
                self.assertRefused(STRIPE_PATH, eid, sent_body, headers, reason)
        # Another event's body under this event's signature: refused, and that event's id (the
        # key it would have taken) holds no record either.
        self.assertRefused(STRIPE_PATH, other_id, other_body, s.stripe(self.stripe_secret, body), "signature_invalid")
        metrics = self.gateway.metrics()
        for reason, n in (("signature_invalid", 6), ("signature_missing", 1), ("timestamp_outside_tolerance", 2)):
            label = 'idem_webhook_refusals_total{reason="%s"}' % reason
            self.assertGreaterEqual(metrics[label] - refusals_before.get(label, 0), n, reason)
        # The genuine event still goes through afterwards: the refusals left no trace.
        r = self.send(STRIPE_PATH, body, s.stripe(self.stripe_secret, body))
        self.assertEqual(r.status, 200, r)
        self.assertFalse(r.replayed)
        self.assertEqual(self.upstream.executions(eid), 1)

    def test_forged_standard_events_are_refused(self):
        s = self.signer
        eid, body = standard_event(90001)
        other_id, other_body = standard_event(90002)
        now = int(time.time())
        good = s.standard(self.standard_secret, eid, body)
        sig = dict(good)["webhook-signature"]

        def without(name):
            return [(k, v) for k, v in good if k != name]

        cases = [
            ("wrong secret", body, s.standard(standard_secret(), eid, body), "signature_invalid"),
            ("one body byte changed", body.replace("invoice", "invoicf"), good, "signature_invalid"),
            ("another event's signature", body,
             without("webhook-signature") + [("webhook-signature", dict(s.standard(self.standard_secret, other_id, other_body))["webhook-signature"])],
             "signature_invalid"),
            ("no webhook-signature", body, without("webhook-signature"), "signature_missing"),
            ("no webhook-timestamp", body, without("webhook-timestamp"), "signature_missing"),
            ("no webhook-id", body, without("webhook-id"), "webhook_id_missing"),
            ("10 minutes old", body, s.standard(self.standard_secret, eid, body, now - 600), "timestamp_outside_tolerance"),
            ("10 minutes ahead", body, s.standard(self.standard_secret, eid, body, now + 600), "timestamp_outside_tolerance"),
            ("v1a only (unsupported scheme)", body,
             without("webhook-signature") + [("webhook-signature", "v1a," + sig[3:])], "signature_invalid"),
            ("huge header", body,
             without("webhook-signature") + [("webhook-signature", sig + (" v1," + "A" * 43 + "=") * 250)], "signature_invalid"),
        ]
        for name, sent_body, headers, reason in cases:
            with self.subTest(name):
                self.assertRefused(STANDARD_PATH, eid, sent_body, headers, reason)
        r = self.send(STANDARD_PATH, body, good)
        self.assertEqual(r.status, 200, r)
        self.assertEqual(self.upstream.executions(eid), 1)

    def test_github_and_custom_profiles(self):
        # GitHub: sha256= hex HMAC of the body, the key from X-GitHub-Delivery, no timestamp.
        delivery = "%s-%s" % (RUN, uuid.uuid4())
        body = json.dumps({"action": "opened", "number": 1, "run": RUN})
        mac = hmac.new(self.github_secret.encode(), body.encode(), hashlib.sha256).hexdigest()
        headers = [("X-GitHub-Delivery", delivery), ("X-GitHub-Event", "pull_request"),
                   ("X-Hub-Signature-256", "sha256=" + mac)]
        first = self.send("/echo/github", body, headers)
        self.assertEqual(first.status, 200, first)
        self.assertEqual(dict((k.lower(), v) for k, v in first.json()["headers"])["idem-webhook-verified"], "github")
        again = self.send("/echo/github", body, headers)  # GitHub's "Redeliver": the same GUID
        self.assertReplayOf(again, first)
        self.assertEqual(self.upstream.executions(delivery), 1)
        forged = "%s-%s" % (RUN, uuid.uuid4())
        self.assertRefused("/echo/github", forged, body, [("X-GitHub-Delivery", forged),
                           ("X-Hub-Signature-256", "sha256=" + hmac.new(b"guess", body.encode(), hashlib.sha256).hexdigest())],
                           "signature_invalid")
        self.assertRefused("/echo/github", forged, body, [("X-GitHub-Delivery", forged),
                           ("X-Hub-Signature", "sha1=" + hmac.new(self.github_secret.encode(), body.encode(), hashlib.sha1).hexdigest())],
                           "signature_missing")

        # The custom template: base64 HMAC of "timestamp.body" after "v1=", the key at /event/id.
        def acme(body, ts, secret=self.custom_secret):
            mac = hmac.new(secret.encode(), ("%d.%s" % (ts, body)).encode(), hashlib.sha256).digest()
            return [("X-Acme-Signature", "v1=" + base64.b64encode(mac).decode()), ("X-Acme-Timestamp", str(ts))]

        event_id = "acme_%s_%s" % (RUN, uuid.uuid4().hex[:8])
        body = json.dumps({"event": {"id": event_id, "kind": "order.paid"}})
        now = int(time.time())
        first = self.send("/echo/custom", body, acme(body, now))
        self.assertEqual(first.status, 200, first)
        self.assertReplayOf(self.send("/echo/custom", body, acme(body, now + 1)), first)
        self.assertEqual(self.upstream.executions(event_id), 1)
        other_id = "acme_%s_%s" % (RUN, uuid.uuid4().hex[:8])
        other = json.dumps({"event": {"id": other_id, "kind": "order.paid"}})
        self.assertRefused("/echo/custom", other_id, other, acme(other, now, "wrong"), "signature_invalid")
        self.assertRefused("/echo/custom", other_id, other, acme(other, now - 600), "timestamp_outside_tolerance")
        self.assertRefused("/echo/custom", other_id, other, acme(other, now)[:1], "signature_missing")
        no_id = json.dumps({"event": {"kind": "order.paid"}})
        r = self.send("/echo/custom", no_id, acme(no_id, now))
        self.assertProblem(r, 400, "webhook_id_missing")

    def test_only_the_gateway_says_an_event_was_verified(self):
        r = self.gateway.request("POST", "/echo/plain", "{}", [("Idem-Webhook-Verified", "stripe")], key=new_key())
        self.assertEqual(r.status, 200, r)
        self.assertNotIn("idem-webhook-verified", [k.lower() for k, _ in r.json()["headers"]])

    def test_z_no_secret_or_signature_in_log_or_metrics(self):
        # Named to run last (unittest sorts by name): it reads the whole log the others wrote.
        eid, body = stripe_event(90100)
        self.assertRefused(STRIPE_PATH, eid, body, self.signer.stripe(stripe_secret(), body), "signature_invalid")
        log = self.gateway.process.wait_log("signature_invalid")
        self.assertIn("verdict=signature_invalid", log)
        metrics_text = self.gateway.admin("/metrics").body.decode()
        for secret in (self.stripe_secret, self.standard_secret, self.github_secret, self.custom_secret):
            self.assertNotIn(secret, log)
            self.assertNotIn(secret[6:], log)
            self.assertNotIn(secret, metrics_text)
        for value in self.used_signatures:
            for part in value.replace(",", " ").replace("=", " ").split():
                if len(part) >= 40:  # the MACs themselves (hex 64, base64 44)
                    self.assertNotIn(part, log)


class RotationTest(GatewayTestCase):
    """Secret rotation by SIGHUP under load (docs/webhooks.md, Rotating a secret)."""

    CONFIG = None

    @classmethod
    def start_class_processes(cls):
        cls.signer = Signer()
        cls._owned.append(cls.signer)
        cls.url = cls.store_url("rotation.db") if harness.ARGS.store == "sqlite" else shared_store_url()
        cls.old, cls.new = stripe_secret(), stripe_secret()
        cls.file = os.path.join(cls.workdir, "rotating.secret")
        write_secret(cls.file, [cls.old])
        cls.gateway = cls.start_gateway("""
[[route]]
method = "POST"
path = "%s"
webhook = { provider = "stripe", secret_file = "%s" }
""" % (STRIPE_PATH, cls.file), store=cls.url)

    def reload(self, generation):
        self.gateway.process.signal(signal.SIGHUP)
        log = self.gateway.process.wait_log("reload: configuration %d in force" % generation, timeout=10)
        self.assertIn("reload: configuration %d in force" % generation, log)
        return log

    def test_rotation_under_load_refuses_no_genuine_event(self):
        counter = [0]
        lock = threading.Lock()
        phase = {"secrets": [self.old]}  # what the provider signs with now
        failures, sent = [], []
        stop = threading.Event()

        def sender(worker):
            rng = random.Random(worker)
            while not stop.is_set():
                with lock:
                    counter[0] += 1
                    n = 50000 + counter[0]
                    secrets = list(phase["secrets"])
                eid, body = stripe_event(n)
                headers = self.signer.stripe(rng.choice(secrets), body)
                r = self.gateway.request("POST", STRIPE_PATH, body, headers)
                sent.append(eid)
                if r.status != 200:
                    failures.append((eid, r))

        threads = [threading.Thread(target=sender, args=(i,), daemon=True) for i in range(6)]
        for t in threads:
            t.start()
        try:
            time.sleep(1.0)
            # 1. Both secrets configured; the provider signs with either for a while.
            write_secret(self.file, [self.old, self.new])
            log = self.reload(2)
            self.assertIn("webhook %s (stripe, 2 secret(s))" % STRIPE_PATH, log)
            phase["secrets"] = [self.old, self.new]
            time.sleep(2.0)
            # 2. The provider has switched: only the new secret signs; then the old one goes.
            phase["secrets"] = [self.new]
            time.sleep(1.0)
            write_secret(self.file, [self.new])
            self.reload(3)
            time.sleep(1.0)
            # 3. A bad secret file on reload (others may read it): the running secrets stay.
            write_secret(self.file, [self.new], mode=0o644)
            self.gateway.process.signal(signal.SIGHUP)
            log = self.gateway.process.wait_log("reload failed", timeout=10)
            self.assertIn("reload failed, keeping the running configuration", log)
            self.assertIn("chmod 600", log)
            time.sleep(1.0)
        finally:
            stop.set()
            for t in threads:
                t.join(30)
        self.assertEqual(failures, [], "genuine events refused during the rotation")
        self.assertGreater(len(sent), 50)
        for eid in sent:
            self.assertEqual(self.upstream.executions(eid), 1, eid)
        # After the rotation the old secret no longer verifies; the new one does.
        eid, body = stripe_event(99999)
        r = self.gateway.request("POST", STRIPE_PATH, body, self.signer.stripe(self.old, body))
        self.assertProblem(r, 400, "signature_invalid")
        r = self.gateway.request("POST", STRIPE_PATH, body, self.signer.stripe(self.new, body))
        self.assertEqual(r.status, 200, r)
        log = self.gateway.process.log()
        for secret in (self.old, self.new):
            self.assertNotIn(secret, log)


if __name__ == "__main__":
    harness.main()
