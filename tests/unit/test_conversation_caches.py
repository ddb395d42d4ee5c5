"""ConversationCaches: at a run's end its conversation is charged for all four caches; past the
budget the least recently used idle conversation loses all four (its render stored first) and
its next turn reads it back whole; a running conversation keeps everything."""

from __future__ import annotations

from pathlib import Path

import attrs
import trio

from byok.model.messages import Message
from byok.model.projection import project
from byok.model.request import ModelRequest, ModelSettings
from byok.providers import render_cache
from byok.providers.adapters import adapter_for
from byok.providers.kinds import OPENAI_CHAT
from byok.run import call_meter
from byok.run.call_log import CallLog
from byok.run.conversation import ActiveRun, Supervisors
from byok.run.conversation_caches import ConversationCaches
from byok.run.stored_render import MIN_MESSAGES, StoredRenders, render_key
from byok.store import AsyncStore, LlmCallRecord

CHAT = adapter_for(OPENAI_CHAT)
TEMPLATE = ModelRequest(system="s", tools=(), history=(), settings=ModelSettings("m"))


@attrs.define
class Daemon:
    """The parts of a daemon the caches are charged for, and a turn that fills them."""

    store: AsyncStore
    call_log: CallLog
    supervisors: Supervisors
    renders: StoredRenders
    caches: ConversationCaches

    async def turn(self, cid: str, text: str) -> tuple[Message, ...]:
        self.caches.run_started(cid)
        sup = self.supervisors.get(cid)
        head = await self.store.head(cid)
        head = await self.store.append(cid, head.version, [Message(role="user", origin="user", text=text)], 1)
        request = await self.renders.request(self.store, cid, head.messages, OPENAI_CHAT, TEMPLATE)
        with render_cache.owned_by(cid):
            rendered = CHAT.render(request)
        self.call_log.submit(
            LlmCallRecord("r", cid, "p", "m", rendered.source, "", "", "ok", 1, rendered=rendered)
        )
        await self.call_log.flush()
        for m in head.messages:
            sup.memory.acked.add(sup.memory.root_of(m).id)
        await self.caches.run_ended(cid)
        return head.messages

    def held(self, cid: str) -> list[int]:
        return [
            self.store.cached_bytes_of(cid),
            render_cache.owned_size(cid),
            self.call_log.kept_bytes(cid),
            self.supervisors.memory_bytes(cid),
        ]


async def daemon(tmp_path: Path, max_bytes: int) -> Daemon:
    store = await AsyncStore.open(tmp_path / "data")
    call_log, supervisors, renders = CallLog(store), Supervisors(), StoredRenders()
    caches = ConversationCaches(
        max_bytes, store=store, call_log=call_log, renders=renders, supervisors=supervisors
    )
    return Daemon(store, call_log, supervisors, renders, caches)


async def fill(d: Daemon, cid: str) -> tuple[Message, ...]:
    messages = [
        Message(role="user", origin="user", text=f"{cid} question {i} " * 40) for i in range(MIN_MESSAGES)
    ]
    await d.store.append(cid, 0, messages, 1)
    return await d.turn(cid, "next")


async def test_one_conversation_within_the_budget_keeps_all_four_caches(tmp_path: Path) -> None:
    d = await daemon(tmp_path, 64 * 2**20)
    await fill(d, "a")
    assert all(d.held("a")), d.held("a")
    assert d.caches.budget.size_of("a") == sum(d.held("a"))
    d.caches.close()
    await d.store.aclose()


async def test_past_the_budget_the_least_recently_used_idle_conversation_loses_everything(
    tmp_path: Path,
) -> None:
    d = await daemon(tmp_path, 64 * 2**20)
    a = await fill(d, "a")
    one = d.caches.budget.size_of("a")
    d.caches.budget.max_bytes = one + one // 2  # room for one conversation, not two
    await fill(d, "b")  # b's run ends: a, least recently used, goes
    assert d.held("a") == [0, 0, 0, 0] and "a" not in d.caches.budget and d.caches.evicted == 1
    assert all(d.held("b"))
    sup_b = d.supervisors.get("b")
    # a's render was stored before it went: its next turn starts from it.
    key, texts = CHAT.prefix_texts(attrs.evolve(TEMPLATE, history=project(a)))
    stored = await d.store.rendered_prefix("a", render_key(key))
    assert stored is not None and stored.texts == tuple(texts)
    # Its next turn reads it back whole, and now b is the least recently used.
    again = await d.turn("a", "and again")
    assert again[: len(a)] == a and again[0] is not a[0]
    assert all(d.held("a")) and d.held("b") == [0, 0, 0, 0]
    assert d.supervisors.get("b") is not sup_b
    d.caches.close()
    await d.store.aclose()


async def test_a_running_conversation_is_never_evicted(tmp_path: Path) -> None:
    d = await daemon(tmp_path, 64 * 2**20)
    await fill(d, "a")
    d.caches.budget.max_bytes = 1000  # smaller than either
    d.caches.run_started("a")  # a's next run has started (a preempted one ending keeps it too)
    sup = d.supervisors.get("a")
    sup.active = ActiveRun("r2", trio.CancelScope(), trio.Event())
    await fill(d, "b")  # b does not fit beside a: b itself goes once idle, a stays
    assert all(d.held("a")) and d.held("b") == [0, 0, 0, 0]
    sup.active = None
    await d.caches.run_ended("a")  # now idle and larger than the budget: it goes
    assert d.held("a") == [0, 0, 0, 0] and d.caches.budget.total == 0
    assert call_meter.digests_size("a") == 0
    d.caches.close()
    await d.store.aclose()
