"""A TLS terminator for end-to-end tests: https:// in front of a plain HTTP server (idem-notifier's
webhook listener, say), as a load balancer or a service mesh's proxy would put it. Python 3 stdlib.

    t = TlsTerminator(target_port, cert, key, client_ca=None)
    t.url("/events")      https://127.0.0.1:PORT/events
    t.client_subjects     subjects of the client certificates that connected (client_ca given:
                          a client certificate issued by it is required)
    t.handshakes_failed   handshakes that failed (a client refusing our certificate, or one
                          without a client certificate)
    t.bytes_forwarded     bytes clients sent through to the target (0: no request got through)
    t.stop()

Each accepted connection is handshaken in its own thread, then its bytes are copied both ways to
a new plain connection to 127.0.0.1:target_port until either side closes.
"""

import socket
import ssl
import threading


class TlsTerminator:
    def __init__(self, target_port, cert, key, client_ca=None):
        self.target_port = target_port
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self.context.load_cert_chain(cert, key)
        if client_ca:
            self.context.verify_mode = ssl.CERT_REQUIRED
            self.context.load_verify_locations(client_ca)
        self.lock = threading.Lock()
        self.client_subjects = set()
        self.handshakes_failed = 0
        self.bytes_forwarded = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def url(self, path):
        return "https://127.0.0.1:%d%s" % (self.port, path)

    def _accept(self):
        while not self.stopped.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        try:
            conn.settimeout(30)
            tls = self.context.wrap_socket(conn, server_side=True)
        except (OSError, ValueError):
            with self.lock:
                self.handshakes_failed += 1
            conn.close()
            return
        peer = tls.getpeercert() or {}
        if peer:
            subject = ",".join("%s=%s" % kv for rdn in peer.get("subject", ()) for kv in rdn)
            with self.lock:
                self.client_subjects.add(subject)
        try:
            upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=30)
        except OSError:
            tls.close()
            return
        tls.settimeout(None)
        upstream.settimeout(None)

        def pump(src, dst):
            try:
                while True:
                    data = src.recv(65536)
                    if not data:
                        break
                    dst.sendall(data)
                    if src is tls:
                        with self.lock:
                            self.bytes_forwarded += len(data)
            except OSError:
                pass
            finally:
                for s in (src, dst):
                    try:
                        s.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
        back = threading.Thread(target=pump, args=(upstream, tls), daemon=True)
        back.start()
        pump(tls, upstream)
        back.join(30)
        tls.close()
        upstream.close()

    def stop(self):
        self.stopped.set()
        self.listener.close()
