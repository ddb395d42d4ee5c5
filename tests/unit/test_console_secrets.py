"""The console's key file (AES-GCM at rest) and its token (kept as a hash)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from byok.console.secret_box import KEY_FILENAME, SecretBox, SecretBoxError
from byok.console.token import TOKEN_FILENAME, TokenCheck, ensure_token, new_token


def test_key_file_is_private_made_once_and_seals(tmp_path: Path) -> None:
    box = SecretBox.load_or_create(tmp_path)
    key_file = tmp_path / KEY_FILENAME
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600 and len(key_file.read_bytes()) == 32
    first = key_file.read_bytes()
    sealed = box.seal("sk-secret-value", "provider:a")
    assert b"sk-secret" not in sealed
    again = SecretBox.load_or_create(tmp_path)  # a restart: the same key, not a new one
    assert key_file.read_bytes() == first and again.open(sealed, "provider:a") == "sk-secret-value"
    assert box.seal("x", "provider:a") != box.seal("x", "provider:a")  # a fresh nonce each time
    with pytest.raises(SecretBoxError, match="does not open"):
        box.open(sealed, "provider:b")  # copied to another provider's row
    other = tmp_path / "other"
    other.mkdir()
    with pytest.raises(SecretBoxError, match="does not open"):
        SecretBox.load_or_create(other).open(sealed, "provider:a")  # another key file
    assert "sk" not in repr(box)


def test_a_loose_key_file_is_tightened(tmp_path: Path) -> None:
    SecretBox.load_or_create(tmp_path)
    os.chmod(tmp_path / KEY_FILENAME, 0o644)
    SecretBox.load_or_create(tmp_path)
    assert stat.S_IMODE((tmp_path / KEY_FILENAME).stat().st_mode) == 0o600


def test_token_is_shown_once_kept_hashed_and_replaceable(tmp_path: Path) -> None:
    token = ensure_token(tmp_path)
    assert token is not None and ensure_token(tmp_path) is None  # the second start shows nothing
    stored = (tmp_path / TOKEN_FILENAME).read_text()
    assert token not in stored and stat.S_IMODE((tmp_path / TOKEN_FILENAME).stat().st_mode) == 0o600
    check = TokenCheck(tmp_path)
    assert check.accepts(token) and not check.accepts(token + "x") and not check.accepts("")
    replaced = new_token(tmp_path)
    assert check.accepts(replaced) and not check.accepts(token)  # noticed without a restart


def test_no_stored_hash_accepts_nothing(tmp_path: Path) -> None:
    assert not TokenCheck(tmp_path).accepts("")
    assert not TokenCheck(tmp_path).accepts("anything")


def test_console_token_command_replaces_the_token(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from byok.cli import main

    data_dir = tmp_path / "data"
    first = ensure_token(data_dir) if data_dir.exists() else None
    assert first is None
    assert main(["console-token", "--data-dir", str(data_dir), "--port", "9999"]) == 0
    out = capsys.readouterr().out
    assert "http://127.0.0.1:9999/byok/#token=" in out
    token = out.split("#token=", 1)[1].split()[0]
    assert TokenCheck(data_dir).accepts(token)
    assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700
