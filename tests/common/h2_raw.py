"""A tiny raw HTTP/2 client for tests (RFC 9113, RFC 7541), Python 3 standard library only.

It sends exactly the frames a test asks for, which no ordinary client does: more streams than the
server allows, HEADERS then RST_STREAM by the thousand (a rapid reset), garbage after the preface.

    conn = H2Connection(port)                      # plain TCP, prior knowledge (h2c)
    conn = H2Connection(port, tls_context=ctx)     # TLS, ALPN "h2"
    sid = conn.request("POST", "/echo/x", [("idempotency-key", k)], body=b"{}")
    r = conn.response(sid)                         # H2Response: status, headers, body, reset_code

What it sends: the connection preface, a SETTINGS frame (an initial window of 2^31-1 unless told
otherwise) and a connection WINDOW_UPDATE; HEADERS (split into CONTINUATION frames above 16,384
bytes) whose fields are encoded as HPACK "literal without indexing, new name" with raw (not
Huffman) strings, so nothing depends on the dynamic table; DATA, within the server's
flow-control windows (request(), send_body(): it waits for WINDOW_UPDATE) or blindly
(request_frames(), for batches); RST_STREAM; raw bytes.

What it reads: every send and wait reads what came meanwhile (no threads: one select loop, so a
TLS socket is never used by two threads at once), decodes every header block (a full HPACK
decoder: static and dynamic tables, Huffman), keeps per-stream state, answers PING and, unless
`auto_ack_settings=False`, the server's SETTINGS, and returns flow-control credit for DATA. Frames
stay in `frames` (type, flags, stream id, payload) for tests that look at them.

    python3 h2_raw.py    # self-test of the HPACK decoder against RFC 7541's examples
"""

import select
import socket
import ssl
import struct
import time

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# Frame types (RFC 9113 §6)
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
FRAME_NAMES = {DATA: "DATA", HEADERS: "HEADERS", PRIORITY: "PRIORITY", RST_STREAM: "RST_STREAM",
               SETTINGS: "SETTINGS", PUSH_PROMISE: "PUSH_PROMISE", PING: "PING", GOAWAY: "GOAWAY",
               WINDOW_UPDATE: "WINDOW_UPDATE", CONTINUATION: "CONTINUATION"}

# Flags
END_STREAM = 0x1
ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20

# SETTINGS identifiers
SETTINGS_HEADER_TABLE_SIZE = 0x1
SETTINGS_ENABLE_PUSH = 0x2
SETTINGS_MAX_CONCURRENT_STREAMS = 0x3
SETTINGS_INITIAL_WINDOW_SIZE = 0x4
SETTINGS_MAX_FRAME_SIZE = 0x5
SETTINGS_MAX_HEADER_LIST_SIZE = 0x6

# Error codes (RFC 9113 §7)
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR, SETTINGS_TIMEOUT, STREAM_CLOSED, \
    FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR, CONNECT_ERROR, ENHANCE_YOUR_CALM, \
    INADEQUATE_SECURITY, HTTP_1_1_REQUIRED = range(14)

MAX_WINDOW = 2 ** 31 - 1
DEFAULT_MAX_FRAME = 16384


# ---------------------------------------------------------------------------------------------
# HPACK (RFC 7541)

