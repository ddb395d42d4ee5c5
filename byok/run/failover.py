"""An alias's failover: a run for an alias calls its targets in order, moving to the next only
while nothing of the answer has reached Cursor (the provider refused or broke before its first
event, or no first token came within the alias's first-token timeout). Once any output was
shown, an error ends the run as it would without an alias: the answer cannot start over.

A target that failed is skipped by every run for the alias's cooldown (``Cooldowns``, one per
daemon); when all are cooling down they are tried anyway, in order. The call record names the
alias and the model that served (``CallContext.alias_id``, the model's id).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import attrs
import trio

from byok.console.catalog import Target
from byok.loop.turn_values import Failed, Fault, Input, ModelFailed

if TYPE_CHECKING:
    from byok.run.context import RunContext

log = logging.getLogger("byok.run")


class Cooldowns:
    """Until when (trio time) each model id is skipped by aliases."""

    def __init__(self) -> None:
        self._until: dict[str, float] = {}

    def order(self, targets: tuple[Target, ...], now: float) -> tuple[Target, ...]:
        """The targets to try: those not cooling down first, each group in the alias's order."""
        ready = tuple(t for t in targets if self._until.get(t.model.id, -math.inf) <= now)
        return ready + tuple(t for t in targets if t not in ready)

    def failed(self, model_id: str, now: float, cooldown_s: float) -> None:
        self._until[model_id] = now + cooldown_s

    def served(self, model_id: str) -> None:
        self._until.pop(model_id, None)

    def cooling(self, model_id: str, now: float) -> bool:
        return self._until.get(model_id, -math.inf) > now


@attrs.define
class OutputWatch:
    """Disarms the first-token timeout at the call's first events, and remembers that Cursor
    may have seen output (from then on the call is the answer, whatever happens)."""

    scope: trio.CancelScope
    seen: bool = False

    def output(self) -> None:
        if not self.seen:
            self.seen = True
            self.scope.deadline = math.inf


CallOnce = Callable[[OutputWatch], Awaitable[Input | None]]


async def call_alias(
    ctx: RunContext, call_once: CallOnce, on_retarget: Callable[[], None] | None
) -> Input | None:
    """Call ``ctx``'s alias's targets in order until one shows output or the last one ends;
    ``call_once`` makes one call on ``ctx.model``/``ctx.provider``."""
    alias = ctx.alias
    assert alias is not None
    cooldowns = ctx.deps.cooldowns
    order = cooldowns.order(ctx.targets, trio.current_time())
    result: Input | None = None
    for i, target in enumerate(order):
        if (target.model, target.provider) != (ctx.model, ctx.provider):
            ctx.model, ctx.provider = target.model, target.provider
            if on_retarget is not None:
                on_retarget()
        with trio.CancelScope(deadline=trio.current_time() + alias.first_token_timeout_s) as scope:
            watch = OutputWatch(scope)
            result = await call_once(watch)
        if watch.seen:
            cooldowns.served(target.model.id)
            return result
        if scope.cancelled_caught:
            waited = f"sent no first token within {alias.first_token_timeout_s:g}s"
            result = ModelFailed(
                Failed(
                    "unavailable", f"model {target.model.id!r} ({target.provider.id}) {waited}", provider=True
                )
            )
        if not isinstance(result, ModelFailed | Fault):
            return result  # ended cleanly without output
        cooldowns.failed(target.model.id, trio.current_time(), alias.cooldown_s)
        if i + 1 < len(order):
            log.warning(
                "run %s: alias %r: %s failed before any output (%s); trying %s, and skipping it for %gs",
                ctx.start.request_id,
                alias.id,
                target.model.id,
                result.failure.message,
                order[i + 1].model.id,
                alias.cooldown_s,
            )
    return result
