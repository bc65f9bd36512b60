#!/usr/bin/python3
"""A gRPC payments service for the gateway's gRPC end-to-end tests (tests/grpc/test_grpc.py).

grpcio with generic handlers and raw bytes (no protoc, no generated code): every message is the
bytes on the wire. Run it with /usr/bin/python3 (Debian's python3-grpcio).

    /usr/bin/python3 payments_service.py --port-file PATH --log PATH [--port N]

Listens on 127.0.0.1 (port N, 0 = a free one), writes the port to --port-file once it is serving.
Every execution of Charge is appended to --log (one line: the key, a tab, the request in hex) before
it does anything else, and the log is read back at start: counts survive a SIGKILL and a restart.

Methods of service payments.Payments:

- Charge (unary): the request is `;`-separated words, e.g. b"amount=5;sleep=300;trailer=x-a:b".
  The key is the call's `idempotency-key` metadata (empty if none). Each call is one execution:
  it is logged and counted per key, then the words say what it does:
      sleep=MS                 sleep MS milliseconds before answering
      sleep_first=MS           the same, on the key's first execution only
      fail=CODE                end with status CODE (a grpc.StatusCode name), message "charge failed: CODE"
      fail_first=CODE          end with status CODE on the key's first execution only
      trailer=NAME:VALUE       set that trailing metadata (repeatable; a NAME ending in -bin
                               takes the VALUE in hex, its bytes are sent)
      header=NAME:VALUE        send that initial metadata (repeatable; -bin as for trailer)
      pad=N                    N more bytes at the end of the answer (0, 1, ..., 255, 0, 1, ...)
  Otherwise it answers b"charged:" + request + b":" + the key's execution number (1 for the first)
  (+ the pad). Words it does not know are ignored (filler, to make a large request).
- Counts (unary): JSON {"executions": {key: n, ...}, "total": N} (bytes). Not keyed.
- Stream (server streaming): the request is b"n=N[;gap=MS]": N messages b"item:I" (I = 0..N-1),
  MS milliseconds apart.
"""

import argparse
import json
import os
import signal
import sys
import threading
import time
from concurrent import futures

import grpc

SERVICE = "payments.Payments"


def padding(n):
    return (bytes(range(256)) * (n // 256 + 1))[:n]


def _metadatum(text):
    name, _, value = text.partition(":")
    return (name, bytes.fromhex(value)) if name.endswith("-bin") else (name, value)


class Payments:
    def __init__(self, log_path):
        self.lock = threading.Lock()
        self.executions = {}
        self.total = 0
        if os.path.exists(log_path):
            with open(log_path, "rb") as f:
                for line in f:
                    if line.endswith(b"\n"):
                        key = line.split(b"\t", 1)[0].decode()
                        self.executions[key] = self.executions.get(key, 0) + 1
                        self.total += 1
        # O_APPEND, unbuffered: a line is in the file (the kernel's page cache) as soon as os.write
        # returns, so a SIGKILL a moment later loses nothing.
        self.log_fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def _record(self, key, request):
        with self.lock:
            n = self.executions.get(key, 0) + 1
            self.executions[key] = n
            self.total += 1
            os.write(self.log_fd, key.encode() + b"\t" + request.hex().encode() + b"\n")
            return n

    def charge(self, request, context):
        md = dict(context.invocation_metadata())
        key = md.get("idempotency-key", "")
        n = self._record(key, request)
        sleep_ms = pad = 0
        fail = fail_first = None
        trailers, headers = [], []
        for word in request.split(b";"):
            name, _, value = word.partition(b"=")
            value = value.decode("latin-1")
            if name == b"sleep":
                sleep_ms = int(value)
            elif name == b"sleep_first":
                sleep_ms = int(value) if n == 1 else 0
            elif name == b"fail":
                fail = value
            elif name == b"fail_first":
                fail_first = value
            elif name == b"trailer":
                trailers.append(_metadatum(value))
            elif name == b"header":
                headers.append(_metadatum(value))
            elif name == b"pad":
                pad = int(value)
        if headers:
            context.send_initial_metadata(headers)
        if sleep_ms:
            time.sleep(sleep_ms / 1000.0)
        if trailers:
            context.set_trailing_metadata(trailers)
        code = fail or (fail_first if n == 1 else None)
        if code:
            context.abort(getattr(grpc.StatusCode, code), "charge failed: " + code)
        return b"charged:" + request + b":" + str(n).encode() + padding(pad)

    def counts(self, request, context):
        with self.lock:
            return json.dumps({"executions": self.executions, "total": self.total}).encode()

    def stream(self, request, context):
        n, gap = 0, 0
        for word in request.split(b";"):
            name, _, value = word.partition(b"=")
            if name == b"n":
                n = int(value)
            elif name == b"gap":
                gap = int(value)
        for i in range(n):
            if i and gap:
                time.sleep(gap / 1000.0)
            yield b"item:%d" % i


def serve(port, port_file, log_path):
    payments = Payments(log_path)
    handler = grpc.method_handlers_generic_handler(SERVICE, {
        "Charge": grpc.unary_unary_rpc_method_handler(payments.charge),
        "Counts": grpc.unary_unary_rpc_method_handler(payments.counts),
        "Stream": grpc.unary_stream_rpc_method_handler(payments.stream),
    })
    # SO_REUSEPORT off: a restart on the same port must really own it, not share it with a leftover.
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=128),
                         options=[("grpc.so_reuseport", 0)])
    server.add_generic_rpc_handlers((handler,))
    bound = server.add_insecure_port("127.0.0.1:%d" % port)
    if bound == 0:
        print("payments_service: cannot listen on 127.0.0.1:%d" % port, file=sys.stderr)
        sys.exit(1)
    server.start()
    tmp = port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write("%d\n" % bound)
    os.rename(tmp, port_file)
    print("payments_service: serving on 127.0.0.1:%d" % bound, flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    server.stop(grace=1).wait()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--port-file", required=True)
    parser.add_argument("--log", required=True, help="executions log, appended to and read at start")
    args = parser.parse_args()
    serve(args.port, args.port_file, args.log)


if __name__ == "__main__":
    main()
