"""build_checkpoint: the state structure and the content-addressed blob graph it references."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

import attrs
from hypothesis import given
from hypothesis import strategies as st

from byok.cursor.checkpoint import (
    Blob,
    Checkpoint,
    RootList,
    TurnRecord,
    assistant_step,
    build_checkpoint,
    root_blob,
    system_root,
    thinking_step,
)
from byok.cursor.root_json import decode_root, encode_root
from byok.model.messages import Message, ToolCall
from byok.pb.agent import v1 as agent

DETAILS = agent.ConversationTokenDetails(used_tokens=1200, max_tokens=200_000)
SYSTEM = "You are a coding agent."

USER_MSG = bytes(agent.UserMessage(text="fix the bug", message_id="m-1", mode=agent.AgentMode.AGENT))


def user(text: str) -> Message:
    return Message(role="user", origin="user", text=text)


def assistant(text: str) -> Message:
    return Message(role="assistant", origin="assistant", text=text)


def build(
    *,
    stable: Sequence[Message] = (),
    pending: Sequence[Message] = (),
    prior_turns: Sequence[bytes] = (),
    turn: TurnRecord | None = None,
    system_prompt: str = SYSTEM,
    mode: agent.AgentMode = agent.AgentMode.AGENT,
    root_of: Callable[[Message], Blob] = root_blob,
    roots: RootList | None = None,
) -> Checkpoint:
    return build_checkpoint(
        system_prompt=system_prompt,
        stable=stable,
        pending=pending,
        prior_turns=prior_turns,
        turn=turn,
        token_details=DETAILS,
        mode=mode,
        root_of=root_of,
        roots=roots,
    )


def state_of(cp: Checkpoint) -> agent.ConversationStateStructure:
    return agent.ConversationStateStructure.parse(cp.state)


def blob_map(cp: Checkpoint) -> dict[bytes, bytes]:
    return {b.id: b.data for b in cp.blobs}


def referenced_ids(cp: Checkpoint, state: agent.ConversationStateStructure) -> list[bytes]:
    """Every blob id the state reaches: roots, turns, and each turn's user message and steps."""
    blobs = blob_map(cp)
    out = [*state.root_prompt_messages_json, *state.turns]
    for turn_id in state.turns:
        if turn_id not in blobs:
            continue
        turn = agent.ConversationTurnStructure.parse(blobs[turn_id]).agent_conversation_turn
        assert turn is not None
        out += [turn.user_message, *turn.steps]
    return out


def full_turn(request_id: str = "req-1") -> TurnRecord:
    return (
        TurnRecord(request_id, USER_MSG)
        .with_step(thinking_step("let me think", 1500))
        .with_step(assistant_step("Done."))
    )


HISTORY = (
    Message(role="system", origin="runtime", text="ignored stored system prompt"),
    user("hello"),
    Message(role="user", origin="runtime", text="<runtime context>"),
    assistant("hi there"),
    Message(
        role="assistant",
        origin="assistant",
        tool_calls=(ToolCall("c1", "read", "{}", 0),),
        tool_round_id="r1",
    ),
    Message(
        role="tool",
        origin="tool",
        text="file",
        tool_call_id="c1",
        tool_name="read",
        tool_round_id="r1",
        completion_seq=1,
    ),
)


# -- blobs ---------------------------------------------------------------------------------------------


def test_every_blob_id_is_the_sha256_of_its_data() -> None:
    cp = build(stable=HISTORY, turn=full_turn(), pending=[assistant("p")])
    assert cp.blobs
    for b in cp.blobs:
        assert b.id == hashlib.sha256(b.data).digest()


def test_blob_of() -> None:
    assert Blob.of(b"abc") == Blob(hashlib.sha256(b"abc").digest(), b"abc")


def test_blob_ids_are_unique() -> None:
    same = user("same")
    cp = build(stable=[same, assistant("x"), same], turn=full_turn())
    ids = [b.id for b in cp.blobs]
    assert len(ids) == len(set(ids))
    # The state still lists the repeated message twice.
    roots = state_of(cp).root_prompt_messages_json
    assert roots[1] == roots[3]


# -- roots ---------------------------------------------------------------------------------------------


