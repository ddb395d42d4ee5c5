"""Images through a real daemon: pasted images (inline, by blob id read with a KV GET,
pre-delivered) reach each provider in its own format with the type sniffed from the bytes; a
Read of an image file gives the model the image; the history keeps them across turns and a
restart; a model configured without vision refuses a message with images, naming why."""

from __future__ import annotations

import base64
import functools
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from byok.devtools.cursor_sim import CursorSim, Transcript, user_turn
from byok.devtools.workspace_exec import WorkspaceExecutor
from byok.pb.agent import v1 as agent
from byok.store import SQLiteStore
from tests.integration.conftest import Daemon, start_daemon
from tests.support.fake_provider import (
    Script,
    anthropic_text_script,
    anthropic_tool_script,
    chat_text_script,
    chat_tool_script,
    responses_text_script,
    responses_tool_script,
)
from tests.support.run_driver import RunDriver

# Small but real headers: the daemon sniffs the magic numbers.
PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x02\x00\x00\x00" + bytes(40)
JPEG = b"\xff\xd8\xff\xe0\x00\x10JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00" + bytes(40)
JPEG_ID = hashlib.sha256(JPEG).digest()

TEXT: dict[str, Callable[..., Script]] = {
    "openai_chat": chat_text_script,
    "openai_responses": responses_text_script,
    "anthropic": anthropic_text_script,
}
TOOL: dict[str, Callable[..., Script]] = {
    "openai_chat": chat_tool_script,
    "openai_responses": responses_tool_script,
    "anthropic": anthropic_tool_script,
}


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def pasted(
    text: str, message_id: str, *images: agent.SelectedImage, conv: str = "conv-img"
) -> agent.AgentRunRequest:
    req = user_turn(text, conversation_id=conv, model_id="byok-demo", message_id=message_id)
    message = req.action.user_message_action.user_message
    message.selected_context = agent.SelectedContext(selected_images=list(images))
    return req


def png_labelled_jpeg() -> agent.SelectedImage:
    return agent.SelectedImage(uuid="a", data=PNG, mime_type="image/jpeg")  # the clipboard lied


def jpeg_by_id() -> agent.SelectedImage:
    return agent.SelectedImage(uuid="b", blob_id=JPEG_ID, mime_type="image/jpeg", path="/w/photo.jpg")


def user_images(kind: str, body: dict[str, Any], index: int = 0) -> list[tuple[str, str]]:
    """(media type, base64) of the images in the ``index``-th user message, as the provider got them."""
    if kind == "openai_chat":
        users = [m for m in body["messages"] if m["role"] == "user"]
        urls = [p["image_url"]["url"] for p in users[index]["content"] if p["type"] == "image_url"]
    elif kind == "openai_responses":
        users = [m for m in body["input"] if m.get("role") == "user"]
        urls = [p["image_url"] for p in users[index]["content"] if p["type"] == "input_image"]
        assert all(p["detail"] == "auto" for p in users[index]["content"] if p["type"] == "input_image")
    else:
        users = [m for m in body["messages"] if m["role"] == "user"]
        sources = [b["source"] for b in users[index]["content"] if b["type"] == "image"]
        assert all(s["type"] == "base64" for s in sources)
        return [(s["media_type"], s["data"]) for s in sources]
    out = []
    for url in urls:
        head, _, data = url.partition(",")
        assert head.startswith("data:") and head.endswith(";base64")
        out.append((head[5:].removesuffix(";base64"), data))
    return out


@pytest.mark.parametrize("kind", ["openai_chat", "openai_responses", "anthropic"])
async def test_a_png_and_a_jpeg_reach_each_provider_in_its_format(
    tmp_path: Path, nursery: trio.Nursery, kind: str
) -> None:
    async with start_daemon(tmp_path, nursery, kind=kind) as d:
        d.sim.blobs[JPEG_ID] = JPEG  # the client holds the JPEG; byok reads it with a GET
        d.provider.enqueue(TEXT[kind](["A chart and a photo."]), TEXT[kind](["Still both."]))
        tr = await d.sim.run("req-img-1", pasted("what are these?", "m1", png_labelled_jpeg(), jpeg_by_id()))
        assert tr.error is None, tr.error
        gets = [
            f.message.kv_server_message.get_blob_args.blob_id
            for f in tr.frames
            if f.kind.endswith("get_blob_args")
        ]
        assert gets == [JPEG_ID]
        first = d.provider.requests[0].json
        # Each image with the type its bytes say, in the order pasted.
        assert user_images(kind, first) == [("image/png", b64(PNG)), ("image/jpeg", b64(JPEG))]
        assert "what are these?" in json.dumps(first)
        # The next turn's request still has them, unchanged, ahead of the new message.
        tr = await d.sim.run("req-img-2", pasted("and now?", "m2"))
        assert tr.error is None, tr.error
        second = d.provider.requests[1].json
        assert user_images(kind, second) == user_images(kind, first)
        array = {"openai_chat": "messages", "openai_responses": "input", "anthropic": "messages"}[kind]
        assert second[array][: len(first[array])] == first[array]
        # The client's copy of the transcript (the runtime message's root) holds the images too.
        roots = [json.loads(d.sim.blobs[r]) for r in tr.checkpoints()[-1].root_prompt_messages_json]
        parts = [
            p
            for r in roots
            if isinstance(r["content"], list)
            for p in r["content"]
            if p.get("type") == "image"
        ]
        assert [(p["mediaType"], p["image"]) for p in parts] == [
            ("image/png", b64(PNG)),
            ("image/jpeg", b64(JPEG)),
        ]


