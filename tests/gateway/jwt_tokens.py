"""Keys and bearer tokens for the JWT tenant tests, made with the openssl command and the Python
standard library only: the tokens must not come from the library the gateway verifies them with
(libjose), nor from a Python JWT library.

    keys = KeyPair.rsa(workdir, "rsa-1")       # or KeyPair.ec(workdir, "ec-1")
    token = keys.sign({"alg": "RS256", "kid": "rsa-1"}, {"sub": "alice", "exp": ...})
    write_jwks(path, [keys.jwk(), ...])
    hs256({"alg": "HS256"}, claims, b"secret")
"""

import base64
import hashlib
import hmac
import json
import os
import subprocess
import time


def b64url(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _json(obj):
    return json.dumps(obj, separators=(",", ":")).encode()


def signing_input(header, claims):
    h = header if isinstance(header, bytes) else _json(header)
    c = claims if isinstance(claims, bytes) else _json(claims)
    return (b64url(h) + "." + b64url(c)).encode("ascii")


def hs256(header, claims, secret):
    data = signing_input(header, claims)
    return data.decode() + "." + b64url(hmac.new(secret, data, hashlib.sha256).digest())


def unsigned(header, claims, signature=b""):
    return signing_input(header, claims).decode() + "." + b64url(signature)


def claims(sub, ttl=600, now=None, **extra):
    """The claims the tests' [tenant] checks: iss, sub, aud and exp `ttl` seconds from now."""
    now = int(time.time()) if now is None else now
    out = {"iss": "https://auth.example", "sub": sub, "aud": "payments-api", "iat": now, "exp": now + ttl}
    out.update(extra)
    return out


def write_jwks(path, jwks):
    with open(path, "w") as f:
        json.dump({"keys": jwks}, f)


# -- DER, just enough for SubjectPublicKeyInfo and ECDSA-Sig-Value -----------------------------


def _der(data, pos):
    """(tag, content, next position) of the DER element at `pos`."""
    tag = data[pos]
    length = data[pos + 1]
    pos += 2
    if length & 0x80:
        n = length & 0x7F
        length = int.from_bytes(data[pos:pos + n], "big")
        pos += n
    return tag, data[pos:pos + length], pos + length


def _der_children(content):
    out, pos = [], 0
    while pos < len(content):
        tag, value, pos = _der(content, pos)
        out.append((tag, value))
    return out


def _unsigned_int(value):
    return value.lstrip(b"\x00") or b"\x00"


class KeyPair:
    """A private key made by `openssl genpkey`, its public PEM and JWK, and signing with it."""

    def __init__(self, workdir, name, kind, kid, genpkey_args):
        self.kind = kind  # "RSA" or "EC"
        self.kid = kid
        self.private_path = os.path.join(workdir, name + ".key.pem")
        self.public_path = os.path.join(workdir, name + ".pub.pem")
        subprocess.run(["openssl", "genpkey", "-out", self.private_path] + genpkey_args, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.chmod(self.private_path, 0o600)
        subprocess.run(["openssl", "pkey", "-in", self.private_path, "-pubout", "-out", self.public_path], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with open(self.public_path, "rb") as f:
            self.public_pem = f.read()
        self.public_der = subprocess.run(["openssl", "pkey", "-pubin", "-in", self.public_path, "-outform", "DER"],
                                         check=True, stdout=subprocess.PIPE).stdout

    @classmethod
    def rsa(cls, workdir, kid, name=None):
        return cls(workdir, name or kid, "RSA", kid, ["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"])

    @classmethod
    def ec(cls, workdir, kid, name=None):
        return cls(workdir, name or kid, "EC", kid, ["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"])

    def jwk(self, kid=None):
        """The public key as a JWK, read from the DER of its SubjectPublicKeyInfo."""
        _, spki, _ = _der(self.public_der, 0)
        (_, _algorithm), (_, bits) = _der_children(spki)
        key = bits[1:]  # the BIT STRING's unused-bits byte
        if self.kind == "RSA":
            _, rsa, _ = _der(key, 0)
            (_, n), (_, e) = _der_children(rsa)
            out = {"kty": "RSA", "n": b64url(_unsigned_int(n)), "e": b64url(_unsigned_int(e))}
        else:
            assert key[0] == 4 and len(key) == 65, "expected an uncompressed P-256 point"
            out = {"kty": "EC", "crv": "P-256", "x": b64url(key[1:33]), "y": b64url(key[33:])}
        out["kid"] = kid or self.kid
        return out

    def signature(self, data):
        sig = subprocess.run(["openssl", "dgst", "-sha256", "-sign", self.private_path, "-binary"], input=data,
                             check=True, stdout=subprocess.PIPE).stdout
        if self.kind == "EC":
            # openssl writes ECDSA signatures as DER; JWS wants R || S, 32 bytes each.
            _, seq, _ = _der(sig, 0)
            (_, r), (_, s) = _der_children(seq)
            sig = _unsigned_int(r).rjust(32, b"\x00") + _unsigned_int(s).rjust(32, b"\x00")
        return sig

    def sign(self, header, claims_):
        data = signing_input(header, claims_)
        return data.decode() + "." + b64url(self.signature(data))

    def token(self, sub, ttl=600, kid=None, **extra):
        """A token of this key with the tests' claims, the algorithm the key's type signs."""
        alg = "RS256" if self.kind == "RSA" else "ES256"
        return self.sign({"alg": alg, "typ": "JWT", "kid": kid or self.kid}, claims(sub, ttl, **extra))
