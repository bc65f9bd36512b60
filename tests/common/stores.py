"""Stores of one test's own, which it may kill and start again (Python 3 standard library only).

PrivatePostgres: a PostgreSQL server (the binaries servers.sh found: IDEM_TEST_POSTGRES_BIN) in a
directory of its own, on a free loopback port, with its defaults for durability (fsync on,
synchronous_commit on: an answered commit is on disk). kill() SIGKILLs the postmaster and every
backend at once, as an OOM kill of its cgroup or a lost machine would stop them (no shutdown
checkpoint); start() brings it back on the same port and data, through crash recovery from its WAL.
The shared server (IDEM_TEST_POSTGRES_URL) keeps serving the other tests meanwhile.

Redis: brokers.PrivateRedis (AOF, fsync always), whose kill() SIGKILLs it.
"""
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time

from brokers import env, free_port


class PrivatePostgres:
    def __init__(self, name="store"):
        self.bin = env("IDEM_TEST_POSTGRES_BIN")
        # Its own directory under the temporary one, readable by the postgres user (initdb and
        # postgres refuse to run as root: as root, they run as that user).
        self.dir = tempfile.mkdtemp(prefix="idem-pg-%s-" % name)
        os.chmod(self.dir, 0o755)
        self.user = None
        if os.geteuid() == 0:
            self.user = pwd.getpwnam("postgres")
            os.chown(self.dir, self.user.pw_uid, self.user.pw_gid)
        self.data = os.path.join(self.dir, "data")
        self.log_path = os.path.join(self.dir, "server.log")
        self.port = free_port()
        self.proc = None
        self.kills = 0
        out = self._run([os.path.join(self.bin, "initdb"), "-D", self.data, "-A", "trust", "-U", "idem", "-E", "UTF8",
                         "--locale=C", "--no-sync"])
        if out.returncode != 0:
            raise RuntimeError("initdb failed: %s" % out.stdout[-2000:])
        self.start()

    @property
    def url(self):
        return "postgres://idem@127.0.0.1:%d/postgres?sslmode=disable" % self.port

    def _as_postgres(self):
        return {"user": self.user.pw_uid, "group": self.user.pw_gid, "extra_groups": []} if self.user else {}

    def _run(self, argv):
        return subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120,
                              cwd=self.dir, **self._as_postgres())

    def start(self, timeout=60):
        """Starts the server (crash recovery first, after a kill) and waits until it accepts
        connections."""
        log = open(self.log_path, "ab")
        # A session of its own: kill() reaches the postmaster and all its backends with one signal.
        self.proc = subprocess.Popen(
            [os.path.join(self.bin, "postgres"), "-D", self.data, "-p", str(self.port), "-k", self.dir,
             "-c", "listen_addresses=127.0.0.1", "-c", "max_connections=100", "-c", "fsync=on",
             "-c", "synchronous_commit=on"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=self.dir, start_new_session=True,
            **self._as_postgres())
        log.close()
        deadline = time.time() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError("postgres exited (%d): %s" % (self.proc.returncode, self.log()[-2000:]))
            ready = subprocess.run([os.path.join(self.bin, "pg_isready"), "-q", "-h", "127.0.0.1", "-p",
                                    str(self.port)], timeout=30)
            if ready.returncode == 0:
                return
            if time.time() > deadline:
                raise RuntimeError("postgres did not come up: %s" % self.log()[-2000:])
            time.sleep(0.05)

    def kill(self):
        """SIGKILL to the postmaster and every backend at once; returns when all are gone."""
        pgid = self.proc.pid
        os.killpg(pgid, signal.SIGKILL)
        self.proc.wait()
        self.kills += 1
        # Backends are reparented when the postmaster dies: wait until the group is empty, or the
        # next postmaster finds their shared memory still attached and refuses to start.
        deadline = time.time() + 30
        while True:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            if time.time() > deadline:
                raise RuntimeError("postgres processes outlived SIGKILL")
            time.sleep(0.02)

    def sql(self, query):
        """Runs `query` with psql; its rows, each a list of fields (unaligned, tab-separated)."""
        out = subprocess.run([os.path.join(self.bin, "psql"), "-X", "-q", "-A", "-t", "-F", "\t", "-v",
                              "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p", str(self.port), "-U", "idem", "-d",
                              "postgres", "-c", query], capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            raise RuntimeError("psql %r: %s" % (query, out.stderr.strip()))
        return [line.split("\t") for line in out.stdout.splitlines() if line]

    def log(self):
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # fast shutdown
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def read_servers_env(path):
    """The variables of the env file scripts/lib/servers.sh writes (its `export A=... B=...` lines,
    values possibly single-quoted), as a dict."""
    env = {}
    with open(path) as f:
        for line in f:
            if line.startswith("export "):
                for part in line[7:].strip().split(" "):
                    k, _, v = part.partition("=")
                    env[k] = v.strip("'")
    return env
