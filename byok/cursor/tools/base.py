"""The shape every Cursor tool has (sans-IO).

A tool is a ``ToolDef``: how the model sees it (name), how Cursor draws it (the ``ToolCall``
oneof field, an empty placeholder, the record with arguments), how its complete arguments
are validated, its transport, and an ``Execution`` state machine that turns the validated call
into round-trips and, finally, one ``ToolOutcome``.

Transports (seeds 000 §26.13): ``exec`` (ExecServerMessage, answered by ExecClientMessage),
``interaction`` (InteractionQuery, answered by InteractionResponse; its own id counter),
``local`` (byok forms the result itself: no client round-trip). An interaction whose answer is
only an approval may go on with an Exec (WebFetch) or with server work (``StartWork``).

An Execution never does I/O. It returns ``Action`` values; cursor/exec_router.py performs
them for the run layer: it assigns Exec and query ids, sends the messages, routes the client's
answers back by id, forwards UI updates, hands server work and turn notes to the run; the run
commits the outcome. One transport per tool: an Execution only ever sends its own tool's
variants (Write/StrReplace: a hidden read, then a write).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

import attrs

from byok.model.images import ImagePart
from byok.pb.agent import v1 as agent

_INT32_MAX = 2**31 - 1


class ToolArgError(Exception):
    """The model's arguments are unusable. The message is returned to the model as a tool error."""


@attrs.frozen
class Invocation:
    call_id: str
    name: str
    model_call_id: str
    args: Mapping[str, Any]  # validated and normalised by ToolDef.parse
    # The run's view for tools that need more than their arguments (cursor/tools/env.py).
    env: Any = attrs.field(default=None, eq=False, repr=False)


@attrs.frozen
class ToolOutcome:
    """The terminal result of one call, in both views: the canonical string for the model and
    the typed ToolCall (args + result) for Cursor's card."""

    content: str
    is_error: bool
    ui: agent.ToolCall
    # Images the model sees with the content (a Read of an image file, for a model with vision).
    images: tuple[ImagePart, ...] = ()
    # The encoded card, shared by the tool_call_completed frame and the turn's step blob (a Read's
    # card holds the whole file). ``ui`` must not be mutated once it has been encoded.
    _ui_bytes: list[bytes] = attrs.field(factory=list, init=False, eq=False, repr=False, hash=False)

    def ui_bytes(self) -> bytes:
        if not self._ui_bytes:
            self._ui_bytes.append(bytes(self.ui))
        return self._ui_bytes[0]

    def with_ui_bytes(self, data: bytes) -> ToolOutcome:
        """This outcome with ``bytes(ui)`` already known (a tool's own byte-identical encoder)."""
        self._ui_bytes[:] = [data]
        return self


@attrs.frozen
class SendExec:
    """Send this Exec to the client. The run layer sets ``id`` (a per-run counter) and ``exec_id``."""

    message: agent.ExecServerMessage


@attrs.frozen
class SendQuery:
    """Send this InteractionQuery to the client. The run layer sets ``id`` (the run's interaction
    counter, separate from the Exec counter); the answer comes back to ``on_answer``."""

    query: agent.InteractionQuery


@attrs.frozen
class StartWork:
    """Work byok does itself, with I/O (a web search, an image): the run layer performs ``work``
    (a value of cursor/tools/work.py) and hands its result to ``on_work``."""

    work: Any


@attrs.frozen
class Note:
    """Something the turn must know before its next model call (a mode switch): the run turns
    it into an input of the turn machine. It does not end the call."""

    note: Any


@attrs.frozen
class Update:
    """An interaction update to show while the tool runs (tool_call_delta, shell_output_delta)."""

    update: agent.InteractionUpdate


@attrs.frozen
class Finish:
    outcome: ToolOutcome


Action = SendExec | SendQuery | StartWork | Note | Update | Finish


class Execution(Protocol):
    def start(self) -> list[Action]:
        """The first actions: usually one SendExec."""
        ...

    def on_result(self, msg: agent.ExecClientMessage) -> list[Action]:
        """A client message for an Exec this execution sent (matched by id by the run layer)."""
        ...

    def on_stream_close(self) -> list[Action]:
        """The client closed the Exec stream. After a terminal result this is a no-op ([])."""
        ...

    def on_throw(self, error: str) -> list[Action]:
        """The client failed to run the Exec (ExecClientThrow)."""
        ...


