"""The run's inbox pump: every client message of a run, answered or routed as it arrives."""

from __future__ import annotations

import logging

import betterproto2
import trio

from byok.cursor import encode
from byok.run.kv import KvLink
from byok.run.slot import RunSlot
from byok.run.tool_round import ExecRouter

log = logging.getLogger("byok.run")


async def pump_inbox(slot: RunSlot, kv: KvLink, router: ExecRouter, run_scope: trio.CancelScope) -> None:
    rid = slot.request_id
    async for msg in slot.inbox:
        name, value = betterproto2.which_one_of(msg, "message")
        if name == "client_heartbeat":
            slot.send(encode.heartbeat())
        elif name == "kv_client_message":
            if not kv.on_client(value):
                log.info("run %s: ignoring late/unknown kv answer id=%s", rid, value.id)
        elif name == "exec_client_message":
            router.on_exec_message(value)
        elif name == "exec_client_control_message":
            router.on_control(value)
        elif name == "conversation_action" and value.cancel_action is not None:
            log.info("run %s: cancelled by client", rid)
            run_scope.cancel()
        else:
            log.warning("run %s: ignoring client message %s", rid, name)
