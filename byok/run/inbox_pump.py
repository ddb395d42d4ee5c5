"""The run's inbox pump: every client message of a run, answered or routed as it arrives."""

from __future__ import annotations

import logging

from byok.cursor import encode
from byok.cursor.client_messages import (
    CancelRequested,
    ExecAnswer,
    ExecControl,
    Heartbeat,
    KvAnswer,
    Unhandled,
    decode,
)
from byok.cursor.exec_router import ExecRouter
from byok.loop.turn_values import Cancel
from byok.run.driver import Driver
from byok.run.kv import KvLink
from byok.run.slot import RunSlot

log = logging.getLogger("byok.run")


async def pump_inbox(slot: RunSlot, kv: KvLink, router: ExecRouter, driver: Driver) -> None:
    rid = slot.request_id
    async for msg in slot.inbox:
        match decode(msg):
            case Heartbeat():
                slot.send(encode.heartbeat())
            case KvAnswer() as answer:
                if not kv.on_client(answer):
                    log.info("run %s: ignoring late/unknown kv answer id=%s", rid, answer.kv_id)
            case ExecAnswer(message=m):
                router.on_exec_message(m)  # a finished call reaches the driver as ToolDone
                await driver.drain()
            case ExecControl(message=m):
                router.on_control(m)
                await driver.drain()
            case CancelRequested():
                log.info("run %s: cancelled by client", rid)
                await driver.feed(Cancel())
            case Unhandled(name=name):
                log.warning("run %s: ignoring client message %s", rid, name)