STATIC_TABLE = [
    (":authority", ""), (":method", "GET"), (":method", "POST"), (":path", "/"), (":path", "/index.html"),
    (":scheme", "http"), (":scheme", "https"), (":status", "200"), (":status", "204"), (":status", "206"),
    (":status", "304"), (":status", "400"), (":status", "404"), (":status", "500"), ("accept-charset", ""),
    ("accept-encoding", "gzip, deflate"), ("accept-language", ""), ("accept-ranges", ""), ("accept", ""),
    ("access-control-allow-origin", ""), ("age", ""), ("allow", ""), ("authorization", ""),
    ("cache-control", ""), ("content-disposition", ""), ("content-encoding", ""), ("content-language", ""),
    ("content-length", ""), ("content-location", ""), ("content-range", ""), ("content-type", ""),
    ("cookie", ""), ("date", ""), ("etag", ""), ("expect", ""), ("expires", ""), ("from", ""), ("host", ""),
    ("if-match", ""), ("if-modified-since", ""), ("if-none-match", ""), ("if-range", ""),
    ("if-unmodified-since", ""), ("last-modified", ""), ("link", ""), ("location", ""), ("max-forwards", ""),
    ("proxy-authenticate", ""), ("proxy-authorization", ""), ("range", ""), ("referer", ""), ("refresh", ""),
    ("retry-after", ""), ("server", ""), ("set-cookie", ""), ("strict-transport-security", ""),
    ("transfer-encoding", ""), ("user-agent", ""), ("vary", ""), ("via", ""), ("www-authenticate", ""),
]
assert len(STATIC_TABLE) == 61

# The Huffman code's lengths in bits for symbols 0..256 (RFC 7541, Appendix B; 256 is EOS). The
# code is canonical: within a length, codes are consecutive in symbol order, and each length's
# first code follows the previous length's last, shifted; so the lengths define the codes, which
# the self-test checks against the RFC's examples (Appendix C.4, C.6).
_HUFFMAN_LENGTHS = [
    13, 23, 28, 28, 28, 28, 28, 28, 28, 24, 30, 28, 28, 30, 28, 28,
    28, 28, 28, 28, 28, 28, 30, 28, 28, 28, 28, 28, 28, 28, 28, 28,
    6, 10, 10, 12, 13, 6, 8, 11, 10, 10, 8, 11, 8, 6, 6, 6,
    5, 5, 5, 6, 6, 6, 6, 6, 6, 6, 7, 8, 15, 6, 12, 10,
    13, 6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7,
    7, 7, 7, 7, 7, 7, 7, 7, 8, 7, 8, 13, 19, 13, 14, 6,
    15, 5, 6, 5, 6, 5, 6, 6, 6, 5, 7, 7, 6, 6, 6, 5,
    6, 7, 6, 5, 5, 6, 7, 7, 7, 7, 7, 15, 11, 14, 13, 28,
    20, 22, 20, 20, 22, 22, 22, 23, 22, 23, 23, 23, 23, 23, 24, 23,
    24, 24, 22, 23, 24, 23, 23, 23, 23, 21, 22, 23, 22, 23, 23, 24,
    22, 21, 20, 22, 22, 23, 23, 21, 23, 22, 22, 24, 21, 22, 23, 23,
    21, 21, 22, 21, 23, 22, 23, 23, 20, 22, 22, 22, 23, 22, 22, 23,
    26, 26, 20, 19, 22, 23, 22, 25, 26, 26, 26, 27, 27, 26, 24, 25,
    19, 21, 26, 27, 27, 26, 27, 24, 21, 21, 26, 26, 28, 27, 27, 27,
    20, 24, 20, 21, 22, 21, 21, 23, 22, 22, 25, 25, 24, 24, 26, 23,
    26, 27, 26, 26, 27, 27, 27, 27, 27, 28, 27, 27, 27, 27, 27, 26,
    30,
]
assert len(_HUFFMAN_LENGTHS) == 257


def _huffman_decode_table():
    """{(length, code): symbol} from the canonical lengths."""
    order = sorted(range(257), key=lambda s: (_HUFFMAN_LENGTHS[s], s))
    table = {}
    code, prev_len = 0, _HUFFMAN_LENGTHS[order[0]]
    for i, sym in enumerate(order):
        n = _HUFFMAN_LENGTHS[sym]
        if i:
            code = (code + 1) << (n - prev_len)
        table[(n, code)] = sym
        prev_len = n
    return table


_HUFFMAN = _huffman_decode_table()


class HpackError(Exception):
    pass


