"""A TCP proxy in front of an HTTP/2 server that loses answers after the server has sent them.

Each accepted connection is, with probability `loss`, a lossy one: the proxy forwards both
directions byte for byte, parsing the HTTP/2 frame headers of the server-to-client direction (9
bytes: 24-bit length, type, flags, 31-bit stream id); the first HEADERS frame (type 1) on a client
stream (odd id) is the answer starting, and a lossy connection is then cut on both sides instead of
forwarding that frame. The server has answered (and, behind an idempotency gateway, the upstream
has executed); the client sees the connection drop (UNAVAILABLE) and never gets the answer.

Used by tests/grpc/test_grpc.py; the standard library only, so any Python can import it.
"""

import random
import socket
import threading

HEADERS = 1


class LossyProxy:
    def __init__(self, target_port, loss=0.3, seed=None, host="127.0.0.1"):
        self.target = (host, target_port)
        self.loss = loss
        self.random = random.Random(seed)
        self.lock = threading.Lock()
        self.connections = 0
        self.dropped = 0  # answers lost: connections cut at an answer's HEADERS frame
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind((host, 0))
        self.listener.listen(256)
        self.port = self.listener.getsockname()[1]
        self.closing = False
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self):
        while not self.closing:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            with self.lock:
                self.connections += 1
                lossy = self.random.random() < self.loss
            try:
                server = socket.create_connection(self.target, timeout=5)
                server.settimeout(None)
            except OSError:
                client.close()
                continue
            for s in (client, server):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = _Connection(self, client, server, lossy)
            threading.Thread(target=conn.client_to_server, daemon=True).start()
            threading.Thread(target=conn.server_to_client, daemon=True).start()

    def _count_drop(self):
        with self.lock:
            self.dropped += 1

    def close(self):
        self.closing = True
        try:
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() (close alone does not)
        except OSError:
            pass
        try:
            self.listener.close()
        except OSError:
            pass
        self.thread.join(5)


class _Connection:
    def __init__(self, proxy, client, server, lossy):
        self.proxy = proxy
        self.client = client
        self.server = server
        self.lossy = lossy
        self.cut_lock = threading.Lock()
        self.cut = False

    def _cut(self):
        with self.cut_lock:
            if self.cut:
                return
            self.cut = True
        for s in (self.client, self.server):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            try:
                s.close()
            except OSError:
                pass

    def client_to_server(self):
        try:
            while True:
                data = self.client.recv(65536)
                if not data:
                    break
                self.server.sendall(data)
        except OSError:
            pass
        self._cut()

    def server_to_client(self):
        buf = b""
        try:
            while True:
                data = self.server.recv(65536)
                if not data:
                    break
                if not self.lossy:
                    self.client.sendall(data)
                    continue
                # Forward whole frames only, so the cut falls exactly before the answer's HEADERS.
                buf += data
                out = bytearray()
                while len(buf) >= 9:
                    length = int.from_bytes(buf[0:3], "big")
                    ftype = buf[3]
                    stream = int.from_bytes(buf[5:9], "big") & 0x7FFFFFFF
                    if len(buf) < 9 + length:
                        break
                    if ftype == HEADERS and stream % 2 == 1:
                        if out:
                            self.client.sendall(bytes(out))
                        self.proxy._count_drop()
                        self._cut()
                        return
                    out += buf[:9 + length]
                    buf = buf[9 + length:]
                if out:
                    self.client.sendall(bytes(out))
        except OSError:
            pass
        self._cut()
