"""A TLS front for the fixture upstream (Python 3 stdlib only): terminates TLS with a given
certificate on a free loopback port and passes the bytes on to a plain port, so that the gateway's
https:// upstream is the same counting fixture as its http:// one. Optionally requires a client
certificate from a CA (the gateway's mTLS to its upstream). Runs in threads of the test process;
stop() closes the listener and every connection.
"""

import socket
import ssl
import threading

from ports import free_port  # tests/common, on sys.path through harness


class TlsFront:
    def __init__(self, cert, key, target_port, client_ca=None):
        self.target_port = target_port
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self.context.load_cert_chain(cert, key)
        if client_ca:
            self.context.verify_mode = ssl.CERT_REQUIRED
            self.context.load_verify_locations(client_ca)
        self.handshakes = 0
        self.failed_handshakes = 0
        self._lock = threading.Lock()
        self._sockets = []
        self._closed = False
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        for _ in range(20):
            self.port = free_port()
            try:
                self.listener.bind(("127.0.0.1", self.port))
                break
            except OSError:
                continue
        self.listener.listen(128)
        self.url = "https://localhost:%d" % self.port
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self):
        while True:
            try:
                raw, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(raw,), daemon=True).start()

    def _serve(self, raw):
        raw.settimeout(30)
        try:
            tls = self.context.wrap_socket(raw, server_side=True)
        except (ssl.SSLError, OSError):
            with self._lock:
                self.failed_handshakes += 1
            raw.close()
            return
        with self._lock:
            self.handshakes += 1
        try:
            plain = socket.create_connection(("127.0.0.1", self.target_port), timeout=30)
        except OSError:
            tls.close()
            return
        with self._lock:
            if self._closed:
                tls.close()
                plain.close()
                return
            self._sockets += [tls, plain]
        threading.Thread(target=self._pipe, args=(plain, tls), daemon=True).start()
        self._pipe(tls, plain)

    @staticmethod
    def _pipe(src, dst):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def stop(self):
        with self._lock:
            self._closed = True
            sockets, self._sockets = self._sockets, []
        try:
            self.listener.close()
        except OSError:
            pass
        for s in sockets:
            try:
                s.close()
            except OSError:
                pass
