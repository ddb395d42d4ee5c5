"""The images of a user's message (``SelectedContext.selected_images``) as image parts (sans-IO).

Cursor sends an image three ways: its bytes inline (``data``), a blob id (``blob_id``) whose
bytes came ahead in the run request (``AgentRunRequest.pre_fetched_blobs``) or are read from
the client's KV store with a GET, or both (``blob_id_with_data``). Every blob is checked against
its id (SHA-256 of the bytes). The media type is sniffed from the bytes; the client's
``mime_type`` only names the image in an error. An image that cannot be read or sent ends the
run with an error naming it: the user's message is never sent without the images they pasted.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping

import betterproto2

from byok.model.images import ImageError, ImagePart
from byok.pb.agent import v1 as agent


def selected_images(message: agent.UserMessage | None) -> list[agent.SelectedImage]:
    sc = None if message is None else message.selected_context
    return [] if sc is None else list(sc.selected_images)


def image_name(image: agent.SelectedImage, n: int) -> str:
    """How an error names the ``n``-th image (1-based): its file when it has one."""
    return f"image {n} ({image.path})" if image.path else f"image {n}"


def verified_blobs(blobs: Iterable[agent.PreFetchedBlob]) -> dict[bytes, bytes]:
    """The pre-delivered blobs whose bytes match their id; any other is read again with a GET."""
    return {b.id: b.value for b in blobs if hashlib.sha256(b.value).digest() == b.id}


def _source(image: agent.SelectedImage) -> tuple[bytes | None, bytes | None]:
    """(blob id, inline bytes) of an image; either may be None."""
    kind, value = betterproto2.which_one_of(image, "data_or_blob_id")
    if kind == "data":
        return None, value
    if kind == "blob_id":
        return value, None
    if kind == "blob_id_with_data":
        return value.blob_id or None, value.data or None
    return None, None


def blobs_to_fetch(message: agent.UserMessage | None, have: Mapping[bytes, bytes]) -> list[bytes]:
    """The blob ids of images whose bytes are neither inline nor in ``have``, once each."""
    wanted: dict[bytes, None] = {}
    for image in selected_images(message):
        blob_id, data = _source(image)
        if data is None and blob_id is not None and blob_id not in have:
            wanted[blob_id] = None
    return list(wanted)


def resolve_images(message: agent.UserMessage | None, blobs: Mapping[bytes, bytes]) -> tuple[ImagePart, ...]:
    """The message's images in order; ImageError naming the first one that cannot be sent."""
    parts: list[ImagePart] = []
    for n, image in enumerate(selected_images(message), start=1):
        name = image_name(image, n)
        blob_id, data = _source(image)
        if data is not None:
            if blob_id is not None and hashlib.sha256(data).digest() != blob_id:
                raise ImageError(f"{name}: its bytes do not match its blob id {blob_id.hex()[:12]}")
        elif blob_id is not None:
            data = blobs.get(blob_id)
            if data is None:
                raise ImageError(f"{name}: the client did not deliver blob {blob_id.hex()[:12]}")
        else:
            raise ImageError(f"{name} carries neither its bytes nor a blob id")
        parts.append(ImagePart.of(data, what=name, label=image.mime_type))
    return tuple(parts)
