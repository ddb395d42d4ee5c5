"""The run service: every run's lifecycle in one place.

It keeps the slots (RunRegistry), starts a run for an accepted run_request under its
conversation's supervisor (which cancels and awaits the run it supersedes), cancels a run whose
RunSSE stayed away longer than the reconnect grace, lets a finished run's slot linger for late
appends, and drains or cancels the runs at shutdown. http/ only frames and routes: it hands
decoded requests here and writes the frames of the slots this gives it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import attrs
import trio

from byok.config import Config
from byok.console.catalog import Catalog
from byok.cursor.live_actions import background_shell_message
from byok.cursor.request import RunRequestError, RunStart
from byok.loop.turn_values import Failed, Succeeded
from byok.run.conversation import ActiveRun, Supervisors
from byok.run.conversation_caches import ConversationCaches
from byok.run.deps import RunDeps
from byok.run.runner import Run
from byok.run.slot import RunRegistry, RunSlot

log = logging.getLogger("byok.run")

# A finished run's slot lingers so late appends (ACKs, heartbeats) are dropped idempotently, and
# a RunSSE reconnecting after the end still learns it.
SLOT_LINGER_S = 120.0


def no_vision(model_id: str, images: int) -> str:
    """Why a run with images on a model without vision does not start (nothing is dropped)."""
    what = "an image" if images == 1 else f"{images} images"
    return (
        f"model {model_id!r} is configured without vision (vision = false), and this message has "
        f"{what}: remove the image(s), or pick a model that reads images"
    )


def not_served(config: Config | Catalog, model_id: str) -> str:
    """Why byok does not run ``model_id``, and which ids it does run."""
    model = config.model(model_id)
    why = "is disabled (enabled = false)" if model is not None else "is not configured"
    served = ", ".join(repr(m.id) for m in config.enabled_models()) or "none: no model is configured"
    return f"model {model_id!r} {why} in byok; it serves: {served}"


class RunService:
    def __init__(self, *, config: Config, deps: RunDeps, nursery: trio.Nursery) -> None:
        self.config = config
        self.deps = deps
        self.nursery = nursery
        self.registry = RunRegistry()
        self.supervisors = Supervisors()
        # The one cache budget: a conversation is charged at each run's end, and the least
        # recently used idle ones go past it.
        self.caches = ConversationCaches(
            config.server.cache_bytes,
            store=deps.store,
            call_log=deps.call_log,
            renders=deps.renders,
            supervisors=self.supervisors,
        )
        self.accepting = True
        self.active: set[ActiveRun] = set()
        self._idle = trio.Event()
        self._idle.set()
        # What upkeep between runs and the call log wait for (run/upkeep.py): the runs' starts and
        # ends here, their provider calls in the effects.
        self.activity = deps.activity

    def reconfigure(self, config: Config) -> None:
        """Runs that start from now use ``config``; those running keep theirs (their deps)."""
        self.config = config
        self.deps = attrs.evolve(self.deps, config=config)
        self.deps.call_log.detailed = config.logging.detailed

    def start(self, slot: RunSlot, parse: Callable[[], RunStart]) -> Failed | None:
        """Start the run the run_request asks for (``parse`` validates it), or refuse it: its
        stream then ends with the refusal, which is returned."""
        try:
            if not self.accepting:
                raise RunRequestError("unavailable", "byok is shutting down")
            start = parse()
            model = self.deps.catalog.model(start.model_id)
            if model is None or not model.enabled or not self.deps.catalog.targets(start.model_id):
                raise RunRequestError("not_found", not_served(self.deps.catalog, start.model_id))
            if start.image_count and not model.vision:
                raise RunRequestError("failed_precondition", no_vision(model.id, start.image_count))
        except RunRequestError as e:
            failure = Failed(e.code, e.message)
            log.warning("request %s not started: %s: %s", slot.request_id, e.code, e.message)
            self.refuse(slot, failure)
            return failure
        if start.action == "background_shell_action":
            return self._to_live_run(slot, start)
        slot.run_started = True
        self.nursery.start_soon(self._run, slot, start, self.deps)  # the deps it was accepted under
        return None

    def _to_live_run(self, slot: RunSlot, start: RunStart) -> Failed | None:
        """background_shell_action as a run_request: the conversation's live run moves its shell
        to the background; this request's stream ends at once, ``{}``, or an error saying no run
        of the conversation is live (its shell call ended with its run)."""
        sup = self.supervisors.peek(start.conversation_id)
        active = None if sup is None else sup.active
        live = None if active is None else self.registry.get(active.request_id)
        if live is None or live.closed:
            failure = Failed(
                "failed_precondition",
                f"background_shell_action: no run of conversation {start.conversation_id} is live, so"
                f" shell call {start.target} is not running in byok",
            )
            self.refuse(slot, failure)
            return failure
        log.info(
            "request %s: moving shell call %s of run %s to the background",
            slot.request_id,
            start.target,
            live.request_id,
        )
        live.deliver(background_shell_message(start.target))
        slot.close(Succeeded())
        self.nursery.start_soon(self._linger, slot)
        return None

    def _cancel_subagent(self, subagent_id: str) -> None:
        """cancel_subagent_action: the subagent's own run (its conversation is its agent id),
        if one is running here, is cancelled; its stream ends canceled."""
        child = self.supervisors.peek(subagent_id)
        if child is not None and child.active is not None:
            log.info("cancelling the run %s of subagent %s", child.active.request_id, subagent_id)
            child.active.scope.cancel()
        else:
            log.info("cancel_subagent_action: subagent %s has no run here", subagent_id)

    def refuse(self, slot: RunSlot, failure: Failed) -> None:
        """A run that will not start: its RunSSE, open or still to come, ends with ``failure``."""
        slot.close(failure)
        self.nursery.start_soon(self._linger, slot)

    def fail(self, slot: RunSlot, failure: Failed) -> None:
        """The client's side of a run broke (a malformed stream): end the run, or its slot."""
        log.warning("request %s: %s: %s", slot.request_id, failure.code, failure.message)
        if slot.cancel_run is not None:
            slot.cancel_run()
        else:
            slot.close(failure)

    def stream_dropped(self, slot: RunSlot) -> None:
        """The run's RunSSE went away: keep the run for a reconnect, within the grace."""
        if not slot.closed:
            self.nursery.start_soon(self._grace, slot)

    async def _grace(self, slot: RunSlot) -> None:
        grace = self.config.server.reconnect_grace_s
        reattached = slot.attached_event
        with trio.move_on_after(grace):
            await reattached.wait()
            return
        if not slot.closed and slot.cancel_run is not None:
            log.info("request %s: RunSSE gone for %gs, cancelling the run", slot.request_id, grace)
            slot.cancel_run()

    async def _run(self, slot: RunSlot, start: RunStart, deps: RunDeps) -> None:
        if start.action == "cancel_subagent_action":
            self._cancel_subagent(start.target)
        elif start.action == "background_subagent_action":
            # The parent's Task waits on the client, not on byok: the client backgrounds it.
            log.info("run %s: the subagent of Task %s goes to the background", start.request_id, start.target)
        sup = self.supervisors.get(start.conversation_id)
        me = ActiveRun(
            start.request_id,
            trio.CancelScope(),
            trio.Event(),
            start.conversation_id,
            start.model_id,
            deps.wall_ms(),
        )
        slot.cancel_run = me.scope.cancel
        self.active.add(me)
        self.caches.run_started(start.conversation_id)
        self.activity.started()
        if self._idle.is_set():
            self._idle = trio.Event()
        try:
            await sup.run(me, Run(slot, start, deps, sup).run)
        finally:
            slot.finished.set()
            # The slot lingers for a reconnecting RunSSE: it must not keep the finished run (its
            # history, its turn's cards) alive through these hooks.
            slot.cancel_run = slot.on_reattach = None
            self.active.discard(me)
            self.nursery.start_soon(self.caches.run_ended, start.conversation_id)
            self.activity.finished()
            if not self.active:
                self._idle.set()
            self.nursery.start_soon(self._linger, slot)

    async def shutdown(self, grace_s: float) -> None:
        """Stop accepting runs, let active ones finish within ``grace_s``, then cancel the rest."""
        self.accepting = False
        with trio.move_on_after(grace_s):
            await self._idle.wait()
        for run in list(self.active):
            log.info("shutdown: cancelling run %s", run.request_id)
            run.scope.cancel()
        await self._idle.wait()

    async def _linger(self, slot: RunSlot) -> None:
        await trio.sleep(SLOT_LINGER_S)
        self.registry.remove(slot.request_id, slot)
