"""Turn 2 of a tool loop, per provider kind: the turn-1 stream goes through the parser and the
loop's model-call fold into an assistant turn, and the turn-2 request that sends it back,
followed by the tool results, must equal an exact body."""

from __future__ import annotations

import json
from pathlib import Path

from byok.loop.model_call import ModelCall
from byok.model.request import AssistantTurn, ModelRequest, ModelSettings, ToolResultTurn, ToolSpec, UserTurn
from byok.providers import (
    anthropic_request,
    anthropic_stream,
    openai_chat_request,
    openai_chat_stream,
    openai_responses_request,
    openai_responses_stream,
)
from byok.providers.runner import StreamParser

FIXTURES = Path(__file__).parent.parent / "fixtures"
TOOL = ToolSpec("read_file", "Read a file", '{"type":"object"}')


def turn_from_stream(parser: StreamParser, raw: bytes) -> AssistantTurn:
    call = ModelCall("mc-1")
    for i, event in enumerate(parser.feed(raw) + parser.end()):
        call.handle(event, float(i))
    m = call.result().message
    return AssistantTurn(m.text, m.thinking, m.replay, m.tool_calls)


def turn2(turn: AssistantTurn, *results: tuple[str, str]) -> ModelRequest:
    history = (
        UserTurn("Read a.py and b.py"),
        turn,
        *(ToolResultTurn(call_id, "read_file", content) for call_id, content in results),
    )
    return ModelRequest("sys", (TOOL,), history, ModelSettings("model-x"))


def test_openai_responses_turn2() -> None:
    raw = (FIXTURES / "openai_responses" / "reasoning_tools.sse").read_bytes()
    turn = turn_from_stream(openai_responses_stream.ResponsesStreamParser(), raw)
    assert turn.text == "Reading." and turn.thinking == "**Plan**\n\nRead both files."
    body = openai_responses_request.build_request(turn2(turn, ("call_a", "A"), ("call_b", "B")))
    assert body.decode() == (
        '{"model":"model-x","stream":true,"store":false,"include":["reasoning.encrypted_content"],'
        '"instructions":"sys","input":['
        '{"role":"user","content":"Read a.py and b.py"},'
        '{"type":"reasoning","id":"rs_1","summary":[{"text":"**Plan**","type":"summary_text"},'
        '{"text":"Read both files.","type":"summary_text"}],"encrypted_content":"enc-final"},'
        '{"type":"message","role":"assistant","id":"msg_2","content":[{"type":"output_text","text":"Reading."}]},'
        '{"type":"function_call","id":"fc_1","call_id":"call_a","name":"read_file",'
        '"arguments":"{\\"path\\": \\"a.py\\"}"},'
        '{"type":"function_call","id":"fc_2","call_id":"call_b","name":"read_file",'
        '"arguments":"{\\"path\\": \\"b.py\\"}"},'
        '{"type":"function_call_output","call_id":"call_a","output":"A"},'
        '{"type":"function_call_output","call_id":"call_b","output":"B"}],'
        '"tools":[{"type":"function","name":"read_file","description":"Read a file",'
        '"parameters":{"type":"object"},"strict":false}]}'
    )


def test_anthropic_turn2() -> None:
    raw = (FIXTURES / "anthropic" / "thinking_tools.sse").read_bytes()
    turn = turn_from_stream(anthropic_stream.AnthropicStreamParser(), raw)
    assert turn.text == "Reading." and turn.thinking == "I should read both files."
    body = anthropic_request.build_request(turn2(turn, ("toolu_a", "A"), ("toolu_b", "B")))
    assert body.decode() == (
        '{"model":"model-x","max_tokens":8192,"stream":true,"system":"sys","messages":['
        '{"role":"user","content":"Read a.py and b.py"},'
        '{"role":"assistant","content":['
        '{"type":"thinking","thinking":"I should read both files.","signature":"sig-AAA="},'
        '{"type":"redacted_thinking","data":"opaque-BBB"},'
        '{"type":"text","text":"Reading."},'
        '{"type":"tool_use","id":"toolu_a","name":"read_file","input":{"path":"a.py"}},'
        '{"type":"tool_use","id":"toolu_b","name":"list_dir","input":{}}]},'
        '{"role":"user","content":['
        '{"type":"tool_result","tool_use_id":"toolu_a","content":"A"},'
        '{"type":"tool_result","tool_use_id":"toolu_b","content":"B"}]}],'
        '"tools":[{"name":"read_file","description":"Read a file","input_schema":{"type":"object"}}]}'
    )


def _chat_chunk(delta: dict[str, object], finish: str | None = None, usage: object = None) -> bytes:
    obj = {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}], "usage": usage}
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def test_openai_chat_turn2() -> None:
    start = {
        "index": 0,
        "id": "call_a",
        "type": "function",
        "function": {"name": "read_file", "arguments": ""},
    }
    raw = b"".join(
        [
            _chat_chunk({"role": "assistant", "content": None, "reasoning_content": "Need "}),
            _chat_chunk({"content": None, "reasoning_content": "a.py."}),
            _chat_chunk({"content": "Reading."}),
            _chat_chunk({"tool_calls": [start]}),
            _chat_chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"path": "a.py"}'}}]}),
            _chat_chunk({}, "tool_calls", {"prompt_tokens": 9, "completion_tokens": 4}),
            b"data: [DONE]\n\n",
        ]
    )
    turn = turn_from_stream(openai_chat_stream.ChatStreamParser(), raw)
    body = openai_chat_request.build_request(turn2(turn, ("call_a", "A")))
    assert body.decode() == (
        '{"model":"model-x","stream":true,"stream_options":{"include_usage":true},"messages":['
        '{"role":"system","content":"sys"},'
        '{"role":"user","content":"Read a.py and b.py"},'
        '{"role":"assistant","content":"Reading.","reasoning_content":"Need a.py.","tool_calls":['
        '{"id":"call_a","type":"function","function":{"name":"read_file",'
        '"arguments":"{\\"path\\": \\"a.py\\"}"}}]},'
        '{"role":"tool","tool_call_id":"call_a","content":"A"}],'
        '"tools":[{"type":"function","function":{"name":"read_file","description":"Read a file",'
        '"parameters":{"type":"object"}}}]}'
    )
