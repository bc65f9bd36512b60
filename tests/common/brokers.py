"""Brokers and HTTP handlers for the end-to-end tests of idem-consume and idem-relay (Python 3
standard library only).

The brokers are the real servers scripts/test starts (scripts/lib/servers.sh): RabbitMQ
(IDEM_TEST_AMQP_URL) and Redis (IDEM_TEST_REDIS_URL); for Kafka librdkafka's mock cluster and for
SQS the fauxqs emulator, which each test starts for itself (PrivateKafka: testing/kafka_mock's
idem-kafka-mock, whose path is IDEM_KAFKA_MOCK; PrivateSqs: testing/sqs_emulator's serve.mjs,
IDEM_SQS_EMULATOR, behind idem-fault-proxy, IDEM_FAULT_PROXY_BIN). Each test gets queues, streams
or topics of its own names. A test that restarts a broker either restarts the shared RabbitMQ node
(its ctest test runs alone) or has a private server of its own (private_server()).
"""
import http.server
import json
import os
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
SERVERS_SH = os.path.join(ROOT, "scripts", "lib", "servers.sh")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ports import free_port  # noqa: E402,F401  (re-exported: brokers.free_port())


def env(name):
    value = os.environ.get(name)
    if not value:
        raise RuntimeError("%s is not set: run through scripts/test, which starts the servers" % name)
    return value


def test_pki(name):
    """(cert, key) of one of tests/common/tls_certs.py's certificates, as servers.sh made them
    for this run (IDEM_TEST_TLS_DIR): "server", "client-a", "wrong-host", "unknown-ca",
    "encrypted-key" (its passphrase: tls_certs.PASSPHRASE)...; "ca" is the CA everyone trusts."""
    directory = env("IDEM_TEST_TLS_DIR")
    return os.path.join(directory, name + ".pem"), os.path.join(directory, name + ".key")


def unique(prefix):
    return "%s-%s" % (prefix, uuid.uuid4().hex[:12])


# Kafka consumers in the tests: the mock completes a rebalance only after session.timeout.ms - 1 s,
# so keep it short; commit what is done often, so that lag() soon shows it.
KAFKA_SOURCE_PARAMETERS = "session_timeout_ms=6000&heartbeat_interval_ms=500&commit_interval_ms=200"
# How long a Kafka consumer new to a group may wait before the group hands it its partitions.
KAFKA_JOIN_MS = 8000
# SQS consumers in the tests: a killed consumer's messages come back after the visibility
# timeout; long polls short enough that a take ends soon after the queue is empty.
SQS_SOURCE_PARAMETERS = "visibility_timeout=4&wait_seconds=1"