def test_roots_are_system_root_then_each_non_system_stable_message_in_order() -> None:
    cp = build(stable=HISTORY)
    roots = state_of(cp).root_prompt_messages_json
    non_system = [m for m in HISTORY if m.role != "system"]
    assert roots == [system_root(SYSTEM).id, *(root_blob(m).id for m in non_system)]
    blobs = blob_map(cp)
    assert decode_root(blobs[roots[0]]) == Message(role="system", origin="runtime", text=SYSTEM)
    assert [decode_root(blobs[r]) for r in roots[1:]] == non_system


def test_system_prompt_comes_from_the_argument_not_the_history() -> None:
    a = state_of(build(stable=HISTORY, system_prompt="A")).root_prompt_messages_json
    b = state_of(build(stable=HISTORY, system_prompt="B")).root_prompt_messages_json
    assert a[0] != b[0]
    assert a[1:] == b[1:]


def test_root_of_is_used_for_stable_messages() -> None:
    seen: list[Message] = []

    def root_of(m: Message) -> Blob:
        seen.append(m)
        return Blob.of(b"custom:" + m.text.encode())

    cp = build_checkpoint(
        system_prompt=SYSTEM,
        stable=[user("a"), assistant("b")],
        turn=None,
        token_details=DETAILS,
        mode=agent.AgentMode.AGENT,
        root_of=root_of,
    )
    assert seen == [user("a"), assistant("b")]
    assert state_of(cp).root_prompt_messages_json[1:] == [Blob.of(b"custom:a").id, Blob.of(b"custom:b").id]
    assert blob_map(cp)[Blob.of(b"custom:b").id] == b"custom:b"


# -- staged (pending) vs settled -----------------------------------------------------------------------


def test_staged_checkpoint_carries_pending_inline_not_in_roots() -> None:
    stable = [user("q")]
    pending = Message(
        role="assistant",
        origin="assistant",
        text="calling",
        tool_calls=(ToolCall("c", "ls", "{}", 0),),
        tool_round_id="r",
    )
    cp = build(stable=stable, pending=[pending], turn=full_turn())
    state = state_of(cp)
    assert state.pending_tool_calls == [encode_root(pending).decode()]
    assert decode_root(state.pending_tool_calls[0].encode()) == pending
    assert root_blob(pending).id not in state.root_prompt_messages_json
    assert root_blob(pending).id not in blob_map(cp)
    assert state.root_prompt_messages_json == [system_root(SYSTEM).id, root_blob(stable[0]).id]


def test_settled_checkpoint_folds_pending_into_the_roots() -> None:
    stable = [user("q")]
    pending = assistant("answer")
    staged = state_of(build(stable=stable, pending=[pending], turn=full_turn()))
    settled_cp = build(stable=[*stable, pending], turn=full_turn())
    settled = state_of(settled_cp)
    assert settled.pending_tool_calls == []
    assert settled.root_prompt_messages_json == [*staged.root_prompt_messages_json, root_blob(pending).id]
    assert settled.turns == staged.turns


# -- turns ---------------------------------------------------------------------------------------------


def test_prior_turns_are_preserved_and_the_new_turn_is_appended() -> None:
    prior = [hashlib.sha256(b"t1").digest(), hashlib.sha256(b"t2").digest()]
    cp = build(stable=[user("q")], prior_turns=prior, turn=full_turn())
    state = state_of(cp)
    assert state.turns == [*prior, cp.turn_id]
    assert cp.turn_id is not None


def test_no_turn_keeps_prior_turns_and_has_no_turn_id() -> None:
    prior = [hashlib.sha256(b"t1").digest()]
    cp = build(stable=[user("q")], prior_turns=prior, turn=None)
    assert state_of(cp).turns == prior
    assert cp.turn_id is None
    assert [b.id for b in cp.blobs] == state_of(cp).root_prompt_messages_json


def test_turn_structure_references_user_message_and_steps_in_order() -> None:
    turn = full_turn("req-42")
    cp = build(stable=[user("q")], turn=turn)
    blobs = blob_map(cp)
    assert cp.turn_id is not None
    structure = agent.ConversationTurnStructure.parse(blobs[cp.turn_id]).agent_conversation_turn
    assert structure is not None
    assert structure.request_id == "req-42"
    assert blobs[structure.user_message] == USER_MSG
    assert [blobs[s] for s in structure.steps] == list(turn.steps)
    steps = [agent.ConversationStep.parse(blobs[s]) for s in structure.steps]
    assert steps[0].thinking_message == agent.ThinkingMessage(text="let me think", duration_ms=1500)
    assert steps[1].assistant_message == agent.AssistantMessage(text="Done.")


