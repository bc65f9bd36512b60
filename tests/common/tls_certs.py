"""A test certificate authority made with the openssl command at test time (Python 3 stdlib only).

make_test_pki(directory) writes, and returns the paths of (a dict, each entry a (cert, key) pair of
PEM files unless noted):
    ca                 the test CA (cert only is what clients trust: pki["ca"][0])
    server             CN=localhost, SAN DNS:localhost, IP:127.0.0.1, IP:::1 (serverAuth)
    upstream           the same names, another key: the gateway's upstream
    client_a           CN=payments-a, SAN URI:spiffe://idem.test/payments-a (clientAuth)
    client_a_renewed   the same identity as client_a, a new key and serial (a renewal)
    client_b           CN=payments-b, SAN URI:spiffe://idem.test/payments-b
    expired            like server, valid 2020-01-01 to 2020-01-02
    wrong_host         CN=other.example, SAN DNS:other.example only
    unknown_ca         like server, signed by another CA nobody trusts
    server_next        like server, another key: a rotation's new certificate
    encrypted_key      like server, its key encrypted with the passphrase in pki["passphrase"]
Keys are mode 0600, as the gateway requires of a private key file.
"""

import os
import subprocess

_SERVER_NAMES = "subjectAltName=DNS:localhost,IP:127.0.0.1,IP:::1"
PASSPHRASE = "Zq9xW-test-passphrase"


def _openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _key(directory, name, passphrase=None):
    path = os.path.join(directory, name + ".key")
    args = ["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", path]
    if passphrase:
        args += ["-aes-256-cbc", "-pass", "pass:" + passphrase]
    _openssl(*args, cwd=directory)
    os.chmod(path, 0o600)
    return path


def _ca(directory, name, subject):
    key = _key(directory, name)
    cert = os.path.join(directory, name + ".pem")
    _openssl("req", "-x509", "-new", "-key", key, "-sha256", "-days", "30", "-subj", subject, "-out", cert,
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
             cwd=directory)
    return cert, key


def _leaf(directory, name, ca, subject, extensions, *, passphrase=None, expired=False):
    key = _key(directory, name, passphrase)
    csr = os.path.join(directory, name + ".csr")
    cert = os.path.join(directory, name + ".pem")
    req = ["req", "-new", "-key", key, "-subj", subject, "-out", csr]
    if passphrase:
        req += ["-passin", "pass:" + passphrase]
    _openssl(*req, cwd=directory)
    ext = os.path.join(directory, name + ".ext")
    with open(ext, "w") as f:
        f.write("\n".join(extensions) + "\n")
    if not expired:
        _openssl("x509", "-req", "-in", csr, "-CA", ca[0], "-CAkey", ca[1], "-set_serial", str(_serial(name)),
                 "-sha256", "-days", "30", "-extfile", ext, "-out", cert, cwd=directory)
        return cert, key
    # `openssl x509` cannot date a certificate in the past; `openssl ca` can.
    db = os.path.join(directory, "ca-db")
    os.makedirs(db, exist_ok=True)
    open(os.path.join(db, "index.txt"), "w").close()
    with open(os.path.join(db, "serial"), "w") as f:
        f.write("1000\n")
    conf = os.path.join(directory, "ca.cnf")
    with open(conf, "w") as f:
        f.write("[ca]\ndefault_ca=test\n[test]\ndir=%s\ndatabase=$dir/index.txt\nserial=$dir/serial\n"
                "new_certs_dir=$dir\ndefault_md=sha256\npolicy=anything\ncopy_extensions=none\n"
                "[anything]\ncommonName=supplied\n[ext]\n%s\n" % (db, "\n".join(extensions)))
    _openssl("ca", "-batch", "-config", conf, "-cert", ca[0], "-keyfile", ca[1], "-in", csr, "-out", cert,
             "-startdate", "20200101000000Z", "-enddate", "20200102000000Z", "-extensions", "ext", "-notext",
             cwd=directory)
    return cert, key


_SERIALS = {}


def _serial(name):
    return _SERIALS.setdefault(name, 0x1000 + len(_SERIALS))


def make_test_pki(directory):
    directory = os.path.abspath(directory)
    os.makedirs(directory, exist_ok=True)
    server_ext = [_SERVER_NAMES, "extendedKeyUsage=serverAuth", "keyUsage=critical,digitalSignature"]

    def client_ext(name):
        return ["subjectAltName=URI:spiffe://idem.test/" + name, "extendedKeyUsage=clientAuth",
                "keyUsage=critical,digitalSignature"]

    ca = _ca(directory, "ca", "/CN=idem test CA")
    other_ca = _ca(directory, "other-ca", "/CN=someone else's CA")
    pki = {
        "ca": ca,
        "server": _leaf(directory, "server", ca, "/CN=localhost", server_ext),
        "upstream": _leaf(directory, "upstream", ca, "/CN=localhost", server_ext),
        "server_next": _leaf(directory, "server-next", ca, "/CN=localhost", server_ext),
        "client_a": _leaf(directory, "client-a", ca, "/O=idem test/CN=payments-a", client_ext("payments-a")),
        "client_a_renewed": _leaf(directory, "client-a-renewed", ca, "/O=idem test/CN=payments-a",
                                  client_ext("payments-a")),
        "client_b": _leaf(directory, "client-b", ca, "/O=idem test/CN=payments-b", client_ext("payments-b")),
        "expired": _leaf(directory, "expired", ca, "/CN=localhost", server_ext, expired=True),
        "wrong_host": _leaf(directory, "wrong-host", ca, "/CN=other.example",
                            ["subjectAltName=DNS:other.example", "extendedKeyUsage=serverAuth"]),
        "unknown_ca": _leaf(directory, "unknown-ca", other_ca, "/CN=localhost", server_ext),
        "encrypted_key": _leaf(directory, "encrypted-key", ca, "/CN=localhost", server_ext, passphrase=PASSPHRASE),
        "passphrase": PASSPHRASE,
    }
    return pki


if __name__ == "__main__":
    import sys
    import tempfile
    out = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="idem-pki.")
    for name, value in make_test_pki(out).items():
        print(name, value if name != "passphrase" else "(set)")