class Broker:
    """One queue (AMQP, SQS), stream and group (Redis) or topic (Kafka) under test, by URL.
    `private` is the test's own server, when it has one (private_server())."""

    def __init__(self, kind, name=None, private=None, fifo=False, tls=False):
        self.kind = kind
        self.name = name or unique("q")
        self.private = private
        # amqp with tls: the node's amqps:// listener, verified against the test CA (servers.sh).
        self.tls_query = ""
        if tls and kind != "amqp":
            raise ValueError("only the AMQP broker has a TLS listener here")
        suffix = self.fifo_suffix = ""
        if fifo:  # SQS FIFO: the queue and its dead-letter queues (the source's default names)
            if kind != "sqs":
                raise ValueError("only SQS queues are FIFO")
            suffix = self.fifo_suffix = ".fifo"
            self.name += suffix
        if kind == "kafka":
            self.base = "kafka://%s" % private.bootstrap
            private.topic(self.name, 3)
            private.topic(self.name + ".dead-letter", 1)
            self.dead_letters_read = 0  # the dead-letter topic's offset take_dead_letters() reached
        elif kind == "sqs":
            self.base = private.base_url
            base = self.name[:len(self.name) - len(suffix)]
            attributes = {"FifoQueue": "true"} if fifo else None
            private.create_queue(self.name, attributes)
            private.create_queue(base + "-dead-letter" + suffix, attributes)
            private.create_queue(base + "-dead-letter-dead-letter" + suffix, attributes)  # the inspecting source's own
        elif kind == "amqp":
            base = env("IDEM_TEST_AMQPS_URL" if tls else "IDEM_TEST_AMQP_URL").rstrip("/")
            if not base.endswith("%2f") and base.count("/") < 3:
                base += "/%2f"
            self.base = base
            if tls:
                # Mutual TLS: the node checks a client certificate presented (servers.sh).
                cert, key = test_pki("client-a")
                self.tls_query = "&" + urllib.parse.urlencode({"cacertfile": env("IDEM_TEST_TLS_CA"), "certfile": cert,
                                                               "keyfile": key})
        elif kind == "redis_streams":
            url = urllib.parse.urlsplit(private.url if private else env("IDEM_TEST_REDIS_URL"))
            self.base = "redis+stream://%s" % url.netloc
        else:
            raise ValueError(kind)

    def source_url(self, group="consumers"):
        if self.kind == "amqp":
            return "%s?queue=%s%s" % (self.base, self.name, self.tls_query)
        if self.kind == "kafka":
            return "%s/%s?group=%s&%s" % (self.base, self.name, group, KAFKA_SOURCE_PARAMETERS)
        if self.kind == "sqs":  # one queue: every consumer competes for it, whatever its group
            return "%s/%s?region=%s&%s" % (self.base, self.name, self.private.region, SQS_SOURCE_PARAMETERS)
        return "%s/%s?group=%s" % (self.base, self.name, group)

    def sink_url(self):
        if self.kind == "amqp":
            # The default exchange routes by queue name.
            return "%s?exchange=&routing_key=%s%s" % (self.base, self.name, self.tls_query)
        if self.kind == "sqs":
            return "%s/%s?region=%s" % (self.base, self.name, self.private.region)
        return "%s/%s" % (self.base, self.name)

    def dead_letter_source_url(self):
        if self.kind == "amqp":
            return "%s?queue=%s.dead-letter&declare=false%s" % (self.base, self.name, self.tls_query)
        if self.kind == "kafka":
            return "%s/%s.dead-letter?group=inspect&%s" % (self.base, self.name, KAFKA_SOURCE_PARAMETERS)
        if self.kind == "sqs":
            base = self.name[:len(self.name) - len(self.fifo_suffix)]
            return "%s/%s-dead-letter%s?region=%s&%s" % (self.base, base, self.fifo_suffix, self.private.region,
                                                        SQS_SOURCE_PARAMETERS)
        return "%s/%s:dead-letter?group=inspect" % (self.base, self.name)

    def take_dead_letters(self, tool, idle_ms=1000):
        """The dead letters not taken yet, as `take` shows them. On Kafka they are read with kcat
        from where the last call stopped (a consumer group would first wait for its partitions)."""
        if self.kind != "kafka":
            return tool.take(self.dead_letter_source_url(), idle_ms=idle_ms)
        records = self.private.read(self.name + ".dead-letter", self.dead_letters_read)
        self.dead_letters_read += len(records)
        return records

    def take_left(self, tool, idle_ms=1500):
        """Takes (and acks) what is left for the consumers' group."""
        if self.kind == "kafka":
            idle_ms = max(idle_ms, KAFKA_JOIN_MS)
        elif self.kind == "sqs":
            idle_ms = max(idle_ms, 3000)  # a long poll or two: SQS answers an empty receive late
        return tool.take(self.source_url(), idle_ms=idle_ms)

    def settled(self):
        """Whether every message published so far was delivered and acknowledged: for a Redis
        stream, its group has no pending entries and no lag (a message a killed consumer held stays
        pending until a live one claims it after claim_idle); for a RabbitMQ queue, none is ready
        or unacknowledged (a copy a killed consumer held is requeued at once, but a live one may
        hold it for a while: retrying it until the dead one's lease on its key expires); for a
        Kafka topic, the consumers' group has committed everything; for an SQS queue, nothing is
        left in it, visible or held."""
        if self.kind == "amqp":
            return rabbitmq_queue_depth(self.name) == 0
        if self.kind == "kafka":
            return self.private.lag(self.name, "consumers") == 0
        if self.kind == "sqs":
            return self.private.depth(self.name) == 0
        host, _, port = self.base[len("redis+stream://"):].rpartition(":")
        groups = redis_command(host.split("@")[-1], int(port), "XINFO", "GROUPS", self.name)
        for group in groups:
            fields = dict(zip(group[::2], group[1::2]))
            if fields.get(b"name") == b"consumers":
                return fields.get(b"pending") == 0 and fields.get(b"lag") in (0, None)
        return False

    def declare(self, tool):
        """Creates the queue (and its dead-letter queue) or the stream's group before anything is
        published, by opening a source on it: messages published earlier could be routed nowhere.
        (Kafka topics and SQS queues are made by the constructor.)"""
        if self.kind not in ("kafka", "sqs"):
            tool.take(self.source_url(), idle_ms=50)


