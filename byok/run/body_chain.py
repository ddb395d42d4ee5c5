"""How long a byte prefix two request bodies share, known without keeping the bodies.

The call log stores a call's body as a tail of the previous call's (store/call_bodies.py). What
it remembers of the previous call is its layout: where the message array starts, a digest of
everything before it, and each element's digest and length. Equal digests mean equal bytes, so
the shared prefix of two bodies runs through their last common element.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import attrs

from byok.model.body import Body, view
from byok.model.request import RenderedRequest


@attrs.frozen
class BodyLayout:
    lead: bytes  # SHA-256 of the body before its message array
    start: int  # offset of the array's "["
    digests: tuple[bytes, ...] = attrs.field(repr=False)  # SHA-256 of each array element
    lengths: tuple[int, ...] = attrs.field(repr=False)


def layout_of(body: Body, shape: RenderedRequest, digests: Sequence[bytes]) -> BodyLayout | None:
    """The layout of ``body``, whose elements (as in ``shape``) hash to ``digests``. None when
    the array is not written compactly (elements joined by exactly ","), since element offsets
    then do not follow from their lengths."""
    if shape.array is None or shape.elements is None or len(digests) != len(shape.elements):
        return None
    start, end = shape.array
    array = shape.elements[shape.head :]
    lengths = tuple(len(e) for e in array)
    if end - start != 2 + sum(lengths) + max(len(array) - 1, 0):
        return None
    lead = hashlib.sha256(view(body, 0, start)).digest()
    return BodyLayout(lead, start, tuple(digests[shape.head :]), lengths)


def _through(layout: BodyLayout, count: int) -> int:
    """Offset just past the array's first ``count`` elements (just past its "[" for none)."""
    return layout.start + 1 + sum(layout.lengths[:count]) + max(count - 1, 0)


def compared_end(layout: BodyLayout) -> int:
    """Offset just past the array's last element: the bytes a later call sharing every element
    shares with this body."""
    return _through(layout, len(layout.lengths))


def shared_bytes(previous: BodyLayout, current: BodyLayout) -> int:
    """Bytes both bodies hold from their start: through the last array element they share, or
    through the "[" when they share none. 0 when what precedes the arrays differs."""
    if previous.lead != current.lead or previous.start != current.start:
        return 0
    common = 0
    for a, b in zip(previous.digests, current.digests, strict=False):
        if a != b:
            break
        common += 1
    return _through(current, common)
