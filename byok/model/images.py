"""Images in messages: the part a message carries, and the media type read from the bytes.

A part is content-addressed: its identity (and a message's encoding) is the media type, the
SHA-256 of the bytes and their length; the bytes travel with the part in memory and live in the
store's blob table (store/images.py), not in the message's JSON.

The media type is always sniffed from the bytes, never taken from a label: clients label pasted
screenshots as whatever the clipboard said (a PNG sent as image/jpeg is refused by Anthropic and
mis-decoded elsewhere). Providers take PNG, JPEG, GIF and WebP; anything else is an ImageError
that names the image, never a silent drop.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any

import attrs

PNG, JPEG, GIF, WEBP = "image/png", "image/jpeg", "image/gif", "image/webp"
MEDIA_TYPES = (PNG, JPEG, GIF, WEBP)


class ImageError(ValueError):
    """An image byok cannot send: the message says which and why, in one line."""


def sniff_image_type(data: bytes) -> str | None:
    """The media type the bytes' magic number says (PNG, JPEG, GIF, WebP), or None."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return PNG
    if data.startswith(b"\xff\xd8\xff"):
        return JPEG
    if data.startswith((b"GIF87a", b"GIF89a")):
        return GIF
    if len(data) >= 12 and data.startswith(b"RIFF") and data[8:12] == b"WEBP":
        return WEBP
    return None


@attrs.frozen(cache_hash=True)
class ImagePart:
    """One image of a message. Equality and hashing ignore ``data`` (the SHA-256 names it), so
    a part read back from the store compares equal to the one that was appended."""

    media_type: str
    sha256: str  # hex
    size: int
    data: bytes = attrs.field(default=b"", eq=False, repr=False)

    @classmethod
    def of(cls, data: bytes, *, what: str = "the image", label: str = "") -> ImagePart:
        """The part for ``data``, its type sniffed; ``what``/``label`` name it in the error."""
        media_type = sniff_image_type(data)
        if media_type is None:
            labelled = f", labelled {label}" if label else ""
            raise ImageError(
                f"{what} ({len(data)} bytes{labelled}) is not a PNG, JPEG, GIF or WebP image; "
                "only those can be sent to a model"
            )
        return cls(media_type, hashlib.sha256(data).hexdigest(), len(data), data)

    def to_json(self) -> dict[str, Any]:
        return {"media_type": self.media_type, "sha256": self.sha256, "size": self.size}

    @classmethod
    def from_json(cls, obj: Any) -> ImagePart:
        return cls(obj["media_type"], obj["sha256"], obj["size"])

    def with_data(self, data: bytes) -> ImagePart:
        return attrs.evolve(self, data=data)

    @property
    def blob_id(self) -> bytes:
        return bytes.fromhex(self.sha256)

    def base64(self) -> str:
        if len(self.data) != self.size:
            # Only a store that lost the bytes gets here (store/images.py refuses such a read).
            raise ImageError(f"image {self.sha256[:12]} has no data")
        return base64.b64encode(self.data).decode("ascii")

    def data_url(self) -> str:
        return f"data:{self.media_type};base64,{self.base64()}"
