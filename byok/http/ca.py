"""byok's local certificate authority, for the HTTPS proxy and the LAN mode's listeners.

Generated once into ``<data_dir>/ca/``: ``byok-ca.pem`` (the certificate the user trusts) and
``byok-ca.key`` (mode 0600, in a 0700 directory; it never leaves the machine). Leaf certificates
for intercepted hosts are issued in memory on first use, all sharing one in-memory key, valid
for ``LEAF_DAYS`` (under the 398-day limit macOS enforces even for user-trusted roots) and
re-issued before they expire.

ECDSA P-256 throughout: fast to generate, and accepted by every TLS stack Cursor runs on.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import ssl
import tempfile
from pathlib import Path

import attrs
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_DIR = "ca"
CA_CERT = "byok-ca.pem"
CA_KEY = "byok-ca.key"
CA_DAYS = 3650
LEAF_DAYS = 90
# Re-issue a cached leaf once less than this is left.
LEAF_RENEW = dt.timedelta(days=7)
# Tolerate a client clock a little behind ours.
BACKDATE = dt.timedelta(hours=1)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _write_private(path: Path, data: bytes) -> None:
    """Create ``path`` with mode 0600 from the start (no window where it is world-readable)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.chmod(path, 0o600)  # in case the umask or the platform ignored the mode


def _host_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host.strip("[]")))
    except ValueError:
        return x509.DNSName(host)


@attrs.define
class _Leaf:
    context: ssl.SSLContext
    not_after: dt.datetime


class LocalCA:
    """The CA: its certificate, its key, and a cache of per-host server TLS contexts."""

    def __init__(self, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey, cert_path: Path) -> None:
        self.cert = cert
        self.key = key
        self.cert_path = cert_path
        self._leaf_key = ec.generate_private_key(ec.SECP256R1())
        self._leaves: dict[tuple[tuple[str, ...], tuple[str, ...]], _Leaf] = {}

    # --- creation -----------------------------------------------------------------------
    @classmethod
    def load_or_create(cls, data_dir: Path) -> LocalCA:
        """Load ``<data_dir>/ca/``, generating the CA there the first time."""
        ca_dir = Path(data_dir).expanduser() / CA_DIR
        cert_path, key_path = ca_dir / CA_CERT, ca_dir / CA_KEY
        if not key_path.exists() or not cert_path.exists():
            ca_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            os.chmod(ca_dir, 0o700)
            cert_path.unlink(missing_ok=True)
            key_path.unlink(missing_ok=True)
            key = ec.generate_private_key(ec.SECP256R1())
            cert = _make_ca_cert(key)
            _write_private(
                key_path,
                key.private_bytes(
                    serialization.Encoding.PEM,
                    serialization.PrivateFormat.PKCS8,
                    serialization.NoEncryption(),
                ),
            )
            cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
            os.chmod(cert_path, 0o644)
        if key_path.stat().st_mode & 0o077:
            os.chmod(key_path, 0o600)  # tighten a key someone loosened
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ValueError(f"{key_path}: not an EC private key")
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        return cls(cert, key, cert_path)

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    # --- leaves ---------------------------------------------------------------------------
    def issue_leaf(self, host: str, *more: str, now: dt.datetime | None = None) -> x509.Certificate:
        """A server certificate for ``host`` and ``more`` (DNS names or IP literals), signed by
        the CA."""
        now = now or _now()
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)] if 0 < len(host) <= 64 else [])
        return (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(self.cert.subject)
            .public_key(self._leaf_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - BACKDATE)
            .not_valid_after(now + dt.timedelta(days=LEAF_DAYS))
            .add_extension(
                x509.SubjectAlternativeName([_host_name(h) for h in (host, *more)]), critical=False
            )
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=False,
                    crl_sign=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()), critical=False
            )
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(self._leaf_key.public_key()), critical=False
            )
            .sign(self.key, hashes.SHA256())
        )

    def server_context(self, host: str, *, alpn: tuple[str, ...] = ("h2", "http/1.1")) -> ssl.SSLContext:
        """A server-side TLS context presenting a leaf for ``host``; cached per host."""
        return self._context((host.lower().rstrip("."),), alpn)

    def listener_context(
        self, names: tuple[str, ...], *, alpn: tuple[str, ...] = ("h2", "http/1.1")
    ) -> ssl.SSLContext:
        """A listener's TLS context: one leaf for all of ``names`` (LAN mode, ``tls_names``). A
        listener keeps its context for the daemon's life; each handshake (with SNI or without)
        moves to a re-issued leaf once this one is within LEAF_RENEW of expiring."""
        key = tuple(n.lower().rstrip(".") for n in names)

        def renew(
            sock: ssl.SSLObject | ssl.SSLSocket, _server_name: str | None, current: ssl.SSLContext
        ) -> None:
            fresh = self._context(key, alpn, renew)
            if fresh is not current:
                sock.context = fresh

        return self._context(key, alpn, renew)

    def _context(
        self, names: tuple[str, ...], alpn: tuple[str, ...], sni: object | None = None
    ) -> ssl.SSLContext:
        cache_key = (names, alpn)
        leaf = self._leaves.get(cache_key)
        if leaf is not None and leaf.not_after - _now() > LEAF_RENEW:
            return leaf.context
        cert = self.issue_leaf(*names)
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        if alpn:
            ctx.set_alpn_protocols(list(alpn))
        if sni is not None:
            ctx.sni_callback = sni  # type: ignore[assignment]
        _load_chain(ctx, cert, self.cert, self._leaf_key)
        self._leaves[cache_key] = _Leaf(ctx, cert.not_valid_after_utc)
        return ctx


def _load_chain(
    ctx: ssl.SSLContext, leaf: x509.Certificate, ca: x509.Certificate, key: ec.EllipticCurvePrivateKey
) -> None:
    # The ssl module only loads chains from files: a private temp dir, removed right away.
    pem = leaf.public_bytes(serialization.Encoding.PEM) + ca.public_bytes(serialization.Encoding.PEM)
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    with tempfile.TemporaryDirectory(prefix="byok-leaf-") as tmp:
        chain_path, key_path = Path(tmp) / "chain.pem", Path(tmp) / "key.pem"
        chain_path.write_bytes(pem)
        _write_private(key_path, key_pem)
        ctx.load_cert_chain(chain_path, key_path)


def _make_ca_cert(key: ec.EllipticCurvePrivateKey) -> x509.Certificate:
    now = _now()
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.COMMON_NAME, "byok local CA"),
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "byok (this machine only)"),
        ]
    )
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + dt.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )


def ca_cert_path(data_dir: Path) -> Path:
    """Where the CA certificate lives (whether or not it exists yet)."""
    return Path(data_dir).expanduser() / CA_DIR / CA_CERT
