"""RunSlot: the per-request_id meeting point of RunSSE and BidiAppend.

RunSSE and the first BidiAppend may arrive in either order, so whichever comes first
creates the slot. The slot owns the ordered frame channel (one writer: the RunSSE handler
currently attached) and the ordered inbox of client messages for the run task.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

import trio

from byok.http.connect_envelope import encode_frame
from byok.pb.agent import v1 as agent
from byok.run.bidi_order import AppendOrder

SlotKind = Literal["unknown", "agent", "relay"]


class RunSlot:
    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.kind: SlotKind = "unknown"
        self.decided = trio.Event()  # kind is no longer "unknown"
        self.runsse_open = False  # a RunSSE came for this id: it is an agent request id
        self.order: AppendOrder[agent.AgentClientMessage] = AppendOrder()
        # Frames are buffered until a RunSSE is attached; the run never waits on the client.
        self._frames_send, self.frames = trio.open_memory_channel[bytes](math.inf)
        self._inbox_send, self.inbox = trio.open_memory_channel[agent.AgentClientMessage](math.inf)
        self._held: list[agent.AgentClientMessage] = []
        self.run_started = False
        self.closed = False  # the end-stream frame has been queued
        # Kept after it is queued: a RunSSE that reconnects after the run ended (its first stream
        # died with the end frame in it) must still learn how the run ended.
        self.end_frame: bytes | None = None
        self.finished = trio.Event()  # the run task has ended
        self._attached: trio.CancelScope | None = None
        self.attached_event = trio.Event()  # set when a RunSSE (re)attaches
        self.cancel_run: Callable[[], None] | None = None  # set while the run task lives
        self.on_reattach: Callable[[], None] | None = None  # run hook for a replacing RunSSE
        self._ever_attached = False

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
        self._frames_send.send_nowait(encode_frame(message))

    def close(self, end_stream: bytes) -> None:
        """Queue the end-stream frame (already enveloped) and close the stream: it is the last frame."""
        if self.closed:
            return
        self.closed = True
        self.end_frame = end_stream
        self._frames_send.send_nowait(end_stream)
        self._frames_send.close()
        self.order.clear()

    # --- bidi side ------------------------------------------------------------
    def deliver(self, message: agent.AgentClientMessage) -> None:
        if not self.closed:
            self._inbox_send.send_nowait(message)

    def hold(self, message: agent.AgentClientMessage) -> None:
        """Accept a message in seqno order, to be delivered by ``release``: a BidiAppend is
        answered before the run spends CPU on what it carries (Cursor sends its next append,
        such as a KV ACK, only after that answer)."""
        self._held.append(message)

    def release(self) -> None:
        """Deliver every held message, in order (whichever append handler gets here first)."""
        held, self._held = self._held, []
        for message in held:
            self.deliver(message)

    # --- RunSSE side ----------------------------------------------------------
    def attach(self, scope: trio.CancelScope) -> None:
        """A new RunSSE for this request id takes over the stream from any earlier one."""
        if self._attached is not None:
            self._attached.cancel()
        reattach = self._ever_attached
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
            return True
        return False

    @property
    def attached(self) -> bool:
        return self._attached is not None


async def let_ready_tasks_run() -> None:
    """Let the tasks that are ready now run before the caller goes on with CPU-heavy work: the
    stream writer woken by frames just queued, before hashing a checkpoint or building the next
    provider request. Trio runs a batch of ready tasks in either order; they were ready before
    our first checkpoint, so they have had their turn when the second returns."""
    await trio.lowlevel.checkpoint()
    await trio.lowlevel.checkpoint()


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
