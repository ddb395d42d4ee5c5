"""A long conversation's stored history: realistic exchanges of user, tool rounds and answers
(benchmarks 5 and 11)."""

from __future__ import annotations

import json

from byok.model.messages import Message, ToolCall
from tests.bench.common import size

N_BLOCKS = size(500, 100)  # x 10 messages
LONG_CONV = "long-conv"
_LOREM = (
    "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt ut "
    "labore et dolore magna aliqua. Ut enim ad minim veniam, quis nostrud exercitation ullamco. "
)


def filler(n: int, seed: int) -> str:
    s = f"[{seed}] " + _LOREM * (n // len(_LOREM) + 2)
    return s[:n]


def code(n: int, seed: int) -> str:
    lines = [
        f"{i + 1:6d}|    value_{seed}_{i} = compute(value_{seed}_{i - 1}, {i})" for i in range(n // 48 + 1)
    ]
    return "\n".join(lines)[:n]


def block(b: int) -> list[Message]:
    """One realistic exchange: user, a round of 4 Reads, a round of 2 Greps, the final answer."""
    out = [Message(role="user", origin="runtime", text=f"<user_query>{filler(300, b)}</user_query>")]
    for tag, name, n in (("a", "Read", 4), ("b", "Grep", 2)):
        round_id = f"round-{b}-{tag}"
        calls = tuple(
            ToolCall(f"call-{b}-{tag}{k}", name, json.dumps({"path": f"src/mod{b}_{k}.py"}), k)
            for k in range(n)
        )
        out.append(
            Message(
                role="assistant",
                origin="assistant",
                text="Looking.",
                tool_calls=calls,
                tool_round_id=round_id,
                model_call_id=f"mc-{b}-{tag}",
            )
        )
        out += [
            Message(
                role="tool",
                origin="tool",
                text=code(1500, b * 10 + k),
                tool_call_id=c.call_id,
                tool_name=name,
                tool_round_id=round_id,
                completion_seq=k + 1,
            )
            for k, c in enumerate(calls)
        ]
    out.append(Message(role="assistant", origin="assistant", text=filler(600, b), model_call_id=f"mc-{b}"))
    return out
