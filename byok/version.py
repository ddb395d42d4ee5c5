"""byok's version, as installed (pyproject.toml's ``version``)."""

from __future__ import annotations

from importlib import metadata


def byok_version() -> str:
    try:
        return metadata.version("byok")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"
