"""The turn machine's values: what it is told (inputs), what it asks for (commands), how a run
ends (outcomes) and the turn's steps. All frozen; the machine itself is loop/turn.py.

Cursor's own types stay out: a tool's result travels as ``result`` (opaque here: the run layer
keeps the typed card in it) with the canonical string the model sees.
"""

from __future__ import annotations

from typing import Literal

import attrs

from byok.loop.emits import Emit
from byok.model import events as ev
from byok.model.images import ImagePart
from byok.model.messages import Message, ToolCall
from byok.model.usage import Usage

# --- outcomes ---------------------------------------------------------------------------------


@attrs.frozen
class Succeeded:
    pass


@attrs.frozen
class Canceled:
    pass


@attrs.frozen
class Failed:
    code: str  # a Connect error code
    message: str
    provider: bool = False  # a provider's failure: the client shows it as the provider's error
    # The provider said the request did not fit the model's context window: the turn may
    # compact its history and call again.
    overflow: bool = attrs.field(default=False, eq=False)


Outcome = Succeeded | Canceled | Failed


class FailedError(Exception):
    """A step of a run failed the way its client is told (the start point, a provider call):
    ``failure`` is the outcome the run ends with."""

    def __init__(self, failure: Failed) -> None:
        super().__init__(f"{failure.code}: {failure.message}")
        self.failure = failure


# --- steps of the turn (what its checkpoints list) ---------------------------------------------


@attrs.frozen
class ThinkingStep:
    text: str
    duration_ms: int


@attrs.frozen
class AnswerStep:
    text: str


@attrs.frozen
class ToolStep:
    call_id: str
    result: object  # the tool's result with its card (run layer's), opaque here


Step = ThinkingStep | AnswerStep | ToolStep

# --- checkpoints to publish -------------------------------------------------------------------


@attrs.frozen
class StagedCheckpoint:
    """A round's staged checkpoint: the assistant with its calls travels inline, uncommitted."""

    assistant: Message
    steps: tuple[Step, ...]


@attrs.frozen
class SettledCheckpoint:
    """Every committed message is a root: the round is complete."""

    steps: tuple[Step, ...]


@attrs.frozen
class FinalCheckpoints:
    """The turn's end: turn_ended, staged, settled, settled again. ``answer`` None: the answer
    was committed by an earlier run (a resume from the turn-end staged checkpoint)."""

    steps: tuple[Step, ...]
    answer: Message | None
    usage: Usage | None
    # A compaction run's end (summarize_action): the compacted checkpoint three times.
    compacted: bool = False
    # A user's shell command's end (shell_command_action): its outcome, opaque here (the run
    # layer makes the shell turn of it); the checkpoint with that turn three times.
    shell: object = None


@attrs.frozen
class ResultBlobs:
    """A tool result's blobs, SET ahead of its commit: its root, its step (a tool with a card),
    and with the round's last result the turn's structure over ``settled_steps``."""

    message: Message
    step: ToolStep | None
    settled_steps: tuple[Step, ...] | None


Ahead = StagedCheckpoint | FinalCheckpoints | ResultBlobs

# --- inputs ------------------------------------------------------------------------------------

Start = Literal["call", "tools", "final", "compact", "shell"]


@attrs.frozen
class Begin:
    """The start point is committed: what the run does first, and what it may offer."""

    request_id: str
    mode: str
    # call the model / run a staged round again / publish the final checkpoints / compact the
    # history and end (summarize_action)
    start: Start
    offered: frozenset[str]  # the tools the model was offered in this mode
    known: frozenset[str]  # every tool byok has (to tell "unknown" from "not in this mode")
    staged: Message | None = None  # start == "tools": the staged round's assistant
    # Compaction: the most input tokens a request may have (0: never compact on its own), the
    # estimated size of the run's first request, and how many summaries the history holds.
    context_limit: int = 0
    estimate: int = 0
    summaries: int = 0
    # A compaction before the first call could make it fit: there is history before the run's
    # new message, and that message alone fits (compaction.worth_compacting).
    summarizable: bool = True


