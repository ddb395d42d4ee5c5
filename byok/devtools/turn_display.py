"""What `byok simulate` shows of a turn as it happens: the model's text and thinking as they
stream, each tool the client runs with its result, and the questions it was asked."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TextIO

import betterproto2

from byok.devtools.cursor_sim import Recorded, interaction_answer
from byok.devtools.exec_client import Reply
from byok.devtools.workspace_exec import WorkspaceExecutor
from byok.pb.agent import v1 as agent

ARGS_SHOWN = 160  # characters of a tool's arguments
REFUSAL = "byok simulate answers no questions"


def _compact(message: betterproto2.Message) -> str:
    text = json.dumps(message.to_dict(), separators=(", ", ": "), ensure_ascii=False)
    return text if len(text) <= ARGS_SHOWN else text[: ARGS_SHOWN - 1] + "…"


class TurnDisplay:
    """Writes to ``out`` as frames and tool results arrive. ``frames``: one line per frame
    (its kind, and the text it carries) instead of the conversation view."""

    def __init__(self, out: TextIO, *, frames: bool = False) -> None:
        self.out = out
        self.frames = frames
        self._streaming: str | None = None  # "text" or "thinking" while a stream is open
        self.usage: agent.TurnEndedUpdate | None = None

    def _write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()

    def _stream(self, kind: str, text: str) -> None:
        if self._streaming != kind:
            self.end_line()
            if kind == "thinking":
                self._write("[thinking] ")
            self._streaming = kind
        self._write(text)

    def end_line(self) -> None:
        """Close an open text stream with a newline, so the next line starts on its own."""
        if self._streaming is not None:
            self._write("\n")
            self._streaming = None

    def line(self, text: str) -> None:
        self.end_line()
        self._write(text + "\n")

    # --- what the server sends -----------------------------------------------------------
    def frame(self, rec: Recorded) -> None:
        update = rec.message.interaction_update
        if update is not None and update.turn_ended is not None:
            self.usage = update.turn_ended
        if self.frames:
            detail = ""
            if update is not None and update.text_delta is not None:
                detail = f" {update.text_delta.text!r}"
            elif update is not None and update.thinking_delta is not None:
                detail = f" {update.thinking_delta.text!r}"
            self.line(f"frame: {rec.kind}{detail}")
            return
        if update is not None and update.text_delta is not None:
            self._stream("text", update.text_delta.text)
        elif update is not None and update.thinking_delta is not None:
            self._stream("thinking", update.thinking_delta.text)

    def query(self, query: agent.InteractionQuery) -> list[agent.AgentClientMessage]:
        """A question for the user (approve a web search, switch modes, answer the model): shown,
        and refused, as nobody is there to answer it."""
        name, value = betterproto2.which_one_of(query, "query")
        self.line(f"[question] {name}: {_compact(value) if value is not None else ''} (refused: {REFUSAL})")
        refusal = _REFUSALS.get(name)
        return [] if refusal is None else [interaction_answer(query, **refusal())]

    # --- what the workspace answers ------------------------------------------------------
    def exec_started(self, msg: agent.ExecServerMessage) -> None:
        if self.frames:
            return
        name, args = betterproto2.which_one_of(msg, "message")
        self.line(f"[tool] {name.removesuffix('_args')} {_compact(args) if args is not None else ''}")

    def exec_reply(self, msg: agent.AgentClientMessage) -> None:
        if self.frames:
            return
        if (control := msg.exec_client_control_message) is not None:
            if control.throw is not None:
                self.line(f"[result] error: {control.throw.error}")
            return
        if (inner := msg.exec_client_message) is None:
            return
        field, value = betterproto2.which_one_of(inner, "message")
        if field == "shell_stream":
            event, data = betterproto2.which_one_of(value, "event")
            if event in ("stdout", "stderr"):
                for text in data.data.splitlines():
                    self.line(f"  | {text}")
            elif event == "exit":
                self.line(f"[result] shell exit {data.code}")
            elif event != "start":
                self.line(f"[result] shell {event}")
            return
        variant, _ = betterproto2.which_one_of(value, "result") if value is not None else ("", None)
        self.line(f"[result] {field.removesuffix('_result')}: {variant or 'done'}")


# query oneof -> the InteractionResponse field (and value) that refuses it
_REFUSALS: dict[str, Any] = {
    "web_search_request_query": lambda: {
        "web_search_request_response": agent.WebSearchRequestResponse(
            rejected=agent.WebSearchRequestResponseRejected(reason=REFUSAL)
        )
    },
    "web_fetch_request_query": lambda: {
        "web_fetch_request_response": agent.WebFetchRequestResponse(
            rejected=agent.WebFetchRequestResponseRejected(reason=REFUSAL)
        )
    },
    "switch_mode_request_query": lambda: {
        "switch_mode_request_response": agent.SwitchModeRequestResponse(
            rejected=agent.SwitchModeRequestResponseRejected(reason=REFUSAL)
        )
    },
    "ask_question_interaction_query": lambda: {
        "ask_question_interaction_response": agent.AskQuestionInteractionResponse(
            result=agent.AskQuestionResult(rejected=agent.AskQuestionRejected(reason=REFUSAL))
        )
    },
    "create_plan_request_query": lambda: {
        "create_plan_request_response": agent.CreatePlanRequestResponse(
            result=agent.CreatePlanResult(error=agent.CreatePlanError(error=REFUSAL))
        )
    },
}


class ShownWorkspace(WorkspaceExecutor):
    """The simulator's workspace, showing each exec and what it answered."""

    def __init__(self, root: Path, display: TurnDisplay) -> None:
        super().__init__(root)
        self.display = display

    async def run(self, msg: agent.ExecServerMessage, reply: Reply, *, delay: float = 0.0) -> None:
        self.display.exec_started(msg)

        async def shown(out: agent.AgentClientMessage) -> None:
            self.display.exec_reply(out)
            await reply(out)

        await super().run(msg, shown, delay=delay)
