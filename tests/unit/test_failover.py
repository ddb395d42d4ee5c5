"""An alias's failover on its own: the first-token timeout (MockClock), output ends it, the
cooldown order."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import trio
import trio.testing

from byok.config import ModelConfig, ProviderConfig
from byok.console.catalog import AliasConfig, Target
from byok.loop.turn_values import Failed, ModelFailed
from byok.run.failover import Cooldowns, OutputWatch, call_alias

P = ProviderConfig(id="p", kind="openai_chat", base_url="http://127.0.0.1:1")


def target(mid: str) -> Target:
    return Target(ModelConfig(id=mid, provider="p", upstream_model=mid, context_tokens=100), P)


A, B, C = target("a"), target("b"), target("c")


def ctx(timeout_s: float = 30.0, cooldown_s: float = 60.0) -> Any:
    return SimpleNamespace(
        alias=AliasConfig("al", ("a", "b", "c"), timeout_s, cooldown_s),
        targets=(A, B, C),
        deps=SimpleNamespace(cooldowns=Cooldowns()),
        model=A.model,
        provider=P,
        start=SimpleNamespace(request_id="r1"),
    )


async def test_no_first_token_within_the_timeout_moves_on(autojump_clock: trio.testing.MockClock) -> None:
    c = ctx(timeout_s=30)
    called: list[tuple[str, float]] = []
    moved: list[str] = []

    async def call_once(watch: OutputWatch) -> Any:
        called.append((c.model.id, trio.current_time()))
        if c.model.id == "a":
            await trio.sleep_forever()  # connected, silent
        await trio.sleep(20)  # the first token, within the timeout
        watch.output()
        await trio.sleep(100)  # a long answer: the timeout no longer applies
        return None

    assert await call_alias(c, call_once, lambda: moved.append(c.model.id)) is None
    assert [m for m, _ in called] == ["a", "b"] and called[1][1] == 30
    assert moved == ["b"] and c.model.id == "b"
    assert c.deps.cooldowns.cooling("a", 31) and not c.deps.cooldowns.cooling("a", 91)
    assert not c.deps.cooldowns.cooling("b", 31)


async def test_output_then_failure_is_the_answer(autojump_clock: trio.testing.MockClock) -> None:
    c = ctx()
    failure = ModelFailed(Failed("unavailable", "broke mid-answer", provider=True))

    async def call_once(watch: OutputWatch) -> Any:
        watch.output()
        return failure

    assert await call_alias(c, call_once, None) is failure
    assert c.model.id == "a"


async def test_cooldown_order_and_all_cooling(autojump_clock: trio.testing.MockClock) -> None:
    cooldowns = Cooldowns()
    cooldowns.failed("a", 0, 60)
    assert [t.model.id for t in cooldowns.order((A, B, C), 10)] == ["b", "c", "a"]
    cooldowns.failed("b", 0, 60)
    cooldowns.failed("c", 0, 60)
    assert [t.model.id for t in cooldowns.order((A, B, C), 10)] == ["a", "b", "c"]  # tried anyway
    assert [t.model.id for t in cooldowns.order((A, B, C), 61)] == ["a", "b", "c"]
    cooldowns.served("a")
    assert (
        not cooldowns.cooling("a", 10) and cooldowns.cooling("b", 10) and not cooldowns.cooling("b", math.inf)
    )