def test_with_step_appends_without_mutating() -> None:
    t0 = TurnRecord("r", USER_MSG)
    t1 = t0.with_step(assistant_step("a"))
    assert t0.steps == ()
    assert t1.steps == (assistant_step("a"),)
    assert t1.with_step(assistant_step("b")).steps == (assistant_step("a"), assistant_step("b"))


def test_turn_id_changes_when_a_step_is_added() -> None:
    a = build(stable=[user("q")], turn=TurnRecord("r", USER_MSG))
    b = build(stable=[user("q")], turn=TurnRecord("r", USER_MSG).with_step(assistant_step("x")))
    assert a.turn_id != b.turn_id


# -- graph closure and order ---------------------------------------------------------------------------


def test_every_referenced_id_is_a_blob_and_children_come_before_parents() -> None:
    cp = build(stable=HISTORY, pending=[assistant("p")], turn=full_turn())
    state = state_of(cp)
    position = {b.id: i for i, b in enumerate(cp.blobs)}
    refs = referenced_ids(cp, state)
    for ref in refs:
        assert ref in position
    assert set(position) == set(refs)  # and nothing unreferenced is shipped
    assert cp.turn_id is not None
    turn = agent.ConversationTurnStructure.parse(blob_map(cp)[cp.turn_id]).agent_conversation_turn
    assert turn is not None
    for child in [turn.user_message, *turn.steps]:
        assert position[child] < position[cp.turn_id]


def test_state_fields() -> None:
    state = state_of(build(stable=[user("q")], turn=full_turn(), mode=agent.AgentMode.PLAN))
    assert state.mode == agent.AgentMode.PLAN
    assert state.token_details == DETAILS


# -- determinism and locality ----------------------------------------------------------------------

_text = st.text(alphabet='abc é\n{}"', max_size=8)
_messages = st.lists(
    st.one_of(
        st.builds(user, _text),
        st.builds(assistant, _text),
        st.builds(lambda t: Message(role="user", origin="runtime", text=t), _text),
    ),
    max_size=6,
)


@given(_messages, _messages, st.lists(_text, max_size=3), _text)
def test_same_inputs_give_identical_bytes(
    stable: list[Message], pending: list[Message], steps: list[str], system_prompt: str
) -> None:
    def make() -> Checkpoint:
        turn = TurnRecord("req", USER_MSG)
        for s in steps:
            turn = turn.with_step(assistant_step(s))
        # Fresh but equal objects each time: only values matter.
        return build(
            stable=[attrs.evolve(m) for m in stable],
            pending=[attrs.evolve(m) for m in pending],
            prior_turns=[b"\x01" * 32],
            turn=turn,
            system_prompt=system_prompt,
        )

    a, b = make(), make()
    assert a == b
    assert a.state == b.state
    state = state_of(a)
    blobs = blob_map(a)
    for ref in referenced_ids(a, state):
        assert ref in blobs or ref == b"\x01" * 32


@given(_messages.filter(bool), st.data())
def test_changing_one_message_changes_only_its_own_root_id(
    stable: list[Message], data: st.DataObject
) -> None:
    i = data.draw(st.integers(0, len(stable) - 1))
    changed = list(stable)
    changed[i] = attrs.evolve(stable[i], text=stable[i].text + "!")
    before = state_of(build(stable=stable, turn=full_turn())).root_prompt_messages_json
    after = state_of(build(stable=changed, turn=full_turn())).root_prompt_messages_json
    assert len(before) == len(after)
    diff = [j for j, (x, y) in enumerate(zip(before, after, strict=True)) if x != y]
    assert diff == [i + 1]  # +1: the system root comes first


@given(
    stable=st.lists(st.text(max_size=30).map(user), max_size=12),
    pending=st.lists(st.text(max_size=30).map(assistant), max_size=2),
    prior_turns=st.lists(st.binary(max_size=40), max_size=6),
    with_turn=st.booleans(),
    mode=st.sampled_from(list(agent.AgentMode)),
)
def test_the_state_bytes_are_what_betterproto2_writes(
    stable: list[Message],
    pending: list[Message],
    prior_turns: list[bytes],
    with_turn: bool,
    mode: agent.AgentMode,
) -> None:
    """The id lists are hand-encoded: the bytes must still be betterproto2's, entry for entry
    (ids of any length, empty ones included)."""
    turn = TurnRecord("req-1", USER_MSG).with_step(assistant_step("done")) if with_turn else None
    cp = build(stable=stable, pending=pending, prior_turns=prior_turns, turn=turn, mode=mode)
    assert bytes(agent.ConversationStateStructure.parse(cp.state)) == cp.state


