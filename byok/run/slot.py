"""RunSlot: the per-request_id meeting point of RunSSE and BidiAppend.

RunSSE and the first BidiAppend may arrive in either order, so whichever comes first
creates the slot. The slot owns the ordered frame channel (one writer: the RunSSE handler
currently attached) and the ordered inbox of client messages for the run task.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Literal

import trio

from byok.cursor.client_messages import ClientMessage
from byok.loop.turn_values import Outcome
from byok.run.bidi_order import AppendOrder

SlotKind = Literal["unknown", "agent", "relay"]

# How long ``flushed`` waits for a stream writer that is still sending. About the CPU work it
# precedes: a small frame's send took 0.1-0.2 ms and a 2.2 MB card's ~4.5 ms on a reading
# client (bench 4); a client slower than this holds up no run, its frames wait their turn.
FLUSH_WAIT_S = 0.005


class RunSlot:
    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.kind: SlotKind = "unknown"
        self.decided = trio.Event()  # kind is no longer "unknown"
        self.runsse_open = False  # a RunSSE came for this id: it is an agent request id
        self.order: AppendOrder[ClientMessage] = AppendOrder()
        # Encoded AgentServerMessages, then the run's outcome (the last item): buffered until a
        # RunSSE is attached; the run never waits on the client. http/ frames them.
        self._frames_send, self.frames = trio.open_memory_channel[bytes | Outcome](math.inf)
        self._inbox_send, self.inbox = trio.open_memory_channel[ClientMessage](math.inf)
        self._held: list[ClientMessage] = []
        self.run_started = False
        self.closed = False  # the outcome has been queued
        # Kept after it is queued: a RunSSE that reconnects after the run ended (its first stream
        # died with the end frame in it) must still learn how the run ended.
        self.outcome: Outcome | None = None
        self.finished = trio.Event()  # the run task has ended
        self._attached: trio.CancelScope | None = None
        self.attached_event = trio.Event()  # set when a RunSSE (re)attaches
        self.cancel_run: Callable[[], None] | None = None  # set while the run task lives
        self.on_reattach: Callable[[], None] | None = None  # run hook for a replacing RunSSE
        self.tap: Callable[[bytes], None] | None = None  # sees every message sent (a run's log)
        self.poll: object | None = None  # what a RunPoll client's polls were sent (http/run_poll.py)
        # A subagent's run: (parent request id, parent Task call id), bound by its first append
        # that names them; None until then (a root run never names them).
        self.parent: tuple[str, str] | None = None
        self._ever_attached = False
        # Frames queued, frames a writer has taken off the channel, and whether it is sending
        # them: what ``flushed`` waits on. ``_wrote`` is set (and replaced) at every change.
        self._queued = 0
        self._taken = 0
        self._sending = False
        self._wrote = trio.Event()

    def decide(self, kind: SlotKind) -> None:
        """Local agent run or relayed to upstream: decided once, by the first BidiAppend."""
        if self.kind == "unknown":
            self.kind = kind
            self.decided.set()

    # --- run side -------------------------------------------------------------
    def send(self, message: bytes) -> None:
        """Queue one encoded AgentServerMessage."""
        if self.closed:
            return
        self._frames_send.send_nowait(message)
        self._queued += 1
        if self.tap is not None:
            self.tap(message)

    def close(self, outcome: Outcome) -> None:
        """Queue how the run ended and close the stream: its EndStream is the last frame."""
        if self.closed:
            return
        self.closed = True
        self.outcome = outcome
        self._frames_send.send_nowait(outcome)
        self._queued += 1
        self._frames_send.close()
        self.order.clear()

    @property
    def sent(self) -> int:
        """How many messages the run has queued so far."""
        return self._queued

    async def flushed(self) -> None:
        """Until the frames queued so far are written to the attached stream, before the run goes
        on with CPU-heavy work (a provider request to build, a result to hash and commit), so
        that work does not hold them back. At most FLUSH_WAIT_S, and not at all without an
        attached stream; always a checkpoint. (The writer's send goes through several
        scheduling rounds in hypercorn: a fixed number of checkpoints let a 694-byte frame wait
        7 ms behind the next request's build.)"""
        target = self._queued
        await trio.lowlevel.checkpoint()
        with trio.move_on_after(FLUSH_WAIT_S):
            while (self._taken < target or self._sending) and self._attached is not None:
                await self._wrote.wait()

    def _progress(self) -> None:
        self._wrote.set()
        self._wrote = trio.Event()

    # --- bidi side ------------------------------------------------------------
    def deliver(self, message: ClientMessage) -> None:
        if not self.closed:
            self._inbox_send.send_nowait(message)

    def hold(self, message: ClientMessage) -> None:
        """Accept a message in seqno order, to be delivered by ``release``: a BidiAppend is
        answered before the run spends CPU on what it carries (Cursor sends its next append,
        such as a KV ACK, only after that answer)."""
        self._held.append(message)

    def bind_parent(self, parent: tuple[str, str]) -> str | None:
        """Bind the run to its parent run's Task call; the reason when it names another."""
        if self.parent is None:
            self.parent = parent
            return None
        if self.parent != parent:
            return f"the run is bound to parent {self.parent}, an append names {parent}"
        return None

    def release(self) -> None:
        """Deliver every held message, in order (whichever append handler gets here first)."""
        held, self._held = self._held, []
        for message in held:
            self.deliver(message)

    # --- RunSSE side ----------------------------------------------------------
    @contextmanager
    def writing(self, count: int) -> Iterator[None]:
        """Around the attached writer's send of ``count`` frames it took off ``frames``."""
        self._taken += count
        self._sending = True
        try:
            yield
        finally:
            self._sending = False
            self._progress()

    def attach(self, scope: trio.CancelScope, *, resume: bool = True) -> None:
        """A new RunSSE for this request id takes over the stream from any earlier one.
        ``resume=False``: a stream that re-sends what an earlier one lost by itself (a RunPoll's
        next poll), so the run has nothing to send again."""
        if self._attached is not None:
            self._attached.cancel()
        reattach = self._ever_attached and resume
        self._ever_attached = True
        self._attached = scope
        self.attached_event.set()
        if reattach and self.on_reattach is not None and not self.closed:
            self.on_reattach()

    def detach(self, scope: trio.CancelScope) -> bool:
        """Returns True when this was the attached stream (no newer RunSSE took over)."""
        if self._attached is scope:
            self._attached = None
            self.attached_event = trio.Event()
            self._progress()
            return True
        return False

    @property
    def attached(self) -> bool:
        return self._attached is not None


class RunRegistry:
    def __init__(self) -> None:
        self._slots: dict[str, RunSlot] = {}

    def get(self, request_id: str) -> RunSlot | None:
        return self._slots.get(request_id)

    def get_or_create(self, request_id: str) -> RunSlot:
        slot = self._slots.get(request_id)
        if slot is None:
            slot = self._slots[request_id] = RunSlot(request_id)
        return slot

    def remove(self, request_id: str, slot: RunSlot) -> None:
        if self._slots.get(request_id) is slot:
            del self._slots[request_id]

    def __len__(self) -> int:
        return len(self._slots)
