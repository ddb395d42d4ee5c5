"""Each provider kind end to end through the daemon, with a tool round: the second provider
call must carry the first call's reasoning replay exactly as that endpoint needs it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from byok.devtools.cursor_sim import user_turn
from byok.devtools.workspace_exec import WorkspaceExecutor
from tests.integration.conftest import start_daemon
from tests.support.fake_provider import (
    anthropic_text_script,
    anthropic_tool_script,
    chat_text_script,
    chat_tool_script,
    error_script,
    responses_text_script,
    responses_tool_script,
)
from tests.support.run_driver import wait_call_records

READ_ARGS = '{"path": "hello.txt"}'


def scripts(kind: str) -> tuple:  # type: ignore[type-arg]
    if kind == "openai_chat":
        return (
            chat_tool_script([("call_1", "Read", READ_ARGS)], text="Let me look."),
            chat_text_script(["It says hi."]),
        )
    if kind == "openai_responses":
        return (
            responses_tool_script(
                [("call_1", "Read", READ_ARGS)], reasoning=["Need the file."], encrypted="gAAAAenc"
            ),
            responses_text_script(["It says hi."]),
        )
    return (
        anthropic_tool_script(
            [("toolu_1", "Read", READ_ARGS)], thinking=["Need the file."], signature="sig-abc"
        ),
        anthropic_text_script(["It says hi."]),
    )


def check_replay(kind: str, second: dict) -> None:  # type: ignore[type-arg]
    if kind == "openai_chat":
        assistant, tool = second["messages"][-2:]
        assert assistant["content"] == "Let me look."
        assert assistant["tool_calls"][0]["function"] == {"name": "Read", "arguments": READ_ARGS}
        assert tool == {"role": "tool", "tool_call_id": "call_1", "content": tool["content"]}
        assert "hi there" in tool["content"]
    elif kind == "openai_responses":
        assert "previous_response_id" not in second and second["store"] is False
        items = second["input"]
        reasoning = next(i for i in items if i.get("type") == "reasoning")
        assert reasoning["encrypted_content"] == "gAAAAenc"
        types = [i.get("type") for i in items[-3:]]
        assert types == ["reasoning", "function_call", "function_call_output"]
        assert items[-2]["call_id"] == "call_1" and items[-2]["arguments"] == READ_ARGS
        assert items[-1]["call_id"] == "call_1" and "hi there" in items[-1]["output"]
    else:
        assistant, user = second["messages"][-2:]
        blocks = assistant["content"]
        assert blocks[0] == {"type": "thinking", "thinking": "Need the file.", "signature": "sig-abc"}
        assert blocks[1]["type"] == "tool_use" and blocks[1]["id"] == "toolu_1"
        assert blocks[1]["input"] == json.loads(READ_ARGS)
        assert user["role"] == "user" and user["content"][0]["type"] == "tool_result"
        assert user["content"][0]["tool_use_id"] == "toolu_1"


@pytest.mark.parametrize("kind", ["openai_chat", "openai_responses", "anthropic"])
async def test_tool_round_with_replay(kind: str, tmp_path: Path, nursery: trio.Nursery) -> None:
    root = tmp_path / "ws"
    root.mkdir()
    (root / "hello.txt").write_text("hi there\n")
    async with start_daemon(tmp_path, nursery, kind=kind) as d:
        executor = WorkspaceExecutor(root)
        d.sim.executor = executor
        d.provider.enqueue(*scripts(kind))
        tr = await d.sim.run(
            "req-" + kind,
            user_turn("read it", conversation_id="c-" + kind, model_id="byok-demo", message_id="m"),
        )
        await executor.aclose()
        assert tr.end_stream == {}, tr.end_stream
        assert tr.text().endswith("It says hi.")
        first, second = d.provider.requests
        expected_path = {"openai_chat": "/v1/chat/completions", "openai_responses": "/v1/responses"}
        assert first.path == expected_path.get(kind, "/v1/messages")
        if kind == "anthropic":
            assert first.headers["x-api-key"] == "sk-test"
            assert first.headers["anthropic-version"]
            # Automatic prompt caching, by default: one top-level field, the messages untouched.
            assert first.json["cache_control"] == second.json["cache_control"] == {"type": "ephemeral"}
            assert second.json["messages"][: len(first.json["messages"])] == first.json["messages"]
            # Tool input streamed as the model writes it (no server-side buffering).
            assert all(t["eager_input_streaming"] is True for t in first.json["tools"])
        else:
            assert "cache_control" not in first.json
            assert first.headers["authorization"] == "Bearer sk-test"
        if kind == "openai_responses":
            # One routing key per conversation, the same on every call (and never its id).
            key = first.json["prompt_cache_key"]
            assert key.startswith("byok-") and "c-openai_responses" not in key
            assert second.json["prompt_cache_key"] == key
        else:  # Anthropic has no such field; a Chat server other than OpenAI's gets none by default
            assert "prompt_cache_key" not in first.json
        check_replay(kind, second.json)
        if kind != "openai_chat":
            kinds = tr.kinds()
            assert "interaction_update.thinking_delta" in kinds
            assert "interaction_update.thinking_completed" in kinds
        calls = await wait_call_records(d.data_dir, "req-" + kind, 2)
        assert [c.status for c in calls] == ["ok", "ok"]
        assert calls[1].prefix_extends is True
        assert all(c.usage is not None for c in calls)


async def refusal(tmp_path: Path, nursery: trio.Nursery, kind: str, message: str, status: int = 400) -> str:
    """The run's error message when the provider answers ``status`` with ``message`` (its code
    checked)."""
    async with start_daemon(tmp_path, nursery, kind=kind) as d:
        d.provider.enqueue(error_script(status, message))
        tr = await d.sim.run(
            "req-refused", user_turn("hi", conversation_id="c-refused", model_id="byok-demo", message_id="m")
        )
    error = tr.error
    assert error is not None and error["code"] == "unavailable"
    return str(error["message"])


async def test_a_wrong_key_or_url_says_what_to_check(tmp_path: Path, nursery: trio.Nursery) -> None:
    """401 and 404 are what a wrong setup gets: the error names the provider and what to check
    (the URL byok posted to, for a 404: a base_url missing or repeating /v1, or an unknown model)."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    message = await refusal(tmp_path / "a", nursery, "openai_chat", "Incorrect API key provided", 401)
    assert message == (
        "HTTP 401: Incorrect API key provided (provider 'fake' refused the key: check its api_key or"
        " api_key_env)"
    )
    message = await refusal(tmp_path / "b", nursery, "anthropic", "Not Found", 404)
    assert message.startswith("HTTP 404: Not Found (provider 'fake', POST http://127.0.0.1:")
    assert message.endswith("/v1/messages: check its base_url, and the upstream_model of model 'byok-demo')")