class Phased:
    """A base for Executions past one Exec: every callback the tool does not expect finishes the
    call with a protocol error for the model (never a guess), and later ones are ignored."""

    done = False

    def start(self) -> list[Action]:
        raise NotImplementedError

    def finish(self, outcome: ToolOutcome) -> list[Action]:
        self.done = True
        return [Finish(outcome)]

    def fail(self, message: str) -> list[Action]:
        """The tool's error outcome for ``message``; subclasses give it their typed card."""
        raise NotImplementedError

    def _unexpected(self, what: str) -> list[Action]:
        return [] if self.done else self.fail(f"protocol error: unexpected {what}")

    def on_result(self, msg: agent.ExecClientMessage) -> list[Action]:
        return self._unexpected("exec result")

    def on_stream_close(self) -> list[Action]:
        if self.done:
            return []
        return self.fail("the client closed the tool stream before sending a result")

    def on_throw(self, error: str) -> list[Action]:
        if self.done:
            return []
        return self.fail(error or "the client failed to run the tool")

    def on_answer(self, response: agent.InteractionResponse) -> list[Action]:
        return self._unexpected("interaction response")

    def on_work(self, result: Any) -> list[Action]:
        return self._unexpected("work result")


class ArgsStream(Protocol):
    """Incremental view of the arguments while the model is still writing them."""

    def feed(self, delta: str) -> list[agent.ToolCallDelta]: ...


@attrs.frozen
class ToolDef:
    name: str  # the model-visible name
    ui_field: str  # the ToolCall oneof field that draws this tool's card
    placeholder: Callable[[], Any]  # the empty typed record for partial_tool_call
    parse: Callable[[Mapping[str, Any]], Mapping[str, Any]]  # raises ToolArgError
    ui: Callable[[Mapping[str, Any]], Any]  # the typed record with arguments (no result yet)
    execute: Callable[[Invocation], Execution]
    args_stream: Callable[[], ArgsStream] | None = None
    transport: str = "exec"  # "exec" | "interaction" | "local" (documentation and the tool table)
    # A server-side backend the tool needs ("search", "images"): offered only when configured.
    backend: str | None = None

    def tool_call(self, record: Any) -> agent.ToolCall:
        # A tool whose card depends on its arguments (CallMcpTool's mcp_auth) returns the whole
        # ToolCall from ``ui``.
        if isinstance(record, agent.ToolCall):
            return record
        return agent.ToolCall(**{self.ui_field: record})


class OneShot:
    """An Execution for tools whose single Exec answers with one terminal result."""

    def __init__(
        self,
        exec_message: agent.ExecServerMessage,
        on_result: Callable[[agent.ExecClientMessage], ToolOutcome],
        on_failure: Callable[[str], ToolOutcome],
    ) -> None:
        self._exec = exec_message
        self._map = on_result
        self._fail = on_failure
        self._done = False

    def start(self) -> list[Action]:
        return [SendExec(self._exec)]

    def on_result(self, msg: agent.ExecClientMessage) -> list[Action]:
        if self._done:
            return []
        self._done = True
        return [Finish(self._map(msg))]

    def on_stream_close(self) -> list[Action]:
        if self._done:
            return []
        self._done = True
        return [Finish(self._fail("the client closed the tool stream before sending a result"))]

    def on_throw(self, error: str) -> list[Action]:
        if self._done:
            return []
        self._done = True
        return [Finish(self._fail(error or "the client failed to run the tool"))]


# --- argument helpers shared by tool modules ---------------------------------------------------


def require_str(args: Mapping[str, Any], key: str, *, allow_empty: bool = False) -> str:
    if key not in args:
        raise ToolArgError(f"missing required argument '{key}'")
    value = args[key]
    if not isinstance(value, str):
        raise ToolArgError(f"argument '{key}' must be a string, got {type(value).__name__}")
    if not allow_empty and not value:
        raise ToolArgError(f"argument '{key}' must not be empty")
    return value


def optional_str(args: Mapping[str, Any], key: str) -> str | None:
    value = args.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise ToolArgError(f"argument '{key}' must be a string, got {type(value).__name__}")
    return value


def optional_int(args: Mapping[str, Any], key: str, *, minimum: int | None = None) -> int | None:
    value = args.get(key)
    if value is None:
        return None
    # A float with no fractional part is what some models send for integers.
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ToolArgError(f"argument '{key}' must be an integer, got {type(value).__name__}")
    if minimum is not None and value < minimum:
        raise ToolArgError(f"argument '{key}' must be >= {minimum}, got {value}")
    return value


def int32_arg(args: Mapping[str, Any], key: str, *, minimum: int | None = None) -> int | None:
    # The wire fields are int32: a larger value would fail only when the Exec is encoded.
    value = optional_int(args, key, minimum=minimum)
    if value is not None and abs(value) > _INT32_MAX:
        raise ToolArgError(f"argument '{key}' is out of range: {value}")
    return value


def optional_text(args: Mapping[str, Any], key: str) -> str | None:
    """An optional string where "" means "not given" (models often send empty strings for defaults)."""
    return optional_str(args, key) or None


def optional_bool(args: Mapping[str, Any], key: str) -> bool | None:
    value = args.get(key)
    if value is None:
        return None
    if not isinstance(value, bool):
        raise ToolArgError(f"argument '{key}' must be a boolean, got {type(value).__name__}")
    return value


def string_list(args: Mapping[str, Any], key: str) -> list[str]:
    value = args.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ToolArgError(f"argument '{key}' must be a list of strings")
    return list(value)
