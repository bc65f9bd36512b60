#!/usr/bin/env python3
"""idem-gateway's PostgreSQL hop over TLS (issue 39): libpq's sslmode in the store URL.

    python3 test_store_tls.py --gateway PATH --upstream-bin PATH --store postgres

Against the shared PostgreSQL of scripts/test (scripts/lib/servers.sh), which accepts TLS with the
test CA's server certificate (tests/common/tls_certs.py, DIR/pki):
- IDEM_TEST_POSTGRES_TLS_URL (sslmode=verify-full, sslrootcert = the test CA, host localhost):
  claims, replays and a mismatch through the gateway; every connection of the gateway's store is
  TLS in pg_stat_ssl (found by an application_name of the test's own, set in the URL), and the
  record is in the server's table;
- IDEM_TEST_POSTGRES_CLIENT_CERT_URL (plus sslcert/sslkey, role payments-a, which pg_hba admits by
  its client certificate alone): the same, and the server saw the certificate's subject;
- refusals at start-up, each exit 1 with one line saying why, the URL's password never printed:
  verify-full against another CA, against a host name the certificate does not name, and the
  client-certificate role without its certificate.
"""

import os
import subprocess
import sys
import urllib.parse
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import GatewayTestCase, free_port, new_key  # noqa: E402

CONFIG = """
[[route]]
method = "POST"
path = "/echo"
"""

PASSWORD = "pg-Tls-s3cret/%s" % uuid.uuid4().hex[:8]  # the server trusts idem; libpq holds it anyway


def env(name):
    value = os.environ.get(name)
    if not value:
        raise RuntimeError("%s is not set: run through scripts/test, which starts the servers "
                           "(scripts/lib/servers.sh)" % name)
    return value


def with_params(url, **params):
    """The URL with these query parameters added (libpq's, passed through by the store)."""
    return url + "&" + urllib.parse.urlencode(params)


def with_password(url, password=PASSWORD):
    parts = urllib.parse.urlsplit(url)
    user, host = parts.netloc.split("@", 1)
    return urllib.parse.urlunsplit(parts._replace(netloc="%s:%s@%s" % (user, urllib.parse.quote(password, safe=""), host)))


