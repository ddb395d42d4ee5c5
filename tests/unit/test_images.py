"""Images: the media type sniffed from the bytes, the image part of a message (its encoding,
the store, the checkpoint root), the images of a user's message, and each provider's format."""

from __future__ import annotations

import base64
import hashlib
import json
import sqlite3
from pathlib import Path

import attrs
import pytest

from byok.cursor.pasted_images import blobs_to_fetch, resolve_images, verified_blobs
from byok.cursor.prompting import build_runtime_message
from byok.cursor.root_json import decode_root, encode_root
from byok.model.images import ImageError, ImagePart, sniff_image_type
from byok.model.messages import ATTACHMENTS_PREFIX, Message, ToolCall
from byok.model.projection import project
from byok.model.request import (
    ModelRequest,
    ModelSettings,
    ToolImagesTurn,
    ToolResultTurn,
    UserTurn,
)
from byok.pb.agent import v1 as agent
from byok.providers.adapters import adapter_for
from byok.providers.kinds import ANTHROPIC, OPENAI_CHAT, OPENAI_RESPONSES
from byok.store import SQLiteStore, StoreError

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00\x00\x00\rIHDR" + bytes(20)
JPEG = b"\xff\xd8\xff\xe0\x00\x10JFIF\x00" + bytes(20)
GIF = b"GIF89a" + bytes(20)
WEBP = b"RIFF\x24\x00\x00\x00WEBPVP8 " + bytes(20)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


# --- the sniffer --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (PNG, "image/png"),
        (JPEG, "image/jpeg"),
        (b"\xff\xd8\xff\xdb" + bytes(8), "image/jpeg"),
        (GIF, "image/gif"),
        (b"GIF87a" + bytes(4), "image/gif"),
        (WEBP, "image/webp"),
        (b"", None),
        (b"\x89PNG", None),  # a cut signature
        (b"RIFF\x24\x00\x00\x00WAVEfmt ", None),  # RIFF, but audio
        (b"RIFF\x24\x00", None),
        (b"BM" + bytes(30), None),  # BMP: not one providers take
        (b"<svg xmlns='http://www.w3.org/2000/svg'/>", None),
        (b"\x00" + PNG, None),  # the signature must come first
    ],
)
def test_sniff_reads_the_magic_number(data: bytes, expected: str | None) -> None:
    assert sniff_image_type(data) == expected


def test_a_part_takes_its_type_from_the_bytes_never_the_label() -> None:
    part = ImagePart.of(PNG, label="image/jpeg")
    assert (part.media_type, part.sha256, part.size, part.data) == (
        "image/png",
        hashlib.sha256(PNG).hexdigest(),
        len(PNG),
        PNG,
    )
    assert part.data_url() == "data:image/png;base64," + b64(PNG)
    with pytest.raises(
        ImageError, match=r"^image 2 \(4 bytes, labelled image/bmp\) is not a PNG, JPEG, GIF or WebP"
    ):
        ImagePart.of(b"BM\x00\x00", what="image 2", label="image/bmp")


def test_a_parts_identity_is_its_reference_not_its_bytes() -> None:
    part = ImagePart.of(PNG)
    bare = ImagePart(part.media_type, part.sha256, part.size)
    assert bare == part and hash(bare) == hash(part)
    with pytest.raises(ImageError, match="has no data"):
        bare.base64()


# --- the message and the store ------------------------------------------------------------------


def with_images(*images: bytes, text: str = "look") -> Message:
    return Message(
        role="user", origin="runtime", text=text, attachments=tuple(ImagePart.of(i) for i in images)
    )


def test_a_message_encodes_references_first_and_decodes_to_itself() -> None:
    m = with_images(PNG, JPEG)
    data = m.encode()
    assert data.startswith(ATTACHMENTS_PREFIX)
    assert b64(PNG).encode() not in data and PNG not in data  # references, not bytes
    assert json.loads(data)["attachments"][1] == {
        "media_type": "image/jpeg",
        "sha256": hashlib.sha256(JPEG).hexdigest(),
        "size": len(JPEG),
    }
    assert Message.decode(data) == m and m.decodes_to_itself()
    # The same text with other images is another message (content-addressed).
    assert (
        with_images(PNG).id != with_images(JPEG).id != Message(role="user", origin="runtime", text="look").id
    )
    # A message without images encodes as it always did.
    assert not Message(role="user", origin="user", text="x").encode().startswith(ATTACHMENTS_PREFIX)


