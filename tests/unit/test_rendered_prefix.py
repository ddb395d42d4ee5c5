"""A stored render (RenderedPrefix) stands for a history's first items after a restart: the
request it gives is byte for byte the request of the whole history rendered again, with every
adapter, and the stored messages it covers are never decoded by the adapter that made it."""

from __future__ import annotations

import attrs
import pytest

from byok.model.messages import Message
from byok.model.projection import final_prefix, project, start_from
from byok.model.request import HistoryItem, ModelRequest, ModelSettings, RenderedPrefix, ToolSpec
from byok.providers import rendering
from byok.providers.adapters import adapter_for
from byok.providers.kinds import ANTHROPIC, OPENAI_CHAT, OPENAI_RESPONSES
from tests.unit.test_projection import assistant, call, result, round_head, user

TOOLS = (ToolSpec("read", "Read a file.", '{"type":"object"}'),)


def _history(blocks: int) -> list[Message]:
    out: list[Message] = []
    for b in range(blocks):
        calls = [call(f"c{b}-0", 0), call(f"c{b}-1", 1)]
        out += [
            user(f'question {b}\nwith "quotes" and é'),
            round_head(f"r{b}", calls, text="Looking."),
            result(f"r{b}", calls[1], 1, text=f"line 1\nline 2 of {b}"),
            result(f"r{b}", calls[0], 2),
            assistant(f"answer {b}"),
        ]
    return out


def _request(history: tuple[HistoryItem, ...]) -> ModelRequest:
    return ModelRequest(system="be brief", tools=TOOLS, history=history, settings=ModelSettings("m"))


def _read_back(messages: list[Message]) -> tuple[Message, ...]:
    """The history as the store reads it after a restart: undecoded rows."""
    one: dict = {}
    return tuple(Message.stored(m.id, m.encode(), one.setdefault) for m in messages)


def _stored_render(messages: list[Message], kind: str) -> tuple[int, object, tuple[bytes, ...]]:
    """What the daemon keeps for ``messages`` rendered by ``kind``: (message count, key, texts)."""
    count, items = final_prefix(messages)
    prefix_texts = adapter_for(kind).prefix_texts
    key, texts = prefix_texts(_request(items))
    return count, key, tuple(texts)


@pytest.mark.parametrize("kind", [OPENAI_CHAT, OPENAI_RESPONSES, ANTHROPIC])
@pytest.mark.parametrize("stored_kind", [OPENAI_CHAT, OPENAI_RESPONSES, ANTHROPIC])
def test_a_stored_render_gives_the_bytes_of_the_whole_history_rendered_again(
    kind: str, stored_kind: str
) -> None:
    messages = _history(3)
    count, key, texts = _stored_render(messages, stored_kind)
    assert count == len(messages)
    later = [*messages, user("next question")]
    rendering.forget_rendered()
    back = _read_back(later)
    prefix = RenderedPrefix(key, texts, back[:count], sum(map(len, texts)))
    start_from(back, prefix)
    history = project(back)
    assert history[0] is prefix and len(history) == 2
    adapter = adapter_for(kind)
    got = adapter.render(_request(history)).body
    again = adapter.render(_request(project(back))).body  # the next turn: the kept prefix
    if kind == stored_kind:  # never decoded (Anthropic reads the last one's role)
        assert all(m.stored_size is not None for m in back[: count - (kind == ANTHROPIC)])
    rendering.forget_rendered()
    want = adapter.render(_request(project([*_history(3), user("next question")]))).body
    assert got == want and again == want


def test_a_history_that_goes_on_from_a_stored_render_keeps_extending_it() -> None:
    messages = _history(2)
    count, key, texts = _stored_render(messages, OPENAI_CHAT)
    later = [*messages, *_history(4)[10:]]  # two more blocks
    rendering.forget_rendered()
    back = _read_back(later)
    start_from(back, RenderedPrefix(key, texts, back[:count], sum(map(len, texts))))
    adapter = adapter_for(OPENAI_CHAT)
    first = adapter.render(_request(project(back[:15]))).body
    second = adapter.render(_request(project(back))).body
    rendering.forget_rendered()
    fresh = [*_history(2), *_history(4)[10:]]
    assert first == adapter.render(_request(project(fresh[:15]))).body
    assert second == adapter.render(_request(project(fresh))).body


def test_a_stored_render_of_other_messages_is_refused() -> None:
    messages = _history(2)
    count, key, texts = _stored_render(messages, OPENAI_CHAT)
    back = _read_back(messages)
    other = _read_back(messages)
    with pytest.raises(ValueError, match="not of these messages"):
        start_from(back, RenderedPrefix(key, texts, other[:count], 0))
    with pytest.raises(ValueError, match="not of these messages"):
        start_from(back[:3], RenderedPrefix(key, texts, back[:count], 0))


@pytest.mark.parametrize(
    "last",
    [
        user("a turn whose call failed"),  # the next user message merges into its message
        assistant(""),  # gives no message of its own: the roles around it merge
    ],
)
def test_anthropic_renders_the_messages_itself_where_the_next_item_would_join_the_last_message(
    last: Message,
) -> None:
    messages = [*_history(2), last]
    count, key, texts = _stored_render(messages, ANTHROPIC)
    later = [*messages, user("next question")]
    rendering.forget_rendered()
    back = _read_back(later)
    start_from(back, RenderedPrefix(key, texts, back[:count], sum(map(len, texts))))
    adapter = adapter_for(ANTHROPIC)
    got = adapter.render(_request(project(back))).body
    rendering.forget_rendered()
    fresh = [*_history(2), attrs.evolve(last), user("next question")]
    assert got == adapter.render(_request(project(fresh))).body


@pytest.mark.parametrize("kind", [OPENAI_RESPONSES, ANTHROPIC])
def test_another_adapter_expands_a_stored_render_the_history_has_not_gone_past(kind: str) -> None:
    # A resumed tool round after a restart: nothing after the stored render is final yet, so the
    # projection still starts from it when another adapter renders the history.
    messages = _history(2)
    count, key, texts = _stored_render(messages, OPENAI_CHAT)
    calls = [call("c9-0", 0)]
    later = [*messages, round_head("r9", calls, text="Again.")]
    rendering.forget_rendered()
    back = _read_back(later)
    start_from(back, RenderedPrefix(key, texts, back[:count], sum(map(len, texts))))
    assert project(back)[0].__class__ is RenderedPrefix
    adapter = adapter_for(kind)
    got = adapter.render(_request(project(back))).body
    rendering.forget_rendered()
    assert (
        got == adapter.render(_request(project([*_history(2), round_head("r9", calls, text="Again.")]))).body
    )


@pytest.mark.parametrize("kind", [OPENAI_CHAT, OPENAI_RESPONSES, ANTHROPIC])
def test_an_adapters_prefix_key_is_the_one_its_texts_are_kept_under(kind: str) -> None:
    adapter = adapter_for(kind)
    request = _request(project(_history(1)))
    assert adapter.prefix_key(request) == adapter.prefix_texts(request)[0]
