"""The driver: inputs decided in submission order, commands performed in the machine's order,
whoever drains; a Flush lets other tasks in without reordering anything."""

from __future__ import annotations

import trio
import trio.testing

from byok.loop.emits import TextOut
from byok.loop.turn_values import (
    Begin,
    CallModel,
    Cancel,
    Canceled,
    Command,
    End,
    Flush,
    Input,
    ModelEvents,
    Show,
)
from byok.model import events as ev
from byok.run.driver import Driver

TOOLS = frozenset({"Read"})
BEGIN = Begin("req", "agent", "call", TOOLS, TOOLS)


class Effects:
    def __init__(self) -> None:
        self.performed: list[Command] = []
        self.flushes = 0
        self.release = trio.Event()

    def perform(self, command: Command) -> None:
        self.performed.append(command)

    async def flush(self) -> None:
        self.flushes += 1
        await self.release.wait()


def text(t: str) -> ModelEvents:
    return ModelEvents((ev.TextDelta(t),), 0.0)


async def test_a_feed_during_a_flush_waits_behind_the_batch_that_flushed() -> None:
    effects = Effects()
    driver = Driver(effects)
    recorded: list[Input] = []
    driver.record = recorded.append
    await driver.feed(BEGIN)
    assert [type(c) for c in effects.performed] == [CallModel]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(driver.feed, text("a"))  # the first output: Show, then a Flush
        await trio.testing.wait_all_tasks_blocked()
        assert effects.flushes == 1
        await driver.feed(text("b"))  # queued behind the flushing batch, not performed yet
        assert effects.performed[-1] == Show((TextOut("a"),))
        effects.release.set()
    assert effects.performed[-2:] == [Show((TextOut("a"),)), Show((TextOut("b"),))]
    assert recorded == [BEGIN, text("a"), text("b")]


async def test_derived_inputs_are_not_recorded_and_a_late_cancel_ends_nothing() -> None:
    effects = Effects()
    driver = Driver(effects)
    recorded: list[Input] = []
    driver.record = recorded.append
    await driver.feed(BEGIN)
    await driver.feed(Cancel(), derived=True)  # a client's cancel_action: the log has its message
    assert effects.performed[-1] == End(Canceled(), None) and driver.ended
    assert recorded == [BEGIN]
    assert driver.end_now(Cancel()) is None  # decided already


def test_drain_to_flush_stops_at_the_flush_a_replay_waits_on() -> None:
    effects = Effects()
    driver = Driver(effects)
    driver.submit(BEGIN)
    driver.submit(text("a"))
    driver.submit(text("b"))
    assert driver.drain_to_flush() is True  # CallModel, Show(a), then the Flush
    assert effects.performed == [CallModel(effects.performed[0].model_call_id), Show((TextOut("a"),))]
    assert driver.drain_to_flush() is False
    assert effects.performed[-1] == Show((TextOut("b"),))
    assert not any(isinstance(c, Flush) for c in effects.performed)
