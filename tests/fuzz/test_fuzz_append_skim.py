"""Fuzzing the reader of an over-limit BidiAppend (``byok.http.append_skim``).

Good bodies, in any wrapping Cursor may use and cut anywhere, give exactly the fields a whole
parse gives; any bytes give those fields or a ProtocolError, never another exception.
"""

from __future__ import annotations

import gzip
from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from byok.devtools.cursor_sim import user_turn
from byok.http.append_skim import KEEP_DATA_HEX, AppendSkim, exec_id_of, is_whole_run_request
from byok.http.connect_envelope import FLAG_COMPRESSED, ProtocolError
from byok.pb.agent import v1 as agent
from byok.pb.aiserver import v1 as aiserver
from tests.fuzz.support import fuzz

_WRAPPINGS = ("raw", "enveloped", "gzip", "envelope-gzip", "sniffed")


def _wrap(body: bytes, wrapping: str) -> tuple[bytes, str, str | None]:
    """(HTTP body, content type, content encoding)."""
    if wrapping == "raw":
        return body, "application/proto", None
    if wrapping == "gzip":
        return gzip.compress(body), "application/proto", "gzip"
    if wrapping == "envelope-gzip":
        packed = gzip.compress(body)
        return (
            bytes([FLAG_COMPRESSED]) + len(packed).to_bytes(4, "big") + packed,
            "application/connect+proto",
            None,
        )
    enveloped = b"\0" + len(body).to_bytes(4, "big") + body
    return enveloped, ("application/connect+proto" if wrapping == "enveloped" else ""), None


def _skim(data: bytes, content_type: str, encoding: str | None, cuts: list[int]) -> AppendSkim:
    skim = AppendSkim(content_type, encoding, inflate_limit=1 << 24)
    at = 0
    for cut in sorted(c % (len(data) + 1) for c in cuts):
        skim.feed(data[at:cut])
        at = cut
    skim.feed(data[at:])
    return skim


_seqnos = st.integers(-(2**63), 2**63 - 1)


@fuzz(300)
@given(
    request_id=st.text(max_size=40),
    seqno=_seqnos,
    data=st.text(alphabet="0123456789abcdef", max_size=3000),
    binary=st.binary(max_size=20),
    wrapping=st.sampled_from(_WRAPPINGS),
    cuts=st.lists(st.integers(0, 10_000), max_size=8),
)
def test_skimmed_fields_equal_a_whole_parse_however_cut_and_wrapped(
    request_id: str, seqno: int, data: str, binary: bytes, wrapping: str, cuts: list[int]
) -> None:
    body = bytes(
        aiserver.BidiAppendRequest(
            data=data,
            request_id=aiserver.BidiRequestId(request_id=request_id),
            append_seqno=seqno,
            data_binary=binary,
        )
    )
    wire, content_type, encoding = _wrap(body, wrapping)
    skim = _skim(wire, content_type, encoding, cuts)
    if not request_id:
        try:
            skim.result()
        except ProtocolError as e:
            assert "request_id" in e.message
            return
        raise AssertionError("an append without a request id was accepted")
    got = skim.result()
    assert (got.request_id, got.seqno, got.data_head, got.data_size, got.has_binary) == (
        request_id,
        seqno,
        data[:KEEP_DATA_HEX],
        len(data),
        bool(binary),
    )


@fuzz(300)
@given(
    data=st.binary(max_size=300),
    content_type=st.sampled_from(["application/proto", "application/connect+proto", ""]),
    encoding=st.sampled_from([None, "gzip", "br"]),
    gzipped=st.booleans(),
    cuts=st.lists(st.integers(0, 400), max_size=5),
)
def test_skim_of_arbitrary_bytes_gives_fields_or_a_protocol_error(
    data: bytes, content_type: str, encoding: str | None, gzipped: bool, cuts: list[int]
) -> None:
    if gzipped:
        data = gzip.compress(data)
    try:
        got = _skim(data, content_type, encoding, cuts).result()
    except ProtocolError as e:
        assert e.code in ("invalid_argument", "resource_exhausted")
        return
    assert got.request_id and len(got.data_head) <= KEEP_DATA_HEX


_results = st.sampled_from(
    [
        lambda: {"read_result": agent.ReadResult(success=agent.ReadSuccess(path="p", content="x" * 400))},
        lambda: {"grep_result": agent.GrepResult()},
        lambda: {"shell_result": agent.ShellResult()},
        lambda: {},
    ]
)


def test_exec_id_of_names_the_exec_of_any_result_message() -> None:
    tally: Counter[str] = Counter()

    @fuzz(300)
    @given(
        exec_id=st.integers(0, 2**32 - 1),
        call_id=st.text(max_size=60),
        result=_results,
        head=st.integers(0, KEEP_DATA_HEX),
    )
    def prop(exec_id: int, call_id: str, result: object, head: int) -> None:
        msg = agent.AgentClientMessage(
            exec_client_message=agent.ExecClientMessage(id=exec_id, exec_id=call_id, **result())  # type: ignore[operator]
        )
        hex_data = bytes(msg).hex()
        found = exec_id_of(hex_data[:head])
        if (exec_id and head == KEEP_DATA_HEX) or len(hex_data) <= head:
            # A whole prefix, or the whole message: the id is there to read (0 is not sent).
            assert found == (exec_id or None)
            tally["found"] += 1
        else:
            assert found in (None, exec_id)  # cut before the id: nothing, never another number
            tally["cut"] += 1

    prop()
    assert tally["found"] >= 50 and tally["cut"] >= 20, tally


@fuzz(300)
@given(st.text(max_size=600) | st.binary(max_size=300).map(bytes.hex))
def test_exec_id_of_arbitrary_text_is_an_id_or_none(text: str) -> None:
    found = exec_id_of(text)
    assert found is None or 0 <= found < 2**32
    other = agent.AgentClientMessage(kv_client_message=agent.KvClientMessage(id=5))
    assert exec_id_of(bytes(other).hex()) is None  # not an exec result


@fuzz(300)
@given(
    text=st.text(max_size=3000),
    trailer=st.binary(max_size=40),
    other=st.booleans(),
)
def test_is_whole_run_request_only_for_one_run_request_spanning_the_data(
    text: str, trailer: bytes, other: bool
) -> None:
    run = agent.AgentClientMessage(
        run_request=user_turn(text, conversation_id="c", model_id="m", message_id="m1")
    )
    if other:  # any other message of the same size class is never taken for a run_request
        run = agent.AgentClientMessage(
            kv_client_message=agent.KvClientMessage(
                id=1, set_blob_result=agent.SetBlobResult(error=agent.Error(message=text))
            )
        )
    data = (bytes(run) + trailer).hex()
    whole = is_whole_run_request(data[:KEEP_DATA_HEX], len(data))
    assert whole == (not other and not trailer)
    assert not is_whole_run_request(data[:KEEP_DATA_HEX], len(data) + 1)  # an odd hex length
