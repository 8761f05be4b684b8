"""`seedq certs`: a private CA plus a learner (server) and an actor (client)
certificate for one cluster, and a random bearer token, with `cryptography`.

Files written to OUT (key files and the token mode 0600):

    ca.pem                    the CA certificate: actors' --tls.ca, the learner's --tls.client-ca
    ca-key.pem                the CA's key (keep it off the cluster; only needed to sign more)
    server.pem, server-key.pem  the learner's --tls.cert / --tls.key (SANs: --hosts)
    client.pem, client-key.pem  the actors' --tls.cert / --tls.key (mutual TLS)
    token                     a random token: --auth.token-file on both sides
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import secrets

from seedq.process import exit_codes

DEFAULT_HOSTS = ("localhost", "127.0.0.1", "::1")


def _name(common_name: str):
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    return x509.Name([
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, "seedq"),
        x509.NameAttribute(NameOID.COMMON_NAME, common_name),
    ])


def _san(host: str):
    from cryptography import x509

    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _new_key():
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def _write(path: str, data: bytes, secret: bool) -> None:
    """Writes a new file that has its final mode before it holds a byte:
    secret files are 0600 from their creation on (an existing file, whose
    mode may be wider, is replaced by rename rather than rewritten)."""
    import tempfile

    mode = 0o600 if secret else 0o644
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", dir=os.path.dirname(os.path.abspath(path)))
    try:
        os.fchmod(fd, mode)  # mkstemp made it 0600; public files widen to 0644 before the write
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _pem_key(key) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _pem_cert(cert) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return cert.public_bytes(serialization.Encoding.PEM)


def _certificate(subject, issuer, public_key, signing_key, days: int, *, ca: bool = False,
                 hosts=(), usage=None):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes

    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))  # tolerate small clock skew
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=0 if ca else None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                          content_commitment=False, key_encipherment=False, data_encipherment=False,
                          key_agreement=False, encipher_only=False, decipher_only=False),
            critical=True,
        )
    else:
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if hosts:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([_san(h) for h in hosts]), critical=False
        )
    return builder.sign(signing_key, hashes.SHA256())


# Every file `make` writes, the CA's key first: the one that cannot be made again.
FILES = ("ca-key.pem", "ca.pem", "server.pem", "server-key.pem", "client.pem", "client-key.pem", "token")


def make(out: str, hosts=DEFAULT_HOSTS, days: int = 365, *, replace: bool = False) -> dict[str, str]:
    """Writes the files listed in the module docstring to `out`; returns {name: path}.
    A cluster's credentials already in `out` (a CA key above all: every
    certificate it signed stops being trusted without it) are replaced only
    with `replace`; UsageError (one line) otherwise, before anything is written."""
    from cryptography.x509.oid import ExtendedKeyUsageOID

    hosts = tuple(h.strip() for h in hosts if h.strip())
    if not hosts:
        raise exit_codes.UsageError("--hosts: give at least one name or address the learner is dialled by")
    if days <= 0:
        raise exit_codes.UsageError(f"--days {days}: must be > 0")
    existing = [name for name in FILES if os.path.lexists(os.path.join(out, name))]
    if existing and not replace:
        raise exit_codes.UsageError(
            f"--out {out} already holds {', '.join(existing)}: a new CA would make every certificate the "
            "old one signed untrusted; give another --out, or --replace to replace them"
        )
    os.makedirs(out, exist_ok=True)
    ca_key = _new_key()
    ca_name = _name("seedq cluster CA")
    ca_cert = _certificate(ca_name, ca_name, ca_key.public_key(), ca_key, days, ca=True)
    server_key, client_key = _new_key(), _new_key()
    server_cert = _certificate(_name(hosts[0]), ca_name, server_key.public_key(), ca_key, days,
                               hosts=hosts, usage=ExtendedKeyUsageOID.SERVER_AUTH)
    client_cert = _certificate(_name("seedq actor"), ca_name, client_key.public_key(), ca_key, days,
                               usage=ExtendedKeyUsageOID.CLIENT_AUTH)
    files = {
        "ca.pem": (_pem_cert(ca_cert), False),
        "ca-key.pem": (_pem_key(ca_key), True),
        "server.pem": (_pem_cert(server_cert), False),
        "server-key.pem": (_pem_key(server_key), True),
        "client.pem": (_pem_cert(client_cert), False),
        "client-key.pem": (_pem_key(client_key), True),
        "token": ((secrets.token_urlsafe(32) + "\n").encode(), True),
    }
    paths = {}
    for name in FILES:
        data, secret = files[name]
        paths[name] = os.path.join(out, name)
        _write(paths[name], data, secret)
    return paths