def huffman_decode(data):
    out = bytearray()
    code = length = 0
    for byte in data:
        for bit in range(7, -1, -1):
            code = (code << 1) | ((byte >> bit) & 1)
            length += 1
            sym = _HUFFMAN.get((length, code))
            if sym is not None:
                if sym == 256:
                    raise HpackError("EOS in a Huffman string")
                out.append(sym)
                code = length = 0
            elif length > 30:
                raise HpackError("bad Huffman code")
    # Padding: fewer than 8 bits, all ones (the EOS prefix).
    if length > 7 or code != (1 << length) - 1:
        raise HpackError("bad Huffman padding")
    return bytes(out)


def encode_int(value, prefix_bits, first_byte_flags=0):
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first_byte_flags | value])
    out = bytearray([first_byte_flags | limit])
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _decode_int(data, pos, prefix_bits):
    limit = (1 << prefix_bits) - 1
    value = data[pos] & limit
    pos += 1
    if value < limit:
        return value, pos
    shift = 0
    while True:
        if pos >= len(data):
            raise HpackError("truncated integer")
        b = data[pos]
        pos += 1
        value += (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, pos


def _decode_string(data, pos):
    if pos >= len(data):
        raise HpackError("truncated string")
    huffman = bool(data[pos] & 0x80)
    n, pos = _decode_int(data, pos, 7)
    if pos + n > len(data):
        raise HpackError("truncated string")
    raw = bytes(data[pos:pos + n])
    return (huffman_decode(raw) if huffman else raw), pos + n


def _as_bytes(s):
    return s if isinstance(s, bytes) else s.encode("latin-1")


def encode_headers(headers):
    """An HPACK block: each field a literal without indexing, new name, raw strings."""
    out = bytearray()
    for name, value in headers:
        name, value = _as_bytes(name), _as_bytes(value)
        out += b"\x00" + encode_int(len(name), 7) + name + encode_int(len(value), 7) + value
    return bytes(out)


class HpackDecoder:
    def __init__(self, max_table_size=4096):
        self.dynamic = []  # newest first
        self.max_size = max_table_size
        self.size = 0

    def _entry(self, index):
        if index == 0:
            raise HpackError("index 0")
        if index <= len(STATIC_TABLE):
            n, v = STATIC_TABLE[index - 1]
            return n.encode(), v.encode()
        i = index - len(STATIC_TABLE) - 1
        if i >= len(self.dynamic):
            raise HpackError("index %d beyond the tables" % index)
        return self.dynamic[i]

    def _add(self, name, value):
        self.dynamic.insert(0, (name, value))
        self.size += len(name) + len(value) + 32
        self._evict()

    def _evict(self):
        while self.size > self.max_size and self.dynamic:
            n, v = self.dynamic.pop()
            self.size -= len(n) + len(v) + 32

    def decode(self, data):
        """[(name, value)] as str (latin-1), in order."""
        out = []
        pos = 0
        while pos < len(data):
            b = data[pos]
            if b & 0x80:  # indexed field
                index, pos = _decode_int(data, pos, 7)
                out.append(self._entry(index))
            elif b & 0x40:  # literal with incremental indexing
                index, pos = _decode_int(data, pos, 6)
                if index:
                    name = self._entry(index)[0]
                else:
                    name, pos = _decode_string(data, pos)
                value, pos = _decode_string(data, pos)
                self._add(name, value)
                out.append((name, value))
            elif b & 0x20:  # dynamic table size update
                size, pos = _decode_int(data, pos, 5)
                self.max_size = size
                self._evict()
            else:  # literal without indexing (0000) or never indexed (0001)
                index, pos = _decode_int(data, pos, 4)
                if index:
                    name = self._entry(index)[0]
                else:
                    name, pos = _decode_string(data, pos)
                value, pos = _decode_string(data, pos)
                out.append((name, value))
        return [(n.decode("latin-1"), v.decode("latin-1")) for n, v in out]


# ---------------------------------------------------------------------------------------------
# Frames


def frame(ftype, flags, stream_id, payload=b""):
    n = len(payload)
    return struct.pack(">BHBBI", (n >> 16) & 0xFF, n & 0xFFFF, ftype, flags, stream_id & 0x7FFFFFFF) + payload


def settings_frame(settings=(), ack=False):
    return frame(SETTINGS, ACK if ack else 0, 0, b"".join(struct.pack(">HI", k, v) for k, v in settings))


def rst_stream_frame(stream_id, code=CANCEL):
    return frame(RST_STREAM, 0, stream_id, struct.pack(">I", code))


def window_update_frame(stream_id, increment):
    return frame(WINDOW_UPDATE, 0, stream_id, struct.pack(">I", increment))


def headers_frames(stream_id, block, end_stream, max_frame=DEFAULT_MAX_FRAME):
    """HEADERS (and CONTINUATION frames) carrying one header block."""
    chunks = [block[i:i + max_frame] for i in range(0, len(block), max_frame)] or [b""]
    out = bytearray()
    for i, chunk in enumerate(chunks):
        flags = END_HEADERS if i == len(chunks) - 1 else 0
        if i == 0:
            out += frame(HEADERS, flags | (END_STREAM if end_stream else 0), stream_id, chunk)
        else:
            out += frame(CONTINUATION, flags, stream_id, chunk)
    return bytes(out)


class H2Response:
    def __init__(self, stream_id):
        self.stream_id = stream_id
        self.headers = []       # the response's fields, pseudo-headers included, in order
        self.informational = []  # 1xx header blocks
        self.trailers = []
        self.body = b""
        self.ended = False      # END_STREAM received
        self.reset_code = None  # RST_STREAM's error code, if the stream was reset

    @property
    def status(self):
        v = self.header(":status")
        return int(v) if v is not None else None

    def header(self, name, default=None):
        for k, v in self.headers:
            if k == name.lower():
                return v
        return default

    def header_all(self, name):
        return [v for k, v in self.headers if k == name.lower()]

    @property
    def done(self):
        return self.ended or self.reset_code is not None

    def __repr__(self):
        return "<H2Response stream %d status %r reset %r %r %r>" % (
            self.stream_id, self.status, self.reset_code, self.headers, self.body[:300])


class H2Connection:
    """One HTTP/2 connection to 127.0.0.1:port (or `host`). No threads: every send and wait pumps
    the socket both ways (select), so a large send never deadlocks against a server that writes
    back meanwhile, and a TLS socket is only ever used by one thread."""

    def __init__(self, port, host="127.0.0.1", tls_context=None, server_hostname="localhost",
                 settings=((SETTINGS_INITIAL_WINDOW_SIZE, MAX_WINDOW), (SETTINGS_ENABLE_PUSH, 0)),
                 auto_ack_settings=True, send_preface=True, timeout=10.0, auto_window_update=True):
        sock = socket.create_connection((host, port), timeout=timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.alpn = None
        if tls_context is not None:
            sock = tls_context.wrap_socket(sock, server_hostname=server_hostname)
            self.alpn = sock.selected_alpn_protocol()
        sock.setblocking(False)
        self.sock = sock
        self.tls = tls_context is not None
        self.auto_ack_settings = auto_ack_settings
        self.auto_window_update = auto_window_update  # False: credit only through credit()
        self.frames = []          # every frame received: (type, flags, stream_id, payload)
        self.streams = {}         # stream id -> H2Response
        self.goaway = None        # (last_stream_id, error_code, debug data) of the first GOAWAY
        self.server_settings = {}
        self.settings_acked = 0   # SETTINGS ACKs received
        self.closed = False       # the peer closed (or reset) the connection
        self.pending_settings = 0  # server SETTINGS frames not acknowledged (auto_ack_settings=False)
        self.next_stream_id = 1
        # Flow control of what we send: the connection's window, and each stream's as its
        # difference from the server's SETTINGS_INITIAL_WINDOW_SIZE (which may change later).
        self.send_window = 65535
        self._stream_window_delta = {}
        self.decoder = HpackDecoder()
        self._in = bytearray()
        self._out = bytearray()
        self._header_block = None  # (stream id, type, end stream, bytearray) until END_HEADERS
        if send_preface:
            extra = window_update_frame(0, MAX_WINDOW - 65535) if any(
                k == SETTINGS_INITIAL_WINDOW_SIZE for k, _ in settings) else b""
            self.send(PREFACE + settings_frame(settings) + extra)

    # -- the socket -----------------------------------------------------------------------------

    def _pump(self, deadline):
        """One round: waits (until `deadline` at most) for the socket, writes what is queued,
        reads and handles what came. False once there is nothing more to do (closed)."""
        if self.closed:
            self._out.clear()
            return False
        readable = self.tls and self.sock.pending() > 0
        if not readable:
            left = max(0.0, deadline - time.monotonic())
            r, w, _ = select.select([self.sock], [self.sock] if self._out else [], [], left)
            readable = bool(r)
            if w and self._out:
                try:
                    n = self.sock.send(self._out[:65536])
                    del self._out[:n]
                except (ssl.SSLWantWriteError, ssl.SSLWantReadError, BlockingIOError, InterruptedError):
                    pass
                except OSError:  # reset, broken pipe
                    self._on_closed()
                    return False
        if readable:
            try:
                data = self.sock.recv(262144)
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError, InterruptedError):
                return True
            except (ssl.SSLEOFError, OSError):
                data = b""
            if not data:
                self._on_closed()
                return False
            self._in += data
            self._parse()
        return True

    def _on_closed(self):
        self.closed = True
        self._out.clear()

    def _parse(self):
        while len(self._in) >= 9:
            length = (self._in[0] << 16) | (self._in[1] << 8) | self._in[2]
            if len(self._in) < 9 + length:
                return
            ftype, flags = self._in[3], self._in[4]
            sid = struct.unpack(">I", self._in[5:9])[0] & 0x7FFFFFFF
            payload = bytes(self._in[9:9 + length])
            del self._in[:9 + length]
            self._on_frame(ftype, flags, sid, payload)

    # -- sending --------------------------------------------------------------------------------

    def send(self, data, timeout=30.0):
        """Sends raw bytes (reading meanwhile); False if the connection is gone first."""
        if self.closed:
            return False
        self._out += data
        deadline = time.monotonic() + timeout
        while self._out:
            if time.monotonic() > deadline:
                raise TimeoutError("could not send %d bytes within %ss" % (len(self._out), timeout))
            if not self._pump(deadline):
                return False
        return True

    def new_stream_id(self):
        sid = self.next_stream_id
        self.next_stream_id += 2
        self.streams.setdefault(sid, H2Response(sid))
        return sid

    def request_frames(self, method, path, headers=(), body=None, authority="localhost", scheme="http",
                       stream_id=None, end_stream=True):
        """(stream id, bytes) of a request's HEADERS (+ DATA), not sent. With end_stream=False
        the request stays open (no END_STREAM on its last frame)."""
        sid = stream_id if stream_id is not None else self.new_stream_id()
        fields = [(":method", method), (":scheme", scheme), (":authority", authority), (":path", path)]
        fields += [(k.lower(), v) for k, v in headers]
        if body is not None and not any(k.lower() == "content-length" for k, _ in headers):
            fields.append(("content-length", str(len(body))))
        out = headers_frames(sid, encode_headers(fields), end_stream=end_stream and not body)
        if body:
            body = _as_bytes(body)
            max_frame = DEFAULT_MAX_FRAME
            for i in range(0, len(body), max_frame):
                last = i + max_frame >= len(body)
                out += frame(DATA, END_STREAM if (last and end_stream) else 0, sid, body[i:i + max_frame])
            self._spend(sid, len(body))  # counted as sent: keep such bodies within the windows
        return sid, out

    def request(self, method, path, headers=(), body=None, flow_control=True, end_stream=True, **kw):
        """Sends a request; its stream id. The body goes as the server's flow-control windows
        allow (see send_body); request_frames sends it blindly."""
        body = _as_bytes(body) if body is not None else None
        if not flow_control or not body:
            sid, data = self.request_frames(method, path, headers, body, end_stream=end_stream, **kw)
            self.send(data)
            return sid
        if not any(k.lower() == "content-length" for k, _ in headers):
            headers = list(headers) + [("content-length", str(len(body)))]
        sid, data = self.request_frames(method, path, headers, None, end_stream=False, **kw)
        self.send(data)
        self.send_body(sid, body, end_stream=end_stream)
        return sid

    def stream_send_window(self, sid):
        initial = self.server_settings.get(SETTINGS_INITIAL_WINDOW_SIZE, 65535)
        return initial + self._stream_window_delta.get(sid, 0)

    def _spend(self, sid, n):
        self.send_window -= n
        self._stream_window_delta[sid] = self._stream_window_delta.get(sid, 0) - n

    def send_body(self, sid, body, end_stream=True, timeout=30.0):
        """Sends DATA on a stream within the server's flow-control windows, waiting for credit.
        A complete response before the whole body does not stop it (RFC 9113 §8.1: the server
        says so with RST_STREAM). False if the stream was reset, or the connection closed,
        before all was sent."""
        body = memoryview(_as_bytes(body))
        stream = self._stream(sid)
        deadline = time.monotonic() + timeout
        while True:
            if not body:
                return self.send(frame(DATA, END_STREAM if end_stream else 0, sid, b"")) if end_stream else True
            self.wait(lambda: stream.reset_code is not None or (self.send_window > 0 and self.stream_send_window(sid) > 0),
                      max(0.0, deadline - time.monotonic()))
            if stream.reset_code is not None or self.closed:
                return False
            room = min(self.send_window, self.stream_send_window(sid), DEFAULT_MAX_FRAME)
            if room <= 0:
                raise TimeoutError("no flow-control credit for stream %d within %ss (connection window %d, "
                                   "stream window %d)" % (sid, timeout, self.send_window,
                                                          self.stream_send_window(sid)))
            chunk, body = body[:room], body[room:]
            self._spend(sid, len(chunk))
            if not self.send(frame(DATA, END_STREAM if (end_stream and not body) else 0, sid, bytes(chunk))):
                return False
            if not body:
                return True

    def rst(self, stream_id, code=CANCEL):
        return self.send(rst_stream_frame(stream_id, code))

    def credit(self, stream_id, n):
        """WINDOW_UPDATE of n bytes for the stream and the connection (auto_window_update=False)."""
        return self.send(window_update_frame(stream_id, n) + window_update_frame(0, n))

    def ack_settings(self):
        """Acknowledges the server's SETTINGS frames received so far (auto_ack_settings=False)."""
        n, self.pending_settings = self.pending_settings, 0
        return self.send(settings_frame(ack=True) * n)

    # -- receiving ------------------------------------------------------------------------------

    def _stream(self, sid):
        s = self.streams.get(sid)
        if s is None:
            s = self.streams[sid] = H2Response(sid)
        return s

    def _on_frame(self, ftype, flags, sid, payload):
        self.frames.append((ftype, flags, sid, payload))
        if ftype == SETTINGS and not flags & ACK:
            for i in range(0, len(payload) - 5, 6):
                k, v = struct.unpack(">HI", payload[i:i + 6])
                self.server_settings[k] = v
            if self.auto_ack_settings:
                self._out += settings_frame(ack=True)
            else:
                self.pending_settings += 1
        elif ftype == SETTINGS:
            self.settings_acked += 1
        elif ftype == PING and not flags & ACK:
            self._out += frame(PING, ACK, 0, payload)
        elif ftype == GOAWAY:
            last, code = struct.unpack(">II", payload[:8])
            if self.goaway is None:
                self.goaway = (last & 0x7FFFFFFF, code, payload[8:])
        elif ftype == RST_STREAM:
            self._stream(sid).reset_code = struct.unpack(">I", payload[:4])[0]
        elif ftype == WINDOW_UPDATE:
            inc = struct.unpack(">I", payload[:4])[0] & 0x7FFFFFFF
            if sid == 0:
                self.send_window += inc
            else:
                self._stream_window_delta[sid] = self._stream_window_delta.get(sid, 0) + inc
        elif ftype == DATA:
            data = payload
            if flags & PADDED:
                data = data[1:len(data) - data[0]]
            s = self._stream(sid)
            s.body += data
            if flags & END_STREAM:
                s.ended = True
            if payload and self.auto_window_update:  # the credit back: any number of responses fit
                self._out += window_update_frame(0, len(payload))
                if not flags & END_STREAM:
                    self._out += window_update_frame(sid, len(payload))
        elif ftype in (HEADERS, PUSH_PROMISE):
            block = payload
            if flags & PADDED:
                block = block[1:len(block) - block[0]]
            if ftype == HEADERS and flags & PRIORITY_FLAG:
                block = block[5:]
            if ftype == PUSH_PROMISE:
                block = block[4:]
            self._header_block = (sid, ftype, flags & END_STREAM, bytearray(block))
            if flags & END_HEADERS:
                self._end_header_block()
        elif ftype == CONTINUATION and self._header_block is not None:
            self._header_block[3].extend(payload)
            if flags & END_HEADERS:
                self._end_header_block()

    def _end_header_block(self):
        sid, ftype, end_stream, block = self._header_block
        self._header_block = None
        fields = self.decoder.decode(bytes(block))  # always decoded: the dynamic table must follow
        if ftype != HEADERS:
            return
        s = self._stream(sid)
        status = next((v for k, v in fields if k == ":status"), None)
        if s.headers:
            s.trailers = fields
        elif status is not None and status.startswith("1"):
            s.informational.append(fields)
        else:
            s.headers = fields
        if end_stream:
            s.ended = True

    # -- waiting --------------------------------------------------------------------------------

    def wait(self, predicate, timeout=10.0):
        """Pumps the socket until predicate() is true, the peer closed, or the timeout; its value."""
        deadline = time.monotonic() + timeout
        while True:
            v = predicate()
            if v or self.closed or time.monotonic() >= deadline:
                return v
            self._pump(min(deadline, time.monotonic() + 0.2))

    def response(self, stream_id, timeout=10.0):
        """The stream once it ended or was reset (or the connection closed, or the timeout)."""
        self.wait(lambda: self.streams[stream_id].done, timeout)
        return self.streams[stream_id]

    def wait_goaway(self, timeout=10.0):
        self.wait(lambda: self.goaway is not None, timeout)
        return self.goaway

    def wait_closed(self, timeout=10.0):
        """True once the peer closed the connection."""
        self.wait(lambda: False, timeout)
        return self.closed

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _self_test():
    # RFC 7541 C.4.1-C.4.3: requests with Huffman coding, one decoder (the dynamic table carries over).
    d = HpackDecoder()
    assert d.decode(bytes.fromhex("828684418cf1e3c2e5f23a6ba0ab90f4ff")) == [
        (":method", "GET"), (":scheme", "http"), (":path", "/"), (":authority", "www.example.com")]
    assert d.decode(bytes.fromhex("828684be5886a8eb10649cbf")) == [
        (":method", "GET"), (":scheme", "http"), (":path", "/"), (":authority", "www.example.com"),
        ("cache-control", "no-cache")]
    assert d.decode(bytes.fromhex("828785bf408825a849e95ba97d7f8925a849e95bb8e8b4bf")) == [
        (":method", "GET"), (":scheme", "https"), (":path", "/index.html"), (":authority", "www.example.com"),
        ("custom-key", "custom-value")]
    # C.6.1: a response with Huffman coding, a 256-byte table.
    d = HpackDecoder(256)
    assert d.decode(bytes.fromhex(
        "488264025885aec3771a4b6196d07abe941054d444a8200595040b8166e082a62d1bff6e919d29ad171863c78f0b97c8e9ae82ae43d3"
    )) == [(":status", "302"), ("cache-control", "private"), ("date", "Mon, 21 Oct 2013 20:13:21 GMT"),
           ("location", "https://www.example.com")]
    # Our own encoding decodes back.
    fields = [(":path", "/x"), ("x-big", "v" * 300)]
    assert HpackDecoder().decode(encode_headers(fields)) == fields
    print("h2_raw: HPACK self-test passed")


if __name__ == "__main__":
    _self_test()
