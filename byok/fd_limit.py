"""The soft limit on open descriptors, raised to the hard limit at start-up.

Every client connection, provider connection and database file is a descriptor, and macOS
starts processes at a soft limit of 256 (its hard limit is far higher): a few hundred
connections made ``accept`` fail with EMFILE. Raising the soft limit needs no privilege."""

from __future__ import annotations

import logging
import math

log = logging.getLogger("byok")

# macOS refuses a soft limit above OPEN_MAX (kern.maxfilesperproc's usual figure) when the
# hard limit is RLIM_INFINITY.
MACOS_OPEN_MAX = 10240


def raise_fd_limit() -> float | None:
    """Raise the soft RLIMIT_NOFILE as far as the hard limit allows and log the figure; returns
    the soft limit now in force (math.inf: unlimited; None: no such limit, as on Windows)."""
    try:
        import resource
    except ImportError:
        return None

    def value(limit: int) -> float:
        return math.inf if limit == resource.RLIM_INFINITY else limit

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    for target in (hard, MACOS_OPEN_MAX):
        if value(target) <= value(soft) or value(target) > value(hard):
            continue
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            continue  # above what the system allows (macOS with an unlimited hard limit)
        log.info("open file limit: %s (raised from %s)", _shown(value(target)), _shown(value(soft)))
        return value(target)
    log.info("open file limit: %s (hard limit %s)", _shown(value(soft)), _shown(value(hard)))
    return value(soft)


def _shown(limit: float) -> str:
    return "unlimited" if limit == math.inf else str(int(limit))