@attrs.frozen
class ModelEvents:
    events: tuple[ev.ModelEvent, ...]
    now_s: float  # monotonic, for the thinking card's duration


@attrs.frozen
class ModelEnded:
    """The provider stream ended cleanly (retries and all)."""


@attrs.frozen
class ModelFailed:
    failure: Failed


@attrs.frozen
class ToolDone:
    call_id: str
    content: str  # what the model sees
    is_error: bool
    result: object  # the card (opaque here)
    images: tuple[ImagePart, ...] = ()  # what the model sees besides the content


@attrs.frozen
class ModeSwitched:
    """A tool of the round switched the conversation's mode (SwitchMode, approved): the turn's
    next model call uses ``mode``'s prompt and ``offered`` tools."""

    mode: str
    offered: frozenset[str]


@attrs.frozen
class Committed:
    pass


@attrs.frozen
class Published:
    kind: Literal["staged", "settled", "final"]


@attrs.frozen
class Fault:
    """An effect failed (the store, a blob SET, the start point, a bug): the run ends with it."""

    failure: Failed


@attrs.frozen
class Cancel:
    pass


Input = (
    Begin
    | ModelEvents
    | ModelEnded
    | ModelFailed
    | ToolDone
    | ModeSwitched
    | Committed
    | Published
    | Fault
    | Cancel
)

# --- commands ----------------------------------------------------------------------------------


@attrs.frozen
class CallModel:
    """Render the committed history and stream it. ``gated``: the last round's settled checkpoint
    is still being published; nothing of this call may reach the client before it."""

    model_call_id: str
    gated: bool = False
    # A compaction call: the history with the compaction instruction after it; its output is
    # the summary, not an answer.
    compact: bool = False


@attrs.frozen
class Show:
    """Put these on the client's screen, in order (one command for a provider chunk's events)."""

    emits: tuple[Emit, ...]


@attrs.frozen
class Flush:
    """Let the stream writer put what is queued on the wire before the next CPU-heavy step."""


@attrs.frozen
class Commit:
    """Append ``messages`` to the history; ``ahead``: blobs to SET before the commit, so the
    client ACKs them while the store writes."""

    messages: tuple[Message, ...]
    ahead: Ahead | None = None
    # The messages start a new history (a compaction's summary): a new root revision, the older
    # messages left in theirs.
    rebase: bool = False


@attrs.frozen
class Publish:
    """SET what the checkpoint references and wait for the client's ACKs (``Published``)."""

    checkpoint: StagedCheckpoint | SettledCheckpoint | FinalCheckpoints


@attrs.frozen
class Reveal:
    """Send the published checkpoint's frames (final: turn_ended, staged, settled, settled)."""

    kind: Literal["staged", "settled", "final"]


@attrs.frozen
class RunTools:
    """Dispatch the round's calls in call order; ``refused`` (call id, error text) get that
    error as their result and are never executed."""

    model_call_id: str
    calls: tuple[ToolCall, ...]
    refused: tuple[tuple[str, str], ...] = ()


@attrs.frozen
class RunShellCommand:
    """Run the command the user ran from the chat (shell_command_action); it ends as a ToolDone."""


@attrs.frozen
class UseMode:
    """From the next model call on, use ``mode``'s prompt and tools (and record it in checkpoints)."""

    mode: str


@attrs.frozen
class ShowToolDone:
    """A committed result's completed card."""

    call_id: str
    result: object
    model_call_id: str


@attrs.frozen
class CallUsage:
    """A provider call's usage: the context meter's latest reading."""

    usage: Usage


@attrs.frozen
class End:
    outcome: Outcome
    usage: Usage | None


Command = (
    CallModel
    | Show
    | Flush
    | Commit
    | Publish
    | Reveal
    | RunTools
    | RunShellCommand
    | UseMode
    | ShowToolDone
    | CallUsage
    | End
)
