"""The driver: inputs in, ``loop.turn.transition``, commands out to the effects.

Every input of a run goes through ``submit``: the provider stream task, the exec router, the
inbox pump, the effects' own tasks (a commit done, a checkpoint out). Trio runs one task at a
time, so the transitions happen in one order, the order inputs were submitted. Commands are
performed in the order the machine gave them by whichever task is draining; a task that submits
while another drains leaves its commands to it. Only ``Flush`` is awaited in line (the writer
gets at most a few milliseconds); every longer effect runs as a task of the run's nursery and
reports back with an input.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from typing import Protocol

from byok.loop.turn import LoopProtocolError, TurnState, transition
from byok.loop.turn_values import Command, End, Failed, Fault, Flush, Input

log = logging.getLogger("byok.run")


class Effects(Protocol):
    def perform(self, command: Command) -> None:
        """Do ``command`` now, or start a task that will (and submit its result)."""
        ...

    async def flush(self) -> None: ...


class Driver:
    def __init__(self, effects: Effects) -> None:
        self.state = TurnState()
        self.effects = effects
        self._queue: deque[Command] = deque()
        self._draining = False
        # The run's input log (run/run_log.py), when kept: every input not derived from a client
        # message the log holds itself.
        self.record: Callable[[Input], None] | None = None
        self.on_flushed: Callable[[], None] | None = None

    @property
    def ended(self) -> bool:
        return self.state.phase == "ended"

    def submit(self, inp: Input, *, derived: bool = False) -> None:
        """Take one input. Raises ModelProtocolError (state unchanged) for a provider event that
        breaks the stream contract: the provider task that fed it fails its call. ``derived``:
        it follows from a client message (a tool's result, a cancel), which the log holds."""
        if self.record is not None and not derived:
            self.record(inp)
        try:
            self.state, commands = transition(self.state, inp)
        except LoopProtocolError as e:
            # A bug of the run layer, not of a peer: the run still ends in one clean state.
            log.exception("run %s: %s", self.state.request_id, e)
            self.state, commands = transition(self.state, Fault(Failed("internal", f"internal error: {e}")))
        self._queue.extend(commands)

    async def feed(self, inp: Input, *, derived: bool = False) -> None:
        self.submit(inp, derived=derived)
        await self.drain()

    async def drain(self) -> None:
        if self._draining:
            return  # the task draining now performs them, in order
        self._draining = True
        try:
            while self._queue:
                command = self._queue.popleft()
                if isinstance(command, Flush):
                    await self.effects.flush()
                    # Other tasks ran meanwhile (a heartbeat answered, a result routed): the log
                    # marks where this batch went on.
                    if self.on_flushed is not None:
                        self.on_flushed()
                else:
                    self.effects.perform(command)
        finally:
            self._draining = False

    def drain_to_flush(self) -> bool:
        """``drain`` up to the next Flush, without awaiting it (a replay: the log says when the
        live run went on after it). True when it stopped at a Flush."""
        while self._queue:
            command = self._queue.popleft()
            if isinstance(command, Flush):
                return True
            self.effects.perform(command)
        return False

    def end_now(self, inp: Input) -> End | None:
        """After the run's scope was cancelled: decide with ``inp`` and perform only the end
        (the effects' tasks are gone). None when the end was decided before."""
        self._queue.clear()
        if self.ended:
            return None
        self.submit(inp)
        end = next(c for c in self._queue if isinstance(c, End))
        self._queue.clear()
        self.effects.perform(end)
        return end
