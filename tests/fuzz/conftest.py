"""Hypothesis profile for the fuzz properties (tests/fuzz/test_fuzz_*.py).

``make test`` runs every property with its own small example count (the whole directory stays
well under 30 s). ``make fuzz`` sets ``BYOK_FUZZ_EXAMPLES`` (examples *per target*; the Makefile
picks a value that makes ~10^6 across all targets) and the same properties run that many times.

The profile is registered, never loaded globally, so other test directories keep Hypothesis'
defaults; the fuzz modules apply it per test through ``fuzz(n)`` (tests/fuzz/support.py).
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

LONG_EXAMPLES = int(os.environ.get("BYOK_FUZZ_EXAMPLES", "0") or 0)

settings.register_profile(
    "byok-fuzz",
    deadline=None,  # wall-clock deadlines only make a loaded CI box flaky
    max_examples=LONG_EXAMPLES or 100,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    # A long run reports every distinct failure it finds, not only the first.
    report_multiple_bugs=True,
)