def redis_command(host, port, *args):
    """One command over RESP2 on a new connection; the reply as Python values (bytes, int, list)."""
    with socket.create_connection((host, port), timeout=5) as sock:
        out = b"*%d\r\n" % len(args)
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            out += b"$%d\r\n%s\r\n" % (len(a), a)
        sock.sendall(out)
        reader = sock.makefile("rb")

        def read():
            line = reader.readline()
            kind, rest = line[:1], line[1:-2]
            if kind == b"+":
                return rest
            if kind == b"-":
                raise RuntimeError("redis: " + rest.decode(errors="replace"))
            if kind == b":":
                return int(rest)
            if kind == b"$":
                n = int(rest)
                if n < 0:
                    return None
                data = reader.read(n + 2)
                return data[:-2]
            if kind == b"*":
                n = int(rest)
                return None if n < 0 else [read() for _ in range(n)]
            raise RuntimeError("redis: unexpected reply %r" % line)
        return read()


class BrokerTool:
    """tests/tools/idem-broker-tool: publish JSON-lines messages, take what a queue holds."""

    def __init__(self, binary):
        self.binary = binary

    def publish(self, sink_url, messages, timeout=300):
        lines = "".join(json.dumps(m) + "\n" for m in messages)
        out = subprocess.run([self.binary, "publish", sink_url], input=lines, capture_output=True, text=True,
                             timeout=timeout)
        if out.returncode != 0:
            raise RuntimeError("publish failed (%d): %s" % (out.returncode, out.stderr.strip()))
        return int(out.stdout.strip())

    def take(self, source_url, idle_ms=1000, claim_idle_ms=100, timeout=300):
        out = subprocess.run([self.binary, "take", source_url, "--idle-ms", str(idle_ms), "--claim-idle-ms",
                              str(claim_idle_ms)], capture_output=True, text=True, timeout=timeout)
        if out.returncode != 0:
            raise RuntimeError("take failed (%d): %s" % (out.returncode, out.stderr.strip()))
        return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]


def rabbitmq_queue_depth(queue):
    """Messages ready plus unacknowledged in `queue` on the shared RabbitMQ node (rabbitmqctl:
    the queue process's own count, not the management plugin's sampled one)."""
    servers = env("IDEM_TEST_SERVERS_DIR")
    out = subprocess.run(["bash", SERVERS_SH, "rabbitmqctl", servers, "list_queues", "--quiet",
                          "--no-table-headers", "name", "messages"],
                         check=True, timeout=60, capture_output=True, text=True).stdout
    for line in out.splitlines():
        name, _, count = line.rpartition("\t")
        if name == queue:
            return int(count)
    raise AssertionError("queue %s not found in: %s" % (queue, out[-500:]))


def rabbitmq_tls_peers():
    """The subjects of the client certificates of the shared node's TLS connections, one per
    connection (rabbitmqctl list_connections)."""
    servers = env("IDEM_TEST_SERVERS_DIR")
    out = subprocess.run(["bash", SERVERS_SH, "rabbitmqctl", servers, "list_connections", "--quiet",
                          "--no-table-headers", "ssl", "peer_cert_subject"],
                         check=True, timeout=60, capture_output=True, text=True).stdout
    return [line.partition("\t")[2] for line in out.splitlines() if line.startswith("true\t")]


def restart_rabbitmq():
    """Stops the shared RabbitMQ node and starts it again on the same ports, its data kept."""
    servers = env("IDEM_TEST_SERVERS_DIR")
    subprocess.run(["bash", SERVERS_SH, "stop-rabbitmq", servers], check=True, timeout=120)
    subprocess.run(["bash", SERVERS_SH, "start-rabbitmq", servers], check=True, timeout=180)


