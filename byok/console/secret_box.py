"""Provider keys at rest: AES-256-GCM under a key kept in a file of its own.

The key file (``{data_dir}/console.key``, 32 random bytes, mode 0600) is made on the first start
and never leaves the data dir; the database holds only ``nonce || ciphertext+tag``. The
provider's id is the associated data, so a ciphertext copied to another row does not decrypt.
A database copied without its key file gives nothing away.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

KEY_FILENAME = "console.key"
KEY_BYTES = 32
NONCE_BYTES = 12


class SecretBoxError(Exception):
    """The key file is unusable, or a ciphertext does not open with it (one line, for the user)."""


class SecretBox:
    def __init__(self, key: bytes) -> None:
        if len(key) != KEY_BYTES:
            raise SecretBoxError(f"the console key must be {KEY_BYTES} bytes, got {len(key)}")
        self._aead = AESGCM(key)

    def __repr__(self) -> str:
        return "SecretBox(<key hidden>)"

    @classmethod
    def load_or_create(cls, data_dir: Path) -> SecretBox:
        """The data dir's key, created (0600, never overwritten) when it has none."""
        path = data_dir / KEY_FILENAME
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return cls(_read_key(path))
        try:
            os.write(fd, secrets.token_bytes(KEY_BYTES))
            os.fsync(fd)
        finally:
            os.close(fd)
        return cls(_read_key(path))

    def seal(self, plaintext: str, context: str) -> bytes:
        nonce = secrets.token_bytes(NONCE_BYTES)
        return nonce + self._aead.encrypt(nonce, plaintext.encode(), context.encode())

    def open(self, sealed: bytes, context: str) -> str:
        if len(sealed) < NONCE_BYTES + 16:
            raise SecretBoxError("a stored secret is too short to be one")
        try:
            plain = self._aead.decrypt(sealed[:NONCE_BYTES], sealed[NONCE_BYTES:], context.encode())
        except InvalidTag:
            raise SecretBoxError(
                f"a stored secret of {context!r} does not open with {KEY_FILENAME}"
                " (the key file was replaced or the database copied without it): enter the key again"
            ) from None
        return plain.decode()


def _read_key(path: Path) -> bytes:
    try:
        mode = path.stat().st_mode
        if mode & 0o077:
            os.chmod(path, 0o600)  # a key readable by others is tightened, not trusted less
        return path.read_bytes()
    except OSError as e:
        raise SecretBoxError(f"cannot read {path}: {e.strerror or e}") from None
