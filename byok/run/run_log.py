"""A run's input log: JSON lines that let `byok replay` run it again with no network, no trio and
no database (run/replay.py).

Line by line: ``start`` (what the start point left: the history, the turn so far, what the
client holds, the request's settings; the frames the start point sent, blob GETs, are not
replayed), then in the order the run took them every input that
came from outside the machine (``loop/input_codec.py``) and every client message as its bytes
(``client``; the results and cancels they carry are derived again on replay), ``flushed`` where
the run went on after letting the stream writer through (what other tasks did meanwhile comes
before it), a ``reattach`` when a RunSSE came back, ``work`` (a tool's server work finished,
with its result), ``mode`` (the run switched modes: the new mode's prompt and tools; a replay
reads these first), ``target`` (an alias's call moved to its next model before any output: the
call is made again with that model's settings), and ``end``: how many frames the run sent and
their SHA-256, each provider request's SHA-256 and the outcome, which a replay must reproduce.

Kept only with ``[logging] record_runs = true`` (tests always record).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import IO, Any

from byok.cursor.request import encode_start
from byok.cursor.tools.work import WorkResult, encode_result
from byok.loop.input_codec import encode_input
from byok.loop.turn_values import Canceled, Failed, Input, Outcome, Succeeded
from byok.model.request import ToolSpec
from byok.run.context import RunContext
from byok.run.provider_call import model_settings


def outcome_json(outcome: Outcome | None) -> dict[str, Any]:
    match outcome:
        case Succeeded():
            return {"status": "success"}
        case Canceled():
            return {"status": "canceled"}
        case Failed(code=code, message=message, provider=provider):
            return {"status": "error", "code": code, "message": message, "provider": provider}
    return {"status": "none"}


class FrameDigest:
    """How many frames a run sent and the SHA-256 over them, each prefixed with its length."""

    def __init__(self) -> None:
        self.count = 0
        self._sha = hashlib.sha256()

    def add(self, message: bytes) -> None:
        self.count += 1
        self._sha.update(len(message).to_bytes(8, "big"))
        self._sha.update(message)

    def hexdigest(self) -> str:
        return self._sha.hexdigest()


def target_fields(c: RunContext) -> dict[str, Any]:
    """What a provider request takes from the run's model and provider (an alias's failover
    changes them: a ``target`` line)."""
    settings = model_settings(c.model, c.provider, c.start.conversation_id)
    return {
        "provider_kind": c.provider.kind,
        "settings": {
            "upstream_model": settings.upstream_model,
            "max_output_tokens": settings.max_output_tokens,
            "replay_reasoning_on_tool_turns": settings.replay_reasoning_on_tool_turns,
            "extra_body": [[k, v] for k, v in settings.extra_body],
            "prompt_cache": settings.prompt_cache,
            "eager_input_streaming": settings.eager_input_streaming,
            "cache_key": settings.cache_key,
            "vision": settings.vision,
        },
        "context_tokens": c.model.context_tokens,
    }


def start_line(ctx: RunContext, kv_next_id: int) -> dict[str, Any]:
    c = ctx
    head = c.head
    return {
        "k": "start",
        "run": encode_start(c.start),
        **target_fields(c),
        "mode": c.mode,
        "backends": sorted(c.tool_env.backends),
        "system": c.assets.system,
        "compaction": c.deps.prompts["compaction"].system if "compaction" in c.deps.prompts else "",
        "tools": spec_rows(c.tool_specs),
        "head": {
            "conversation_id": head.conversation_id,
            "revision_id": head.revision_id,
            "version": head.version,
            "messages": [m.encode().decode() for m in head.messages],
            # The bytes of the history's images (a message's encoding holds their references). A
            # message still undecoded has none: the store decodes the ones with images.
            "images": {
                p.sha256: p.base64() for m in head.messages if m.stored_size is None for p in m.attachments
            },
        },
        "prior_turns": [t.hex() for t in c.prior_turns],
        "turn": {
            "request_id": c.turn.request_id,
            "user_message": c.turn.user_message.hex(),
            "steps": [s.hex() for s in c.turn.steps],
        },
        "details": bytes(c.details).hex(),
        "acked": sorted(b.hex() for b in c.memory.acked),
        "root_ids": {k.hex(): v.id.hex() for k, v in c.memory.root_ids.items()},
        "kv_next_id": kv_next_id,
        # Frames the start point sent (blob GETs of an import or a resume): what they brought
        # is above; a replay starts after them.
        "prelude_frames": c.slot.sent,
    }


def spec_rows(tools: tuple[ToolSpec, ...]) -> list[list[str]]:
    return [[t.name, t.description, t.parameters_json] for t in tools]


def run_log_path(data_dir: Path, request_id: str) -> Path:
    """Where a run's log goes. Request ids are the client's strings: one that is not a plain
    name is named by its digest, so no id can name a path outside ``runs/``."""
    name = request_id if re.fullmatch(r"[A-Za-z0-9_-]{1,128}", request_id) else ""
    if not name:
        name = "rid-" + hashlib.sha256(request_id.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return data_dir / "runs" / f"{name}.jsonl"


class RunLog:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file: IO[str] | None = path.open("w", encoding="utf-8")
        self.frames = FrameDigest()
        self.requests: list[str] = []

    def _line(self, obj: dict[str, Any]) -> None:
        if self._file is not None:
            self._file.write(json.dumps(obj, separators=(",", ":")) + "\n")

    def start(self, ctx: RunContext, kv_next_id: int) -> None:
        self._line(start_line(ctx, kv_next_id))

    def input(self, inp: Input) -> None:
        self._line(encode_input(inp))

    def client(self, data: bytes) -> None:
        self._line({"k": "client", "data": data.hex()})

    def flushed(self) -> None:
        self._line({"k": "flushed"})

    def work(self, call_id: str, result: WorkResult) -> None:
        """Server work a tool asked for finished with ``result`` (a replay hands it back)."""
        self._line({"k": "work", "call_id": call_id, "result": encode_result(result)})

    def mode(self, mode: str, system: str, tools: tuple[ToolSpec, ...]) -> None:
        """The run switched to ``mode``: what its model calls and checkpoints use from then on."""
        self._line({"k": "mode", "mode": mode, "system": system, "tools": spec_rows(tools)})

    def target(self, ctx: RunContext) -> None:
        """An alias's call moved to its next target before any output (run/failover.py): the
        same call is made again with this model's settings (a replay renders it again)."""
        self._line({"k": "target", **target_fields(ctx)})

    def reattach(self) -> None:
        self._line({"k": "reattach"})

    def request(self, body: bytes) -> None:
        self.requests.append(hashlib.sha256(body).hexdigest())

    def end(self, outcome: Outcome | None) -> None:
        self._line(
            {
                "k": "end",
                "frames": self.frames.count,
                "frames_sha256": self.frames.hexdigest(),
                "requests": self.requests,
                "outcome": outcome_json(outcome),
            }
        )
        if self._file is not None:
            self._file.close()
            self._file = None
