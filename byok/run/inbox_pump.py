"""The run's inbox pump: every client message of a run, answered or routed as it arrives."""

from __future__ import annotations

import logging
from collections.abc import Callable

from byok.cursor import encode
from byok.cursor.client_messages import (
    ActionArrived,
    CancelRequested,
    ClientMessage,
    ExecAnswer,
    ExecControl,
    Heartbeat,
    InteractionAnswer,
    KvAnswer,
    Unhandled,
    decode,
)
from byok.cursor.exec_router import ExecRouter
from byok.cursor.live_actions import ForceBackground, Ignore, StopRun, live_action
from byok.loop.turn_values import Cancel, Failed, Fault
from byok.run.driver import Driver
from byok.run.kv import KvLink
from byok.run.slot import RunSlot

log = logging.getLogger("byok.run")


def route(msg: ClientMessage, slot: RunSlot, kv: KvLink, router: ExecRouter, driver: Driver) -> None:
    """One client message of a run, answered or routed; what it makes the turn do waits in the
    driver's queue for the caller to drain."""
    rid = slot.request_id
    match decode(msg):
        case Heartbeat():
            slot.send(encode.heartbeat())
        case KvAnswer() as answer:
            if not kv.on_client(answer):
                log.info("run %s: ignoring late/unknown kv answer id=%s", rid, answer.kv_id)
        case ExecAnswer(message=m):
            router.on_exec_message(m)  # a finished call reaches the driver as ToolDone
        case ExecControl(message=m):
            router.on_control(m)
        case InteractionAnswer(response=r):
            router.on_interaction(r)
        case ActionArrived(action=action):
            match live_action(action):
                case ForceBackground(call_id=call_id):
                    if not router.force_background(call_id):
                        log.info("run %s: shell call %s is not running: nothing to background", rid, call_id)
                case StopRun(code=code, message=message):
                    log.info("run %s: stopped by a conversation action: %s", rid, message)
                    driver.submit(Fault(Failed(code, message)), derived=True)
                case Ignore(why=why):
                    log.warning("run %s: ignoring %s", rid, why)
        case CancelRequested():
            log.info("run %s: cancelled by client", rid)
            driver.submit(Cancel(), derived=True)
        case Unhandled(name=name):
            log.warning("run %s: ignoring client message %s", rid, name)


async def pump_inbox(
    slot: RunSlot,
    kv: KvLink,
    router: ExecRouter,
    driver: Driver,
    log_client: Callable[[ClientMessage], None] | None,
) -> None:
    async for msg in slot.inbox:
        if log_client is not None:
            log_client(msg)
        route(msg, slot, kv, router, driver)
        await driver.drain()