async def test_pre_delivered_images_need_no_get_and_survive_a_restart(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    req = pasted("describe", "m1", jpeg_by_id())
    req.pre_fetched_blobs = [agent.PreFetchedBlob(id=JPEG_ID, value=JPEG)]
    async with start_daemon(tmp_path, nursery) as d:
        d.provider.enqueue(chat_text_script(["A photo."]))
        tr = await d.sim.run("req-pre-1", req)
        assert tr.error is None, tr.error
        assert not [f for f in tr.frames if f.kind.endswith("get_blob_args")]
        assert user_images("openai_chat", d.provider.requests[0].json) == [("image/jpeg", b64(JPEG))]
        sim_blobs = d.sim.blobs
    # A new daemon on the same data dir reads the image back from SQLite for the next turn.
    async with start_daemon(tmp_path, nursery) as d:
        d.sim.blobs.update(sim_blobs)
        d.provider.enqueue(chat_text_script(["Yes."]))
        tr = await d.sim.run("req-pre-2", pasted("still there?", "m2"))
        assert tr.error is None, tr.error
        assert user_images("openai_chat", d.provider.requests[0].json) == [("image/jpeg", b64(JPEG))]


@pytest.mark.parametrize("kind", ["openai_chat", "openai_responses", "anthropic"])
async def test_a_read_of_an_image_gives_the_model_the_image(
    tmp_path: Path, nursery: trio.Nursery, kind: str
) -> None:
    root = tmp_path / "ws"
    root.mkdir()
    (root / "diagram.jpg").write_bytes(PNG)  # named .jpg, is a PNG
    async with start_daemon(tmp_path, nursery, kind=kind) as d:
        executor = WorkspaceExecutor(root, shell_timeout_cap_s=5.0)
        sim = CursorSim(d.base_url, d.client, executor=executor)
        d.provider.enqueue(
            TOOL[kind]([("call_1", "Read", '{"path": "diagram.jpg"}')]), TEXT[kind](["A diagram."])
        )
        tr = await sim.run(
            "req-read-img",
            user_turn("look at diagram.jpg", conversation_id="c-r", model_id="byok-demo", message_id="m1"),
        )
        await executor.aclose()
        assert tr.error is None, tr.error
        body = d.provider.requests[1].json
        note = f"diagram.jpg is an image (image/png, {len(PNG)} bytes); here it is."
        if kind == "openai_chat":
            *_, result, images = body["messages"]
            assert result == {"role": "tool", "tool_call_id": "call_1", "content": note}
            assert images["role"] == "user"
            assert images["content"][1] == {
                "type": "image_url",
                "image_url": {"url": "data:image/png;base64," + b64(PNG)},
            }
        elif kind == "openai_responses":
            output = body["input"][-1]
            assert output["type"] == "function_call_output" and output["call_id"] == "call_1"
            assert output["output"] == [
                {"type": "input_text", "text": note},
                {"type": "input_image", "image_url": "data:image/png;base64," + b64(PNG), "detail": "auto"},
            ]
        else:
            (block,) = body["messages"][-1]["content"]
            assert block["tool_use_id"] == "call_1"
            assert block["content"] == [
                {"type": "text", "text": note},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(PNG)}},
            ]


async def test_a_model_without_vision_refuses_images_clearly(tmp_path: Path, nursery: trio.Nursery) -> None:
    async with start_daemon(tmp_path, nursery, extra="vision = false") as d:
        tr = Transcript()
        driver = RunDriver(d.sim, "req-blind")
        async with trio.open_nursery() as inner:
            await inner.start(functools.partial(driver.stream, tr))
            answer = await driver.start(pasted("what is this?", "m1", png_labelled_jpeg(), jpeg_by_id()))
        assert answer.status_code == 400 and "without vision" in answer.json()["message"]
        assert tr.error is not None and tr.error["code"] == "failed_precondition"
        message = tr.error["message"]
        assert (
            "'byok-demo' is configured without vision (vision = false)" in message and "2 images" in message
        )
        assert d.provider.requests == []
        with SQLiteStore(d.data_dir / "byok.sqlite3") as store:
            assert store.head("conv-img").messages == ()  # nothing appended, nothing dropped
        # Text goes through as ever.
        d.provider.enqueue(chat_text_script(["Hi."]))
        tr = await d.sim.run("req-text", pasted("hello", "m2"))
        assert tr.error is None, tr.error


async def test_an_image_byok_cannot_send_ends_the_run_naming_it(daemon: Daemon) -> None:
    bmp = agent.SelectedImage(uuid="c", data=b"BM" + bytes(60), mime_type="image/png", path="/w/scan.bmp")
    tr = await daemon.sim.run("req-bmp", pasted("see", "m1", png_labelled_jpeg(), bmp))
    assert tr.error is not None and tr.error["code"] == "invalid_argument"
    assert (
        "image 2 (/w/scan.bmp) (62 bytes, labelled image/png) is not a PNG, JPEG, GIF or WebP"
        in tr.error["message"]
    )
    missing = agent.SelectedImage(uuid="d", blob_id=b"\x07" * 32)
    tr = await daemon.sim.run("req-missing", pasted("see", "m2", missing))
    assert tr.error is not None and tr.error["code"] == "failed_precondition"
    assert "cannot read a pasted image from the client: client has no blob 0707" in tr.error["message"]
    assert daemon.provider.requests == []
    with SQLiteStore(daemon.data_dir / "byok.sqlite3") as store:
        assert store.head("conv-img").messages == ()
