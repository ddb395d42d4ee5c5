"""`byok calls` and `byok stats` on a populated database, through the command line."""

from __future__ import annotations

import json
import time
from pathlib import Path

from byok.model.usage import Usage
from byok.store import LlmCallRecord, SQLiteStore
from tests.integration.conftest import write_config
from tests.support.serve_process import byok_cmd


def _noon(days_ago: int) -> int:
    day = time.localtime(time.time() - days_ago * 86400)
    return int(time.mktime((day.tm_year, day.tm_mon, day.tm_mday, 12, 0, 0, 0, 0, -1)) * 1000)


def _call(rid: str, model: str, at_ms: int, **kw: object) -> LlmCallRecord:
    return LlmCallRecord(
        request_id=rid,
        conversation_id="conv",
        provider_id="fake",
        model=model,
        request_body=None,
        request_sha256="",
        messages_sha256="",
        started_at_ms=at_ms,
        **kw,  # type: ignore[arg-type]
    )


def populate(data_dir: Path) -> tuple[int, int]:
    yesterday, today = _noon(1), _noon(0)
    with SQLiteStore.open_in(data_dir) as store:
        for rid, model, at in [
            ("r1", "byok-demo", yesterday),
            ("r2", "byok-demo", today),
            ("r3", "other", today),
        ]:
            store.start_run(rid, "conv", model, at)
        store.record_llm_calls(
            [
                _call(
                    "r1",
                    "gpt-test",
                    yesterday,
                    status="ok",
                    usage=Usage(1000, 50, cache_read_tokens=0),
                    cache_hit_share=0.0,
                    ttft_ms=420,
                    duration_ms=1500,
                ),
                _call(
                    "r2",
                    "gpt-test",
                    today,
                    status="ok",
                    usage=Usage(3000, 150, cache_read_tokens=2400),
                    cache_hit_share=0.8,
                    ttft_ms=210,
                    duration_ms=900,
                ),
                _call(
                    "r3",
                    "gpt-other",
                    today + 1000,
                    status="error",
                    http_status=401,
                    error="HTTP 401: invalid key (provider 'fake' refused the key)",
                    duration_ms=80,
                ),
            ]
        )
    return yesterday, today


def test_calls_and_stats(tmp_path: Path) -> None:
    cfg = tmp_path / "byok.toml"
    data = tmp_path / "data"
    write_config(cfg, provider_url="http://127.0.0.1:9/v1", data_dir=data)

    missing = byok_cmd("calls", "--config", str(cfg), home=tmp_path)
    assert missing.returncode == 1
    assert (
        missing.stderr
        == f"byok: no database at {data / 'byok.sqlite3'}: byok has not run with this data dir\n"
    )

    yesterday, today = populate(data)
    day = time.strftime("%Y-%m-%d", time.localtime(today / 1000))
    before = time.strftime("%Y-%m-%d", time.localtime(yesterday / 1000))

    out = byok_cmd("calls", "--config", str(cfg), home=tmp_path)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split() == [
        "time",
        "model",
        "status",
        "tokens",
        "in",
        "out",
        "cache",
        "hit",
        "TTFT",
        "duration",
        "request",
    ]
    rows = [line.split() for line in lines[1:4]]
    assert rows[0][2:] == ["byok-demo", "ok", "1,000", "50", "0%", "0.42s", "1.50s", "r1"]
    assert rows[1][2:] == ["byok-demo", "ok", "3,000", "150", "80%", "0.21s", "0.90s", "r2"]
    assert rows[2][2:] == ["other", "error", "401", "-", "-", "-", "-", "0.08s", "r3"]
    assert lines[4].endswith(" r3: HTTP 401: invalid key (provider 'fake' refused the key)")
    assert len(lines) == 5

    newest = json.loads(byok_cmd("calls", "--config", str(cfg), "-n", "2", "--json", home=tmp_path).stdout)
    assert [(c["request_id"], c["model"], c["upstream_model"], c["status"]) for c in newest] == [
        ("r3", "other", "gpt-other", "error"),
        ("r2", "byok-demo", "gpt-test", "ok"),
    ]
    assert newest[1]["cache_hit_share"] == 0.8 and newest[1]["ttft_ms"] == 210
    only = byok_cmd("calls", "--config", str(cfg), "--model", "byok-demo", "--json", home=tmp_path).stdout
    assert [c["request_id"] for c in json.loads(only)] == ["r2", "r1"]

    stats = byok_cmd("stats", "--config", str(cfg), "--days", "2", home=tmp_path)
    assert stats.returncode == 0, stats.stderr
    assert [line.split() for line in stats.stdout.splitlines()] == [
        ["day", "model", "calls", "errors", "tokens", "in", "cached", "out"],
        [before, "byok-demo", "1", "0", "1,000", "0%", "50"],
        [day, "byok-demo", "1", "0", "3,000", "80%", "150"],
        [day, "other", "1", "1", "0", "-", "0"],
        ["total", "3", "1", "4,000", "60%", "200"],
    ]
    today_only = json.loads(
        byok_cmd("stats", "--config", str(cfg), "--days", "1", "--json", home=tmp_path).stdout
    )
    assert [(d["day"], d["model"], d["calls"], d["input_tokens"], d["cached_share"]) for d in today_only] == [
        (day, "byok-demo", 1, 3000, 0.8),
        (day, "other", 1, 0, None),
    ]