def test_the_store_keeps_image_bytes_as_blobs_and_gives_them_back(tmp_path: Path) -> None:
    path = tmp_path / "byok.sqlite3"
    first, again = with_images(PNG, JPEG), with_images(PNG, text="once more")
    with SQLiteStore(path) as store:
        head = store.append("c", 0, [first], 1)
        head = store.append("c", head.version, [Message(role="assistant", origin="assistant", text="ok")], 2)
        store.append("c", head.version, [again], 3)
        assert store.has_blobs([bytes.fromhex(p.sha256) for p in first.attachments]) == {
            hashlib.sha256(PNG).digest(),
            hashlib.sha256(JPEG).digest(),
        }
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT count(*) FROM blobs").fetchone() == (2,)  # PNG stored once
    # No message row holds the bytes.
    assert all(
        b64(PNG).encode() not in row[0] and PNG not in row[0]
        for row in conn.execute("SELECT data FROM messages")
    )
    conn.close()
    with SQLiteStore(path) as store:  # a fresh read, nothing cached
        messages = store.head("c").messages
    assert messages[0] == first and [p.data for p in messages[0].attachments] == [PNG, JPEG]
    assert messages[2].attachments[0].data == PNG
    assert messages[1].stored_size is not None  # a message without images is still decoded lazily


def test_the_store_refuses_an_image_without_bytes_and_a_history_that_lost_one(tmp_path: Path) -> None:
    path = tmp_path / "byok.sqlite3"
    bare = Message(
        role="user", origin="user", text="x", attachments=(attrs.evolve(ImagePart.of(GIF), data=b""),)
    )
    with SQLiteStore(path) as store:
        with pytest.raises(StoreError, match="have no bytes to store"):
            store.append("c", 0, [bare], 1)
        assert store.head("c").messages == ()
        store.append("c", 0, [with_images(GIF)], 1)
        # Once the bytes are stored, a reference alone is enough (an image pasted again).
        store.append("c", 1, [attrs.evolve(bare, text="again")], 2)
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA foreign_keys=OFF")
    conn.execute("DELETE FROM blobs")
    conn.commit()
    conn.close()
    with SQLiteStore(path) as store, pytest.raises(StoreError, match=r"is corrupt: image .* is not stored"):
        store.head("c")


# --- the checkpoint root --------------------------------------------------------------------------


def tool_result(images: tuple[bytes, ...] = (PNG,)) -> Message:
    return Message(
        role="tool",
        origin="tool",
        text="/w/a.png is an image",
        tool_call_id="c1",
        tool_name="Read",
        tool_round_id="r1",
        completion_seq=1,
        attachments=tuple(ImagePart.of(i) for i in images),
    )


@pytest.mark.parametrize(
    "message", [with_images(PNG, JPEG), tool_result(), with_images(WEBP, text="x" * 20_000)]
)
def test_a_root_holds_the_images_whole_and_decodes_back(message: Message) -> None:
    root = encode_root(message)
    assert b64(message.attachments[0].data).encode() in root
    back = decode_root(root)
    assert back == message and [p.data for p in back.attachments] == [p.data for p in message.attachments]
    assert encode_root(back) == root  # the same blob id every time


def test_a_foreign_root_with_images_imports_them() -> None:
    root = {
        "role": "user",
        "content": [
            {"type": "text", "text": "what is this"},
            {"type": "image", "image": "data:image/jpeg;base64," + b64(PNG), "mediaType": "image/jpeg"},
            {"type": "file", "data": b64(GIF), "mediaType": "image/gif"},
            {"type": "file", "data": b64(b"%PDF-1.4"), "mediaType": "application/pdf"},  # not an image
        ],
    }
    m = decode_root(json.dumps(root).encode())
    assert m.text == "what is this"
    assert [(p.media_type, p.data) for p in m.attachments] == [("image/png", PNG), ("image/gif", GIF)]
    # One whose bytes are not there, or that no provider takes, leaves a line saying so.
    lost = {
        "role": "user",
        "content": [
            {"type": "image", "image": "https://example.com/a.png"},
            {"type": "file", "data": b64(b"BM" + bytes(8)), "mediaType": "image/bmp"},
            {"type": "text", "text": "and?"},
        ],
    }
    m = decode_root(json.dumps(lost).encode())
    assert m.attachments == ()
    assert m.text == (
        "\n[an image of the conversation was not carried over: it is not inline (a URL?)]\n"
        "\n[an image of the conversation (10 bytes, labelled image/bmp) is not a PNG, JPEG, GIF or WebP"
        " image; only those can be sent to a model; it was not carried over]\n"
        "and?"
    )


