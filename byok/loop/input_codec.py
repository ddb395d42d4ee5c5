"""The turn machine's inputs as JSON values, for a run's input log (run/run_log.py).

Compact and exact: provider events keep their text as is (lone surrogates included: JSON
escapes them), a staged assistant travels as its canonical encoding. A ``ToolDone`` is never
logged: it follows from a client message the log holds, through the same router.
"""

from __future__ import annotations

from typing import Any

from byok.loop.turn_values import (
    Begin,
    Cancel,
    Committed,
    Failed,
    Fault,
    Input,
    ModelEnded,
    ModelEvents,
    ModelFailed,
    Published,
)
from byok.model import events as ev
from byok.model.messages import Message, ReplayState
from byok.model.usage import Usage


class CodecError(ValueError):
    """A log line that is not an input this byok knows."""


def encode_event(e: ev.ModelEvent) -> list[Any]:
    match e:
        case ev.Started():
            return ["s"]
        case ev.TextDelta(text=text):
            return ["t", text]
        case ev.ThinkingDelta(text=text):
            return ["k", text]
        case ev.ThinkingEnded():
            return ["ke"]
        case ev.ToolCallStarted(index=index, call_id=call_id, name=name):
            return ["cs", index, call_id, name]
        case ev.ToolCallArgsDelta(index=index, delta=delta):
            return ["ca", index, delta]
        case ev.ToolCallEnded(index=index, arguments=arguments):
            return ["ce", index, arguments]
        case ev.UsageReported(usage=u):
            return [
                "u",
                u.input_tokens,
                u.output_tokens,
                u.cache_read_tokens,
                u.cache_write_tokens,
                u.reasoning_tokens,
            ]
        case ev.Done(reason=reason, replay=replay):
            if replay is None:
                return ["d", reason]
            return ["d", reason, replay.provider_kind, replay.data]
    raise CodecError(f"not a model event: {e!r}")


def decode_event(v: list[Any]) -> ev.ModelEvent:
    match v:
        case ["s"]:
            return ev.Started()
        case ["t", str(text)]:
            return ev.TextDelta(text)
        case ["k", str(text)]:
            return ev.ThinkingDelta(text)
        case ["ke"]:
            return ev.ThinkingEnded()
        case ["cs", int(index), str(call_id), str(name)]:
            return ev.ToolCallStarted(index, call_id, name)
        case ["ca", int(index), str(delta)]:
            return ev.ToolCallArgsDelta(index, delta)
        case ["ce", int(index), str(arguments)]:
            return ev.ToolCallEnded(index, arguments)
        case ["u", int(i), int(o), cr, cw, r]:
            return ev.UsageReported(Usage(i, o, cr, cw, r))
        case ["d", "stop" | "tool_use" as reason]:
            return ev.Done(reason)
        case ["d", "stop" | "tool_use" as reason, str(kind), str(data)]:
            return ev.Done(reason, ReplayState(kind, data))
    raise CodecError(f"not a model event: {v!r}")


def _failed(f: Failed) -> dict[str, Any]:
    return {"code": f.code, "message": f.message, "provider": f.provider, "overflow": f.overflow}


def encode_input(inp: Input) -> dict[str, Any]:
    match inp:
        case Begin():
            return {
                "k": "begin",
                "request_id": inp.request_id,
                "mode": inp.mode,
                "start": inp.start,
                "offered": sorted(inp.offered),
                "known": sorted(inp.known),
                "staged": None if inp.staged is None else inp.staged.encode().decode(),
                "context_limit": inp.context_limit,
                "estimate": inp.estimate,
                "summaries": inp.summaries,
                "summarizable": inp.summarizable,
            }
        case ModelEvents(events=events, now_s=now_s):
            return {"k": "model", "t": now_s, "e": [encode_event(e) for e in events]}
        case ModelEnded():
            return {"k": "model_end"}
        case ModelFailed(failure=f):
            return {"k": "model_failed", **_failed(f)}
        case Committed():
            return {"k": "committed"}
        case Published(kind=kind):
            return {"k": "published", "kind": kind}
        case Fault(failure=f):
            return {"k": "fault", **_failed(f)}
        case Cancel():
            return {"k": "cancel"}
    raise CodecError(f"not a logged input: {inp!r}")


def decode_input(obj: dict[str, Any]) -> Input:
    try:
        match obj["k"]:
            case "begin":
                staged = obj["staged"]
                return Begin(
                    request_id=obj["request_id"],
                    mode=obj["mode"],
                    start=obj["start"],
                    offered=frozenset(obj["offered"]),
                    known=frozenset(obj["known"]),
                    staged=None if staged is None else Message.decode(staged.encode()),
                    context_limit=obj.get("context_limit", 0),
                    estimate=obj.get("estimate", 0),
                    summaries=obj.get("summaries", 0),
                    summarizable=obj.get("summarizable", True),
                )
            case "model":
                return ModelEvents(tuple(decode_event(e) for e in obj["e"]), float(obj["t"]))
            case "model_end":
                return ModelEnded()
            case "model_failed":
                overflow = obj.get("overflow", False)
                return ModelFailed(Failed(obj["code"], obj["message"], obj["provider"], overflow))
            case "committed":
                return Committed()
            case "published":
                return Published(obj["kind"])
            case "fault":
                return Fault(Failed(obj["code"], obj["message"], obj["provider"]))
            case "cancel":
                return Cancel()
    except (KeyError, TypeError, ValueError) as e:
        raise CodecError(f"bad {obj.get('k')!r} line: {e}") from None
    raise CodecError(f"unknown line kind {obj.get('k')!r}")