def stop_process(proc, timeout=20):
    """SIGTERM, then SIGKILL if it is still there after `timeout` seconds."""
    if proc and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def read_port_file(path, proc, what, log_path, timeout=20):
    """What a server wrote to its port file (atomically: whole or absent), once it has; fails
    when `proc` exits first or `timeout` seconds pass."""
    deadline = time.time() + timeout
    while True:
        if os.path.exists(path):
            with open(path) as f:
                text = f.read().strip()
            if text:
                return text
        if proc.poll() is not None or time.time() > deadline:
            raise RuntimeError("%s did not come up (see %s)" % (what, log_path))
        time.sleep(0.05)


class PrivateRedis:
    """A Redis 7 of one test's own, persistent (AOF, fsync always), restartable on its port."""

    def __init__(self, workdir):
        self.dir = os.path.join(workdir, "redis-%s" % uuid.uuid4().hex[:6])
        os.makedirs(self.dir)
        self.port = free_port()
        self.proc = None
        self.start()

    @property
    def url(self):
        return "redis://127.0.0.1:%d" % self.port

    def start(self):
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.dir, "--save", "",
             "--appendonly", "yes", "--appendfsync", "always"],
            stdout=open(os.path.join(self.dir, "redis.log"), "ab"), stderr=subprocess.STDOUT)
        deadline = time.time() + 20
        while time.time() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError("private redis did not come up")

    def stop(self):
        stop_process(self.proc)

    def kill(self):
        """SIGKILL: no shutdown, nothing written at exit; start() reloads what its AOF holds."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def restart(self, down_seconds=0.0):
        self.stop()
        time.sleep(down_seconds)
        self.start()


class PrivateKafka:
    """librdkafka's mock cluster (idem-kafka-mock, three brokers on loopback ports it picks) for
    one test, driven by its stdin commands. It keeps nothing across a restart of its process, so
    a "restart" here takes a broker down and up and moves a partition's leader, as a broker
    failing over would."""

    def __init__(self, workdir, brokers=3):
        self.dir = os.path.join(workdir, "kafka-%s" % uuid.uuid4().hex[:6])
        os.makedirs(self.dir)
        port_file = os.path.join(self.dir, "bootstrap")
        self.log = open(os.path.join(self.dir, "mock.log"), "ab")
        # IDEM_TEST_KAFKA_BOOTSTRAP: a real cluster instead (the mock program then only creates
        # topics and reads lag there; the fault commands of restart() and all_brokers() fail).
        real = os.environ.get("IDEM_TEST_KAFKA_BOOTSTRAP")
        cluster = ["--connect", real] if real else ["--brokers", str(brokers)]
        self.proc = subprocess.Popen([env("IDEM_KAFKA_MOCK")] + cluster + ["--port-file", port_file],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True)
        self.lock = threading.Lock()
        self.brokers = brokers
        self.topics = []
        self.bootstrap = read_port_file(port_file, self.proc, "idem-kafka-mock", self.log.name)

    def command(self, line):
        """One stdin command; its answer ("ok ...") or RuntimeError."""
        with self.lock:
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
            answer = self.proc.stdout.readline().strip()
        if not answer.startswith("ok"):
            raise RuntimeError("idem-kafka-mock %r: %s" % (line, answer or "no answer"))
        return answer[2:].strip()

    def topic(self, name, partitions):
        self.command("topic %s %d" % (name, partitions))
        self.topics.append(name)

    def lag(self, topic, group):
        return int(self.command("lag %s %s" % (topic, group)))

    def read(self, topic, start=0):
        """The records of a one-partition topic from offset `start`, read with kcat (a real
        client of another project), shaped as idem-broker-tool's take shows messages."""
        out = subprocess.run(["kcat", "-C", "-b", self.bootstrap, "-t", topic, "-p", "0", "-o", str(start), "-e",
                              "-q", "-J"], capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            raise RuntimeError("kcat -C %s failed (%d): %s" % (topic, out.returncode, out.stderr.strip()))
        records = []
        for line in out.stdout.splitlines():
            if not line.strip():
                continue
            r = json.loads(line)
            flat = r.get("headers") or []
            headers = dict(zip(flat[::2], flat[1::2]))
            records.append({"id": headers.get("message_id"), "body": r.get("payload") or "", "headers": headers})
        return records

    def restart(self, down_seconds=0.0):
        """Broker 1 down for `down_seconds` (the partitions it leads stop), up again, and then
        partition 0 of every topic led by broker 2: clients must follow the new leader."""
        self.command("broker-down 1")
        time.sleep(down_seconds)
        self.command("broker-up 1")
        for t in self.topics:
            self.command("leader %s 0 2" % t)

    def all_brokers(self, state):
        """Every broker's listener "down" (the cluster away; it keeps its data) or "up" again."""
        for broker in range(1, self.brokers + 1):
            self.command("broker-%s %d" % (state, broker))

    def stop(self):
        stop_process(self.proc)
        self.proc.stdin.close()
        self.proc.stdout.close()
        self.log.close()


class PrivateSqs:
    """fauxqs (testing/sqs_emulator/serve.mjs) for one test, reached through idem-fault-proxy
    on a port of its own: restart() takes the proxy away (the endpoint refuses connections)
    while fauxqs, which keeps nothing across its own restart, keeps the queues. Queue URLs are
    http://127.0.0.1:PROXY_PORT/000000000000/NAME. fauxqs accepts any signature: the tests'
    credentials are made up.

    With IDEM_TEST_SQS_ENDPOINT (https://sqs.REGION.amazonaws.com) and IDEM_TEST_SQS_ACCOUNT
    set, the queues are made on that endpoint instead, with the AWS SDK (admin.mjs) and the
    credentials and AWS_REGION of the environment, and deleted at stop(); restart() and away()
    then fail: the tests that take the endpoint away need the emulator."""

    ACCOUNT = "000000000000"
    CREDENTIALS = "AKIDIDEMTEST:idem-test-secret"

    def __init__(self, workdir):
        self.dir = os.path.join(workdir, "sqs-%s" % uuid.uuid4().hex[:6])
        os.makedirs(self.dir)
        self.log = open(os.path.join(self.dir, "sqs.log"), "ab")
        self.endpoint = os.environ.get("IDEM_TEST_SQS_ENDPOINT", "").rstrip("/")
        self.region = os.environ.get("AWS_REGION", "us-east-1") if self.endpoint else "us-east-1"
        self.queues = {}  # name -> queue URL, on a real endpoint
        self.emulator = self.proxy = None
        if self.endpoint:
            return
        port_file = os.path.join(self.dir, "port")
        self.emulator = subprocess.Popen(["node", env("IDEM_SQS_EMULATOR"), "--port-file", port_file],
                                         stdout=self.log, stderr=subprocess.STDOUT)
        self.backend = int(read_port_file(port_file, self.emulator, "the SQS emulator", self.log.name, timeout=30))
        self.port = free_port()
        self.proxy = None
        self.start()

    @property
    def base_url(self):
        if self.endpoint:  # the credentials come from the environment
            return "sqs+%s/%s" % (self.endpoint, env("IDEM_TEST_SQS_ACCOUNT"))
        return "sqs+http://%s@127.0.0.1:%d/%s" % (self.CREDENTIALS, self.port, self.ACCOUNT)

    def _admin(self, *argv):
        script = os.path.join(ROOT, "testing", "sqs_emulator", "admin.mjs")
        out = subprocess.run(["node", "--no-warnings", script, self.endpoint] + list(argv), capture_output=True,
                             text=True, timeout=60)
        if out.returncode != 0:
            raise RuntimeError(out.stderr.strip() or "admin.mjs %s failed" % argv[0])
        return out.stdout.strip()

    def start(self):
        """The endpoint (the proxy in front of fauxqs) up on its port."""
        if self.endpoint:
            raise RuntimeError("taking the SQS endpoint away needs the emulator (IDEM_TEST_SQS_ENDPOINT is set)")
        self.proxy = subprocess.Popen([env("IDEM_FAULT_PROXY_BIN"), "--listen", "127.0.0.1:%d" % self.port, "--target",
                                       "127.0.0.1:%d" % self.backend, "--drop-rate", "0"],
                                      stdout=subprocess.DEVNULL, stderr=self.log)
        wait_until(self._connects, 20, what="the SQS endpoint")

    def _connects(self):
        if self.proxy.poll() is not None:
            raise RuntimeError("idem-fault-proxy exited (see %s)" % self.log.name)
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
            return True
        except OSError:
            return False

    def call(self, action, body):
        """One SQS JSON-protocol call; its answer as a dict, or RuntimeError."""
        request = urllib.request.Request(
            "http://127.0.0.1:%d/" % self.port, data=json.dumps(body).encode(), method="POST",
            headers={"Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": "AmazonSQS." + action,
                     "Authorization": "AWS4-HMAC-SHA256 Credential=AKIDIDEMTEST/20260101/us-east-1/sqs/aws4_request, "
                                      "SignedHeaders=host, Signature=" + "0" * 64})
        try:
            with urllib.request.urlopen(request, timeout=10) as r:
                text = r.read().decode()
        except urllib.error.HTTPError as e:
            raise RuntimeError("SQS %s: %d %s" % (action, e.code, e.read().decode(errors="replace")[:300]))
        return json.loads(text) if text.strip() else {}

    def queue_url(self, name):
        if self.endpoint:
            return self.queues[name]
        return "http://127.0.0.1:%d/%s/%s" % (self.port, self.ACCOUNT, name)

    def create_queue(self, name, attributes=None):
        if self.endpoint:
            self.queues[name] = self._admin("create-queue", name)
            return self.queues[name]
        return self.call("CreateQueue", {"QueueName": name, "Attributes": attributes or {}})["QueueUrl"]

    def produce(self, name, messages):
        """Sends `messages` to queue `name` with the AWS SDK (testing/sqs_emulator/produce.mjs: a
        real client), one SendMessage each; the fields are produce.mjs's."""
        script = os.path.join(ROOT, "testing", "sqs_emulator", "produce.mjs")
        environment = dict(os.environ)
        if not self.endpoint:
            key_id, secret = self.CREDENTIALS.split(":")
            environment.update(AWS_ACCESS_KEY_ID=key_id, AWS_SECRET_ACCESS_KEY=secret, AWS_REGION=self.region)
        lines = "".join(json.dumps(m) + "\n" for m in messages)
        out = subprocess.run(["node", "--no-warnings", script, self.queue_url(name)], input=lines, env=environment,
                             capture_output=True, text=True, timeout=120)
        if out.returncode != 0 or out.stdout.strip() != "sent %d" % len(messages):
            raise RuntimeError("produce.mjs: %s %s" % (out.stdout.strip(), out.stderr.strip()))

    def depth(self, name):
        """Messages in the queue, visible or held by a consumer (or delayed)."""
        if self.endpoint:
            return int(self._admin("depth", self.queue_url(name)))
        names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible",
                 "ApproximateNumberOfMessagesDelayed"]
        got = self.call("GetQueueAttributes", {"QueueUrl": self.queue_url(name), "AttributeNames": names})
        return sum(int(got.get("Attributes", {}).get(n, 0)) for n in names)

    def restart(self, down_seconds=0.0):
        """The endpoint away for `down_seconds` (connections refused), then back, queues kept."""
        self.away()
        time.sleep(down_seconds)
        self.start()

    def away(self):
        if self.endpoint:
            raise RuntimeError("taking the SQS endpoint away needs the emulator (IDEM_TEST_SQS_ENDPOINT is set)")
        stop_process(self.proxy)

    def stop(self):
        if self.endpoint:
            for url in self.queues.values():
                self._admin("delete-queue", url)
            self.log.close()
            return
        self.away()
        stop_process(self.emulator)
        self.log.close()


