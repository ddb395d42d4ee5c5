"""A conversation's stored render: written and read back (store/rendered_prefixes.py), and used
only for the messages it was made of (run/stored_render.py)."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from byok.model.messages import Message
from byok.model.projection import project, projected_count
from byok.model.request import ModelRequest, ModelSettings
from byok.providers.adapters import adapter_for
from byok.providers.kinds import ANTHROPIC, OPENAI_CHAT
from byok.run.stored_render import MIN_MESSAGES, StoredRenders, render_key, start_from_stored
from byok.store import AsyncStore, SQLiteStore
from byok.store.rendered_prefixes import messages_digest

KEY = b"k" * 32
TEXTS = (b'{"role":"system","content":"s"}', b"", "é".encode() * 300, b'{"role":"user"}' * 40)


def test_a_stored_render_reads_back_as_written_and_is_replaced_only_when_it_changed(tmp_path: Path) -> None:
    with SQLiteStore.open_in(tmp_path) as store:
        assert store.rendered_prefix("c", KEY) is None
        digest = messages_digest([b"a" * 32, b"b" * 32])
        assert store.save_rendered_prefix("c", KEY, 2, digest, TEXTS)
        stored = store.rendered_prefix("c", KEY)
        assert stored is not None and (stored.message_count, stored.messages_sha256) == (2, digest)
        assert stored.texts == TEXTS and all(type(t) is bytes for t in stored.texts)
        assert not store.save_rendered_prefix("c", KEY, 2, digest, TEXTS)  # the same: not written
        assert store.rendered_prefix("other", KEY) is None and store.rendered_prefix("c", b"x" * 32) is None
        longer = messages_digest([b"a" * 32, b"b" * 32, b"c" * 32])
        assert store.save_rendered_prefix("c", KEY, 3, longer, TEXTS[:2])
        again = store.rendered_prefix("c", KEY)
        assert again is not None and again.message_count == 3 and again.texts == TEXTS[:2]
        # One row per conversation: another key's (another adapter, a newer byok) replaces it.
        store.save_rendered_prefix("other", KEY, 2, digest, TEXTS)
        assert store.save_rendered_prefix("c", b"n" * 32, 3, longer, TEXTS)
        assert store.rendered_prefix("c", KEY) is None and store.rendered_prefix("c", b"n" * 32) is not None
        assert store.rendered_prefix("other", KEY) is not None


def test_a_row_whose_lengths_do_not_add_up_is_not_used(tmp_path: Path) -> None:
    with SQLiteStore.open_in(tmp_path) as store:
        store.save_rendered_prefix("c", KEY, 2, b"d" * 32, TEXTS)
        assert store._conn is not None
        store._conn.execute("UPDATE rendered_prefixes SET lengths = substr(lengths, 1, 4)")
        assert store.rendered_prefix("c", KEY) is None
        store._conn.execute("UPDATE rendered_prefixes SET lengths = x'010203'")
        assert store.rendered_prefix("c", KEY) is None


async def test_a_stored_render_is_used_only_for_the_messages_it_was_made_of(tmp_path: Path) -> None:
    chat = adapter_for(OPENAI_CHAT)
    template = ModelRequest(system="s", tools=(), history=(), settings=ModelSettings("m"))
    history = [Message(role="user", origin="user", text=f"q{i}") for i in range(MIN_MESSAGES + 1)]
    async with await AsyncStore.open(tmp_path / "data") as store:
        await store.append("c", 0, history, 1)
        renders = StoredRenders()
        renders.called("c", chat, template)
        assert await renders.save_all(store) == 1

        def read_back(messages: list[Message]) -> tuple[Message, ...]:
            return tuple(Message.stored(m.id, m.encode()) for m in messages)

        edited = [*history[:-1], Message(role="user", origin="user", text="edited")]
        for other in (edited, history[:-1]):  # an edit before its end; a shorter history
            back = read_back(other)
            assert not await start_from_stored(store, "c", back, chat, template)
            assert projected_count(back) == 0
        back = read_back([*history, Message(role="user", origin="user", text="next")])
        assert not await start_from_stored(
            store, "c", back, adapter_for(ANTHROPIC), template
        )  # none under its key
        assert await start_from_stored(store, "c", back, chat, template)
        assert projected_count(back) == MIN_MESSAGES + 1
        assert not await start_from_stored(store, "c", back, chat, template)  # already projected here
        want = chat.render(attrs.evolve(template, history=project([*history, back[-1]]))).body
        assert chat.render(attrs.evolve(template, history=project(back))).body == want


def test_the_render_key_names_the_adapter_key_and_the_rendering_code(monkeypatch: pytest.MonkeyPatch) -> None:
    from byok.providers import rendering
    from byok.run import stored_render

    assert render_key((OPENAI_CHAT, True, "s")) != render_key((OPENAI_CHAT, False, "s"))
    stored_render._code_digest.cache_clear()
    try:
        before = render_key(OPENAI_CHAT)
        # Code that cannot be read as a file (a zip import) is named by the release instead.
        monkeypatch.setattr(rendering, "__file__", str(Path("/nonexistent/rendering.py")))
        stored_render._code_digest.cache_clear()
        assert render_key(OPENAI_CHAT) != before
    finally:
        monkeypatch.undo()
        stored_render._code_digest.cache_clear()
    assert render_key(OPENAI_CHAT) == before


@pytest.mark.parametrize(
    "module", ["byok.providers.anthropic_request", "byok.model.body", "byok.providers.openai_chat_request"]
)
def test_every_rendering_module_is_in_the_key(module: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Anthropic's request module was once missing from a hand-written list: an upgrade that
    changed its texts would have mixed two formats in one body."""
    import importlib

    from byok.run import stored_render

    stored_render._code_digest.cache_clear()
    try:
        before = render_key(OPENAI_CHAT)
        monkeypatch.setattr(importlib.import_module(module), "__file__", "/nonexistent/changed.py")
        stored_render._code_digest.cache_clear()
        assert render_key(OPENAI_CHAT) != before
    finally:
        monkeypatch.undo()
        stored_render._code_digest.cache_clear()


async def test_a_history_that_does_not_decode_costs_only_its_own_stored_render(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    chat = adapter_for(OPENAI_CHAT)
    template = ModelRequest(system="s", tools=(), history=(), settings=ModelSettings("m"))
    async with await AsyncStore.open(tmp_path / "data") as store:
        for conversation in ("broken", "fine"):
            history = [
                Message(role="user", origin="user", text=f"{conversation} {i}") for i in range(MIN_MESSAGES)
            ]
            await store.append(conversation, 0, history, 1)
        broken = (await store.head("broken")).messages[3].id
        await store.call(
            lambda s: s._conn.execute("UPDATE messages SET data = x'7b22' WHERE id = ?", (broken,))
        )
        await store.call(SQLiteStore.forget_cached)
        renders = StoredRenders()
        renders.called("broken", chat, template)
        renders.called("fine", chat, template)
        assert await renders.save_all(store) == 1
        assert "could not render conversation broken" in caplog.text
        assert await store.rendered_prefix("fine", render_key(chat.prefix_texts(template)[0])) is not None