def psql(sql, db=None):
    """One query over the plain admin URL (superuser idem), in its database or `db`; rows as lists
    of fields."""
    url = env("IDEM_TEST_POSTGRES_URL")
    if db:
        url = urllib.parse.urlunsplit(urllib.parse.urlsplit(url)._replace(path="/" + db))
    out = subprocess.run(["psql", url, "-X", "-Atq", "-F", "|", "-v", "ON_ERROR_STOP=1",
                          "-c", sql], capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        raise RuntimeError("psql: %s" % out.stderr)
    return [line.split("|") for line in out.stdout.splitlines()]


class PostgresOverTls(GatewayTestCase):

    CONFIG = None

    @classmethod
    def start_class_processes(cls):
        cls.app = "idem-tls-test-%s" % uuid.uuid4().hex[:8]
        cls.url = with_params(env("IDEM_TEST_POSTGRES_TLS_URL"), application_name=cls.app)
        cls.gw = cls.start_gateway(CONFIG, store=cls.url)
        cls.cert_app = "idem-tls-cert-%s" % uuid.uuid4().hex[:8]
        cls.cert_url = with_params(env("IDEM_TEST_POSTGRES_CLIENT_CERT_URL"), application_name=cls.cert_app)
        cls.cert_gw = cls.start_gateway(CONFIG, store=cls.cert_url)

    def claim_replay_mismatch(self, gw):
        key = new_key("pg-tls")
        first = gw.request("POST", "/echo", '{"amount": 100}', key=key)
        self.assertExecuted(first)
        self.assertReplayOf(gw.request("POST", "/echo", '{"amount": 100}', key=key), first)
        self.assertProblem(gw.request("POST", "/echo", '{"amount": 999}', key=key), 422, "idempotency_key_mismatch")
        self.assertEqual(self.upstream.executions(key), 1)
        return key

    def store_connections(self, app):
        """(ssl, version, user, client_dn) of every server connection with this application_name."""
        return psql("SELECT s.ssl, coalesce(s.version, ''), a.usename, coalesce(s.client_dn, '') "
                    "FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) "
                    "WHERE a.application_name = '%s' ORDER BY a.pid" % app)

    def test_verify_full_claims_and_replays_over_tls(self):
        key = self.claim_replay_mismatch(self.gw)
        conns = self.store_connections(self.app)
        self.assertGreaterEqual(len(conns), 1, "no connection of the gateway's store in pg_stat_activity")
        for ssl, version, user, _ in conns:
            self.assertEqual(ssl, "t", conns)
            self.assertIn(version, ("TLSv1.2", "TLSv1.3"), conns)
            self.assertEqual(user, "idem", conns)
        # The record the replay came from is in the server's table, completed.
        self.assertEqual(psql("SELECT state FROM public.idempotency_keys WHERE key = '%s'" % key), [["completed"]])
        # The plain URL the other tests use stays plain.
        self.assertEqual(psql("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()"), [["f"]])

    def test_client_certificate_is_the_login(self):
        key = self.claim_replay_mismatch(self.cert_gw)
        conns = self.store_connections(self.cert_app)
        self.assertGreaterEqual(len(conns), 1, "no connection of the gateway's store in pg_stat_activity")
        for ssl, _, user, client_dn in conns:
            self.assertEqual((ssl, user, client_dn), ("t", "payments-a", "/O=idem test/CN=payments-a"), conns)
        # In the role's own database, in a table the role created.
        self.assertEqual(psql("SELECT state, tableowner FROM public.idempotency_keys, pg_tables "
                              "WHERE key = '%s' AND schemaname = 'public' AND tablename = 'idempotency_keys'" % key,
                              db=urllib.parse.urlsplit(self.cert_url).path.lstrip("/")),
                         [["completed", "payments-a"]])

    def refused(self, url, reason):
        """A gateway start with this store URL: exit 1, one line naming the store and `reason`,
        the password nowhere."""
        url = with_password(url)
        out = subprocess.run([harness.ARGS.gateway, "--listen", "127.0.0.1:%d" % free_port(), "--admin-listen", "off",
                              "--upstream", self.upstream.url, "--store", url],
                             capture_output=True, text=True, timeout=60)
        text = out.stdout + out.stderr
        self.assertEqual(out.returncode, 1, text)
        lines = [line for line in out.stderr.splitlines() if line.startswith("idem-gateway: store ")]
        self.assertEqual(len(lines), 1, text)
        self.assertIn(reason, lines[0], text)
        self.assertIn("postgres://idem:***@" if "payments-a" not in url else "postgres://payments-a:***@", lines[0])
        for secret in (PASSWORD, urllib.parse.quote(PASSWORD, safe="")):
            self.assertNotIn(secret, text)
        return lines[0]

    def test_verify_full_refuses_a_server_from_another_ca(self):
        pki = env("IDEM_TEST_TLS_DIR")
        url = env("IDEM_TEST_POSTGRES_TLS_URL").replace(
            "sslrootcert=" + os.path.join(pki, "ca.pem"), "sslrootcert=" + os.path.join(pki, "other-ca.pem"))
        self.assertIn("other-ca.pem", url)
        self.refused(url, "certificate verify failed")

    def test_verify_full_refuses_a_certificate_for_another_host_name(self):
        # The same server at 127.0.0.1 (hostaddr), asked for as db.other.example: the certificate
        # names localhost, 127.0.0.1 and ::1 only.
        url = with_params(env("IDEM_TEST_POSTGRES_TLS_URL").replace("@localhost:", "@db.other.example:"),
                          hostaddr="127.0.0.1")
        self.assertIn("@db.other.example:", url)
        self.refused(url, 'does not match host name "db.other.example"')

    def test_the_client_certificate_role_without_its_certificate_is_refused(self):
        url = env("IDEM_TEST_POSTGRES_CLIENT_CERT_URL").split("&sslcert=")[0]
        self.refused(url, "connection requires a valid client certificate")


if __name__ == "__main__":
    harness.main()
