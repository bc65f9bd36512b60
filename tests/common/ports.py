"""Free loopback ports for the test processes.

The kernel gives a port that is free at the moment of asking; ask twice before either is bound
and it may give the same one twice (it did: a relay's admin port and its notifier's webhook got
one port, and the relay could never start again). free_port() never hands out a port twice in
one process. Another process may still take a port before it is bound: callers that bind later
retry or check, as before.
"""
import socket
import threading

_given = set()
_lock = threading.Lock()


def free_port():
    """A loopback port that was free a moment ago and that this process has not handed out."""
    with _lock:
        while True:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            if port not in _given:
                _given.add(port)
                return port
