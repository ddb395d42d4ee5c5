"""`make bench`: prints the final table once every benchmark has run.

Targets are reported, not enforced: a benchmark fails only when it could not run (a slow or
loaded CI machine must not turn the build red), so read PASS/FAIL in the table, not pytest's.
"""

from __future__ import annotations

import os
import platform
import subprocess
from typing import Any

from byok.allocator import tune_allocator
from tests.bench import driver


def pytest_configure(config: Any) -> None:
    # The in-process timings (4, 5, the profiles) run byok's code under the daemon's own malloc
    # settings (byok serve tunes them at start): with glibc's defaults every multi-megabyte
    # buffer is a fresh mmap faulted in page by page, which the daemon never pays.
    tune_allocator()


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: Any) -> None:
    if not driver.RESULTS:
        return
    tr = terminalreporter
    tr.section("byok bench")
    load = os.getloadavg()
    tr.write_line(
        f"{platform.python_implementation()} {platform.python_version()}, {os.cpu_count()} cores, "
        f"load average now {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}"
    )
    tr.write_line(f"byok at {_revision()}")
    tr.write_line("Targets are reported, not enforced: PASS/FAIL below never fails the run.")
    for line in driver.table():
        tr.write_line(line)
    if driver.NOTES:
        tr.write_line("")
        tr.write_line("Notes:")
        for note in driver.NOTES:
            tr.write_line(f"  - {note}")


def _revision() -> str:
    """The commit measured, and whether the working tree differed from it (read-only git)."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "byok"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "an unknown revision (no git)"
    return f"{head}" + (" with uncommitted changes under byok/" if dirty else "")
