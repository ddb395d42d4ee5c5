"""`make bench`: byok's added latency, throughput, concurrency, commit time, long-conversation cost
and prefix stability, measured side by side against the same fake provider in the same run.

Benchmarks 1-5 run the daemon as a child process (`byok serve`, its own interpreter and core) so
its CPU time and RSS are its own; the fake provider and the simulated Cursor share this process.
CLOCK_MONOTONIC is system-wide, so timestamps taken on both sides subtract directly. The profile
tests (7-11) run the daemon in this process instead, so pyinstrument sees its stacks.

Each benchmark prints its rows; conftest prints the table at the end. Targets are reported,
never asserted: the assertions only check that a benchmark really ran.

Layout: driver.py is the harness (child daemon, timed provider, light client, results table);
common.py and the topic modules (concurrent_runs.py, commit_round.py, long_history.py) hold the
helpers several benchmarks share; test_NN_*.py hold the benchmarks, one module each or a small
group, named so that pytest's alphabetical order runs them 1 to 13.
"""
