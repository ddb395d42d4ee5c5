"""The allocator settings `byok serve` applies: big short-lived buffers stop being faulted in
page by page on every allocation (each 4 MiB buffer costs ~1,000 minor faults)."""

from __future__ import annotations

import subprocess
import sys

import pytest

_SCRIPT = """
import resource, sys
from byok.allocator import tune_allocator
tuned = tune_allocator() if sys.argv[1] == "tune" else False
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
data = b"x" * (4 << 20)
bytearray(data)
before = faults()
for _ in range(20):
    # A parse's pattern: a few fresh buffers of megabytes, written in full, then all freed.
    copies = [bytearray(data) for _ in range(3)]
    del copies
print(int(tuned), faults() - before)
"""


def _faults(mode: str) -> tuple[bool, int]:
    out = subprocess.run(
        [sys.executable, "-c", _SCRIPT, mode], capture_output=True, text=True, check=True, timeout=60
    ).stdout.split()
    return out[0] == "1", int(out[1])


def test_tuned_allocator_reuses_big_buffers() -> None:
    tuned, tuned_faults = _faults("tune")
    if not tuned:
        pytest.skip("not glibc: the allocator is left alone")
    _, default_faults = _faults("default")
    assert default_faults > 20_000  # glibc hands the freed heap back and faults it in again
    # Only the first round grows the heap; the 19 after it reuse the same pages.
    assert tuned_faults < 4 * 1024


_TRIM_SCRIPT = """
import os
from byok.allocator import release_free_memory, tune_allocator
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
tune_allocator()
copies = [bytearray(b"x" * (8 << 20)) for _ in range(4)]  # 32 MiB, written in full
del copies
kept = rss()  # the tuned heap keeps the freed 32 MiB resident
trimmed = release_free_memory()
print(int(trimmed), kept - rss())
"""


def test_idle_upkeep_hands_freed_heap_back() -> None:
    tuned, _ = _faults("tune")
    if not tuned:
        pytest.skip("not glibc: the allocator is left alone")
    out = subprocess.run(
        [sys.executable, "-c", _TRIM_SCRIPT], capture_output=True, text=True, check=True, timeout=60
    ).stdout.split()
    assert out[0] == "1"
    assert int(out[1]) > 24 << 20  # most of the 32 MiB left the process


_THREADS_SCRIPT = """
import resource, sys, threading
from byok.allocator import tune_allocator
tuned = tune_allocator() if sys.argv[1] == "tune" else False
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
def blocks():
    return [bytes(1500) + b"x" for _ in range(20000)]  # 30 MiB of mid-size blocks
made = []
worker = threading.Thread(target=lambda: made.append(blocks()))
worker.start()
worker.join()
made.clear()  # decoded on a worker thread, dropped later
before = faults()
again = blocks()  # the main thread's next allocations of the same sizes
print(int(tuned), faults() - before)
"""


def test_memory_a_worker_thread_freed_is_reused_by_the_main_thread() -> None:
    def faults(mode: str) -> tuple[bool, int]:
        out = subprocess.run(
            [sys.executable, "-c", _THREADS_SCRIPT, mode],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout.split()
        return out[0] == "1", int(out[1])

    tuned, tuned_faults = faults("tune")
    if not tuned:
        pytest.skip("not glibc: the allocator is left alone")
    _, default_faults = faults("default")
    assert default_faults > 5_000  # the worker's arena kept its 30 MiB; the main thread faulted in more
    assert tuned_faults < 500  # one arena: the same pages again


def test_the_command_line_module_imports_no_generated_protobuf_code() -> None:
    """`byok serve` tunes the allocator after `byok.cli` is imported: whatever that import pulls
    in is allocated under glibc's defaults. The generated protobuf modules (megabytes of class
    objects) imported that early left the daemon 3 MiB fuller after a long turn (bench 5's RSS
    rows, 11.7 -> 14.8 MiB), when byok.run.upkeep came to import the conversation module."""
    script = "import sys, byok.cli; print(sorted(m for m in sys.modules if m.startswith('byok.pb')))"
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]"


def test_the_command_line_module_imports_no_server_code() -> None:
    """Likewise the HTTP server, HTTP/2 and the TLS/CA code: the commands that need them import
    them when they run (byok.cli's parser imports only what it must)."""
    script = (
        "import sys, byok.cli; "
        "heavy = ('hypercorn', 'h2', 'cryptography', 'httpx'); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]"