# --- the images of a user's message ---------------------------------------------------------------


def user_message(*images: agent.SelectedImage) -> agent.UserMessage:
    return agent.UserMessage(text="see", selected_context=agent.SelectedContext(selected_images=list(images)))


def test_the_three_ways_cursor_sends_an_image() -> None:
    blob_id = hashlib.sha256(JPEG).digest()
    message = user_message(
        agent.SelectedImage(data=PNG, mime_type="image/jpeg"),  # labelled wrongly
        agent.SelectedImage(blob_id=blob_id, path="/w/b.jpg"),
        agent.SelectedImage(
            blob_id_with_data=agent.SelectedImageBlobIdWithData(
                blob_id=hashlib.sha256(GIF).digest(), data=GIF
            )
        ),
    )
    assert blobs_to_fetch(message, {}) == [blob_id]
    assert blobs_to_fetch(message, {blob_id: JPEG}) == []
    parts = resolve_images(message, {blob_id: JPEG})
    assert [(p.media_type, p.data) for p in parts] == [
        ("image/png", PNG),
        ("image/jpeg", JPEG),
        ("image/gif", GIF),
    ]


@pytest.mark.parametrize(
    ("image", "blobs", "error"),
    [
        (
            agent.SelectedImage(blob_id=b"\x01" * 32, path="/w/x.png"),
            {},
            r"image 1 \(/w/x.png\): the client did not deliver blob 0101",
        ),
        (
            agent.SelectedImage(data=b"BM\x00\x00", mime_type="image/bmp"),
            {},
            r"image 1 \(4 bytes, labelled image/bmp\) is not a PNG",
        ),
        (
            agent.SelectedImage(
                blob_id_with_data=agent.SelectedImageBlobIdWithData(blob_id=b"\x02" * 32, data=PNG)
            ),
            {},
            "image 1: its bytes do not match its blob id 0202",
        ),
        (agent.SelectedImage(uuid="u"), {}, "image 1 carries neither its bytes nor a blob id"),
    ],
)
def test_an_image_that_cannot_be_sent_is_an_error_naming_it(
    image: agent.SelectedImage, blobs: dict[bytes, bytes], error: str
) -> None:
    with pytest.raises(ImageError, match=error):
        resolve_images(user_message(image), blobs)


def test_only_pre_delivered_blobs_that_match_their_id_are_kept() -> None:
    good = agent.PreFetchedBlob(id=hashlib.sha256(PNG).digest(), value=PNG)
    bad = agent.PreFetchedBlob(id=b"\x03" * 32, value=JPEG)
    assert verified_blobs([good, bad]) == {good.id: PNG}


def test_the_runtime_message_carries_the_images_and_says_where_they_are() -> None:
    message = user_message(agent.SelectedImage(data=PNG, path="/w/a.png"), agent.SelectedImage(data=JPEG))
    parts = resolve_images(message, {})
    m = build_runtime_message(
        "<current_time>{{TIMESTAMP}}</current_time>\n\n{{SELECTED_CONTEXT}}\n\n{{USER_QUERY}}",
        request_id="r1",
        user_message=message,
        request_context=None,
        now_iso="2025-01-01T00:00:00Z",
        time_zone=None,
        images=parts,
    )
    assert m.attachments == parts
    assert (
        '<selected_context>\n<image index="1" path="/w/a.png"/>\n<image index="2"/>\n</selected_context>'
        in m.text
    )


# --- projection and each provider's format ---------------------------------------------------------


def read_round(*images: bytes) -> list[Message]:
    calls = (
        ToolCall("c1", "Read", '{"path":"/w/a.png"}', 0),
        ToolCall("c2", "Read", '{"path":"/w/b.txt"}', 1),
    )
    assistant = Message(role="assistant", origin="assistant", tool_calls=calls, tool_round_id="r1")
    text = Message(
        role="tool",
        origin="tool",
        text="1|hi",
        tool_call_id="c2",
        tool_name="Read",
        tool_round_id="r1",
        completion_seq=1,
    )
    image = attrs.evolve(tool_result(images), completion_seq=2)
    return [assistant, text, image]