# -- RootList: the root entries of a growing history, extended -----------------------------------


def held_by(acked: set[bytes]) -> Callable[[Message], Blob]:
    """root_of as a conversation's memory answers it: no data for a blob the client holds."""

    def root_of(m: Message) -> Blob:
        blob = root_blob(m)
        return Blob(blob.id, b"") if blob.id in acked else blob

    return root_of


def checkpoint_with(
    stable: Sequence[Message], root_of: Callable[[Message], Blob], roots: RootList | None
) -> Checkpoint:
    return build(stable=stable, root_of=root_of, roots=roots)


def test_a_root_list_asks_only_for_the_roots_of_what_is_new() -> None:
    history = [user("q1"), assistant("a1"), Message(role="system", origin="runtime", text="s"), user("q2")]
    acked: set[bytes] = set()
    asked: list[Message] = []

    def root_of(m: Message) -> Blob:
        asked.append(m)
        return held_by(acked)(m)

    roots = RootList()
    first = checkpoint_with(history, root_of, roots)
    assert asked == [history[0], history[1], history[3]]
    acked.update(b.id for b in first.blobs)
    asked.clear()
    again = checkpoint_with(history, root_of, roots)  # every root came back with data: none was kept
    assert asked == [history[0], history[1], history[3]]
    assert again.state == first.state
    asked.clear()
    longer = [*history, assistant("a2")]
    grown = checkpoint_with(longer, root_of, roots)
    assert asked == [longer[4]]  # the acked prefix was kept
    assert grown.state == checkpoint_with(longer, held_by(acked), None).state
    assert [b.id for b in grown.blobs] == [system_root(SYSTEM).id, root_blob(longer[4]).id]


def test_a_root_list_starts_again_for_a_history_that_does_not_extend_it() -> None:
    acked: set[bytes] = set()
    history = [user("q1"), assistant("a1"), user("q2")]
    roots = RootList()
    acked.update(b.id for b in checkpoint_with(history, held_by(acked), roots).blobs)
    checkpoint_with(history, held_by(acked), roots)  # keeps all three
    edited = [history[0], history[1], user("q2, edited"), assistant("a2")]
    same_values = [attrs.evolve(m) for m in history]  # a history decoded again: equal, not identical
    for other in (edited, same_values, history[:2], history[1:]):
        asked: list[Message] = []
        cp = checkpoint_with(other, lambda m, asked=asked: asked.append(m) or held_by(acked)(m), roots)
        assert cp.state == checkpoint_with(other, held_by(acked), None).state
        assert asked == list(other)  # every root asked for again


_op = st.one_of(
    st.tuples(st.just("append"), st.lists(_text, min_size=1, max_size=3)),
    st.tuples(st.just("ack"), st.integers(0, 100)),
    st.tuples(st.just("branch"), st.tuples(st.integers(0, 20), _text)),
    st.tuples(st.just("decode"), st.none()),
)


@given(st.lists(_op, max_size=25))
def test_a_root_list_gives_the_checkpoint_of_a_fresh_one(ops: list[tuple[str, object]]) -> None:
    """Whatever the history does (grows, is edited, is read back as new objects) and whatever
    the client acknowledges, a kept RootList yields the same state and blobs as a fresh one."""
    acked: set[bytes] = set()
    roots = RootList()
    history: list[Message] = []
    n = 0
    for op, arg in ops:
        if op == "append":
            for text in arg:  # type: ignore[attr-defined]
                n += 1
                history.append(user(text) if n % 3 else assistant(text))
                if n % 5 == 0:
                    history.append(Message(role="system", origin="runtime", text=text))
        elif op == "ack":
            for m in history[: int(arg)]:  # type: ignore[call-overload]
                acked.add(root_blob(m).id)
        elif op == "branch":  # an edit: back to a shorter history, then a new message
            at, text = arg  # type: ignore[misc]
            history = [*history[:at], user(text)]
        else:
            history = [attrs.evolve(m) for m in history]
        for stable in (history[:-1], history):
            kept = checkpoint_with(stable, held_by(acked), roots)
            fresh = checkpoint_with(stable, held_by(acked), None)
            assert kept.state == fresh.state
            assert kept.blobs == tuple(b for b in fresh.blobs if b.data)
