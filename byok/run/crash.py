"""Named crash points for the kill -9 tests.

`BYOK_CRASH_AT=<name>` makes the daemon SIGKILL itself when it reaches that point, so a test
can stop it exactly there and check what a restart recovers. Unset in normal use: one dict
lookup per point.
"""

from __future__ import annotations

import os
import signal

POINTS = (
    "provider_call_planned",  # the runtime message is committed, the provider call not yet sent
    "provider_mid_stream",  # the provider has streamed output, Done not yet reached
    "tool_result_committed",  # a tool result is in SQLite, the round not yet settled
    "blobs_acked",  # a checkpoint's blobs are ACKed, the checkpoint frame not yet sent
    "settled_checkpoint_sent",  # a tool round's settled checkpoint went out
    "turn_ended_sent",  # turn_ended went out, the final checkpoints not yet
)
# Points only a compaction reaches (tests/integration/test_crash_compaction.py).
COMPACTION_POINTS = (
    "summary_committed",  # the summary is the history's new root, summary_completed not yet sent
)

_TARGET = os.environ.get("BYOK_CRASH_AT")


def crash_point(name: str) -> None:
    if name == _TARGET:
        os.kill(os.getpid(), signal.SIGKILL)