async def test_a_refused_default_field_names_the_option_that_leaves_it_out(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """An Anthropic-compatible server that refuses a field byok adds by default: the run's error
    says which provider option turns it off."""
    message = await refusal(tmp_path, nursery, "anthropic", "cache_control: Extra inputs are not permitted")
    assert message.startswith("HTTP 400: cache_control: Extra inputs are not permitted")
    assert "set prompt_cache = false on provider" in message
    assert "eager_input_streaming" not in message


ANTHROPIC_HEADERS = """[providers.headers]
anthropic-beta = "interleaved-thinking-2025-05-14"
anthropic-version = "2099-01-01"
"""

THINKING_MODEL = """max_output_tokens = 32000
[models.extra_body]
thinking = { type = "enabled", budget_tokens = 16000 }
temperature = 1
"""


async def test_extra_body_reaches_every_request_and_a_cut_off_answer_names_the_limit(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """A model's ``[models.extra_body]`` (here Anthropic extended thinking) goes into each request
    after byok's own fields; an answer stopped at the output limit says which setting to raise."""
    async with start_daemon(
        tmp_path, nursery, kind="anthropic", extra=THINKING_MODEL, provider_extra=ANTHROPIC_HEADERS
    ) as d:
        d.provider.enqueue(
            anthropic_text_script(["Hi."], thinking=["Short."], signature="sig-1"),
            anthropic_text_script(["A long"], stop_reason="max_tokens"),
        )
        ok = await d.sim.run(
            "req-think", user_turn("hi", conversation_id="c-think", model_id="byok-demo", message_id="m1")
        )
        assert ok.end_stream == {} and ok.text() == "Hi."
        # The provider's own headers go with every request; one named like byok's replaces it.
        sent = d.provider.requests[0].headers
        assert sent["anthropic-beta"] == "interleaved-thinking-2025-05-14"
        assert sent["anthropic-version"] == "2099-01-01" and sent["x-api-key"] == "sk-test"
        body = d.provider.requests[0].json
        assert body["max_tokens"] == 32000
        assert body["thinking"] == {"type": "enabled", "budget_tokens": 16000}
        assert body["temperature"] == 1
        assert list(body)[-2:] == ["thinking", "temperature"]  # after byok's own, in the file's order
        cut = await d.sim.run(
            "req-cut", user_turn("more", conversation_id="c-think", model_id="byok-demo", message_id="m2")
        )
        error = cut.error
        assert error is not None and error["code"] == "unavailable"
        assert "stop_reason=max_tokens" in error["message"]
        assert "model 'byok-demo' has max_output_tokens = 32000; raise it in the config" in error["message"]
        second = d.provider.requests[1].json
        # The thinking block of the first answer goes back with its signature.
        assert second["messages"][1]["content"][0] == {
            "type": "thinking",
            "thinking": "Short.",
            "signature": "sig-1",
        }


async def test_a_responses_server_refusing_the_cache_key_names_its_option(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    message = await refusal(
        tmp_path, nursery, "openai_responses", "Unrecognized request argument supplied: prompt_cache_key"
    )
    assert message.endswith(
        "(if this server does not support it, set prompt_cache_key = false on provider 'fake')"
    )


async def test_a_conversation_over_the_context_window_says_so(tmp_path: Path, nursery: trio.Nursery) -> None:
    message = await refusal(
        tmp_path, nursery, "anthropic", "prompt is too long: 210000 tokens > 200000 maximum"
    )
    assert message == (
        "HTTP 400: prompt is too long: 210000 tokens > 200000 maximum (the conversation no longer fits "
        "the context window of model 'byok-demo', 128,000 tokens in the config; start a new chat, or "
        "pick a model with a larger window)"
    )