def private_server(kind, workdir):
    """The server a test of `kind` runs for itself (Redis, Kafka, SQS), or None (RabbitMQ is
    shared)."""
    if kind == "redis_streams":
        return PrivateRedis(workdir)
    if kind == "kafka":
        return PrivateKafka(workdir)
    if kind == "sqs":
        return PrivateSqs(workdir)
    return None


def outage_seconds(kind):
    """How long the kill loops keep a broker away: a restart's second, or for SQS, whose
    endpoint going away is the outage its users meet (the broker itself does not restart), 30 s."""
    return 30.0 if kind == "sqs" else 1.0


def restart_broker(kind, private=None, down_seconds=0.0):
    if kind == "amqp":
        restart_rabbitmq()
    else:
        private.restart(down_seconds)


class Handler:
    """A message handler over HTTP (what idem-consume and idem-relay deliver to), counting each
    Idempotency-Key it sees. `dedupe` makes it keep each key's effect once, as a handler with a
    unique index does; `answer(key, body)` may return (status, headers, body) to override 200, or
    "hang" to never answer. `tls` serves https:// instead: a dict with "cert" and "key" (PEM
    files) and, for mutual TLS, "client_ca" (a client certificate issued by it is then required);
    `client_subjects` collects the subjects of the client certificates that POSTed."""

    def __init__(self, dedupe=False, answer=None, tls=None):
        self.lock = threading.Lock()
        self.calls = {}    # key -> POSTs received
        self.effects = {}  # key -> effects kept (dedupe: at most 1)
        self.headers = {}  # key -> headers of the last POST
        self.bodies = {}
        self.attempts = {}  # key -> Idem-Delivery-Attempt of each POST, in order
        self.dedupe = dedupe
        self.answer = answer
        self.release = threading.Event()  # ends "hang"s (at stop)
        self.tls = tls
        self.client_subjects = set()
        outer = self

        class Request(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Headers and body go in two writes: without TCP_NODELAY the body waits for the
            # client's delayed ACK, 40 ms a request.
            disable_nagle_algorithm = True

            def log_message(self, *args):
                pass

            def setup(self):
                if outer.tls:
                    # The handshake in this connection's thread, not in the accepting one.
                    self.request.do_handshake()
                super().setup()

            def do_POST(self):
                length = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(length)
                key = self.headers.get("Idempotency-Key")
                if outer.tls and outer.tls.get("client_ca"):
                    peer = self.request.getpeercert() or {}
                    subject = ",".join("%s=%s" % kv for rdn in peer.get("subject", ()) for kv in rdn)
                    with outer.lock:
                        outer.client_subjects.add(subject)
                decided = outer.answer(key, body) if outer.answer else None
                if decided == "hang":
                    outer.release.wait(120)
                    return
                with outer.lock:
                    outer.calls[key] = outer.calls.get(key, 0) + 1
                    outer.attempts.setdefault(key, []).append(self.headers.get("Idem-Delivery-Attempt"))
                    outer.headers[key] = dict(self.headers.items())
                    outer.bodies[key] = body
                    if decided is None or 200 <= decided[0] < 300:
                        if not (outer.dedupe and outer.effects.get(key)):
                            outer.effects[key] = outer.effects.get(key, 0) + 1
                status, headers, reply = decided if decided else (200, {}, b"{\"ok\":true}")
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

        class Server(http.server.ThreadingHTTPServer):
            def handle_error(self, request, client_address):
                # A sidecar killed mid-request resets its connection: expected here, not news.
                if not isinstance(sys.exc_info()[1], OSError):
                    super().handle_error(request, client_address)

        self.server = Server(("127.0.0.1", 0), Request)
        if tls:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            context.load_cert_chain(tls["cert"], tls["key"])
            if tls.get("client_ca"):
                context.verify_mode = ssl.CERT_REQUIRED
                context.load_verify_locations(tls["client_ca"])
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True,
                                                     do_handshake_on_connect=False)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self):
        scheme = "https" if self.tls else "http"
        return "%s://127.0.0.1:%d/messages" % (scheme, self.server.server_address[1])

    def effect_counts(self):
        with self.lock:
            return dict(self.effects)

    def call_counts(self):
        with self.lock:
            return dict(self.calls)

    def stop(self):
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def wait_until(predicate, timeout, interval=0.05, what="condition"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError("timed out after %.0f s waiting for %s" % (timeout, what))


def http_get(port, path, timeout=5):
    import http.client
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read().decode("utf-8", "replace")
    finally:
        c.close()


def parse_metrics(text):
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        out[name] = float(value)
    return out