def request(history: list[Message], kind: str, *, vision: bool = True) -> dict:
    req = ModelRequest(
        system="sys",
        tools=(),
        history=project(history),
        settings=ModelSettings(upstream_model="m", vision=vision),
    )
    return json.loads(adapter_for(kind).render(req).body)


def test_projection_puts_a_rounds_images_after_its_last_result() -> None:
    items = project([with_images(PNG), *read_round(JPEG)])
    assert isinstance(items[0], UserTurn) and items[0].images[0].data == PNG
    assert [type(i).__name__ for i in items[1:]] == [
        "AssistantTurn",
        "ToolResultTurn",
        "ToolResultTurn",
        "ToolImagesTurn",
    ]
    last: ToolImagesTurn = items[-1]  # type: ignore[assignment]
    assert isinstance(items[3], ToolResultTurn) and last.results == (items[3],)


def test_chat_image_parts_are_data_urls() -> None:
    body = request([with_images(PNG, JPEG), *read_round(JPEG)], OPENAI_CHAT)
    user, _assistant, text_result, image_result, images = body["messages"][1:]
    assert user == {
        "role": "user",
        "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64," + b64(PNG)}},
            {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64," + b64(JPEG)}},
            {"type": "text", "text": "look"},
        ],
    }
    # Chat tool messages hold text: the round's images follow all its results as a user message.
    assert [text_result["role"], image_result["role"]] == ["tool", "tool"]
    assert image_result["content"] == "/w/a.png is an image"
    assert images == {
        "role": "user",
        "content": [
            {"type": "text", "text": "What the Read call c1 returned:"},
            {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64," + b64(JPEG)}},
        ],
    }


def test_responses_images_are_input_images() -> None:
    body = request([with_images(GIF), *read_round(WEBP)], OPENAI_RESPONSES)
    user, _call1, _call2, _text_out, image_out = body["input"]
    assert user == {
        "role": "user",
        "content": [
            {"type": "input_image", "image_url": "data:image/gif;base64," + b64(GIF), "detail": "auto"},
            {"type": "input_text", "text": "look"},
        ],
    }
    assert image_out == {
        "type": "function_call_output",
        "call_id": "c1",
        "output": [
            {"type": "input_text", "text": "/w/a.png is an image"},
            {"type": "input_image", "image_url": "data:image/webp;base64," + b64(WEBP), "detail": "auto"},
        ],
    }


def test_anthropic_images_are_base64_sources() -> None:
    body = request([with_images(JPEG), *read_round(PNG)], ANTHROPIC)
    user, _assistant, results = body["messages"]
    assert user == {
        "role": "user",
        "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": b64(JPEG)}},
            {"type": "text", "text": "look"},
        ],
    }
    assert results["content"][1] == {
        "type": "tool_result",
        "tool_use_id": "c1",
        "content": [
            {"type": "text", "text": "/w/a.png is an image"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(PNG)}},
        ],
    }


@pytest.mark.parametrize("kind", [OPENAI_CHAT, OPENAI_RESPONSES, ANTHROPIC])
def test_a_model_without_vision_is_told_where_images_were(kind: str) -> None:
    history = [with_images(PNG, JPEG), *read_round(GIF)]
    body = json.dumps(request(history, kind, vision=False))
    assert b64(PNG) not in body and b64(GIF) not in body
    assert "[2 images left out here: this model is configured without vision (vision = false)]" in body
    assert "[an image left out here" in body
    # The same history for a model with vision is its own render (the caches keep both apart).
    assert b64(PNG) in json.dumps(request(history, kind))
    req = ModelRequest(system="sys", tools=(), history=(), settings=ModelSettings(upstream_model="m"))
    adapter = adapter_for(kind)
    assert adapter.prefix_key(req) != adapter.prefix_key(
        attrs.evolve(req, settings=ModelSettings("m", vision=False))
    )


@pytest.mark.parametrize("kind", [OPENAI_CHAT, OPENAI_RESPONSES, ANTHROPIC])
def test_a_history_without_images_renders_as_before(kind: str) -> None:
    plain = [Message(role="user", origin="user", text="hi")]
    assert request(plain, kind) == request(plain, kind, vision=False)
