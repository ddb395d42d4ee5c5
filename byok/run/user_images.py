"""The images of a user's message, read before its runtime message is built: the pre-delivered
blobs first, the rest from the client's KV store (GETs, concurrently), each verified against its
id. What cannot be read or sent ends the run before anything is appended, naming the image."""

from __future__ import annotations

import trio

from byok.cursor.pasted_images import blobs_to_fetch, resolve_images
from byok.cursor.request import RunStart
from byok.loop.turn_values import Failed, FailedError
from byok.model.images import ImageError, ImagePart
from byok.run.kv import KvFailure, KvLink


async def user_images(kv: KvLink, st: RunStart, timeout_s: float) -> tuple[ImagePart, ...]:
    if not st.image_count:
        return ()
    blobs = dict(st.pre_fetched)
    errors: list[str] = []

    async def get(blob_id: bytes) -> None:
        try:
            blobs[blob_id] = await kv.get(blob_id, timeout_s)
        except KvFailure as e:
            errors.append(str(e))

    async with trio.open_nursery() as nursery:
        for blob_id in blobs_to_fetch(st.user_message, blobs):
            nursery.start_soon(get, blob_id)
    if errors:
        raise FailedError(
            Failed("failed_precondition", f"cannot read a pasted image from the client: {errors[0]}")
        )
    try:
        return resolve_images(st.user_message, blobs)
    except ImageError as e:
        raise FailedError(Failed("invalid_argument", f"cannot send the message's images: {e}")) from None
