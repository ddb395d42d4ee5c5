"""Fuzzing AgentClientMessage handling with well-typed messages of any content: ``parse_run_request``,
every tool's Exec state machine and argument validation, and ``KvLink``.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import betterproto2
from hypothesis import example, given
from hypothesis import strategies as st

from byok.cursor.checkpoint import Blob
from byok.cursor.client_messages import kv_answer
from byok.cursor.exec_router import ExecRouter
from byok.cursor.request import RunRequestError, parse_run_request
from byok.cursor.tools.base import Invocation, ToolArgError
from byok.cursor.tools.env import ToolEnv
from byok.cursor.tools.registry import build_registry
from byok.devtools.cursor_sim import user_turn
from byok.pb.agent import v1 as agent
from byok.run.kv import KvLink
from tests.fuzz.support import any_json, fuzz, known_bug, protos, texts

_modes = st.sampled_from(list(agent.AgentMode))
_base_run_requests = st.builds(
    user_turn,
    texts,
    conversation_id=st.sampled_from(["conv-1", "c"]),
    model_id=st.sampled_from(["m", "gpt-x"]),
    message_id=st.sampled_from(["u1", ""]),
    mode=_modes,
    state=st.none() | st.builds(agent.ConversationStateStructure, mode=_modes),
)
_completions = st.lists(
    st.builds(agent.BackgroundTaskCompletion, task_id=st.sampled_from(["", "t1"])), max_size=2
)
# (field, value): each replaces one field of the valid request (None clears it).
_run_request_edits = st.one_of(
    st.tuples(st.just("conversation_id"), st.sampled_from(["", "c2"]) | st.text(max_size=4)),
    st.tuples(
        st.just("requested_model"),
        st.none() | st.builds(agent.RequestedModel, model_id=st.sampled_from(["", "m2"])),
    ),
    st.tuples(
        st.just("model_details"),
        st.none() | st.builds(agent.ModelDetails, model_id=st.sampled_from(["", "m3"])),
    ),
    st.tuples(
        st.just("action"),
        st.none()
        | st.just(agent.ConversationAction())
        | st.sampled_from(
            [
                agent.ConversationAction(cancel_action=agent.CancelAction()),
                agent.ConversationAction(summarize_action=agent.SummarizeAction()),
            ]
        )
        | protos(agent.ConversationAction, 2)
        | st.builds(
            lambda c: agent.ConversationAction(
                background_task_completion_action=agent.BackgroundTaskCompletionAction(completions=c)
            ),
            _completions,
        )
        | st.builds(
            lambda ctx: agent.ConversationAction(resume_action=agent.ResumeAction(request_context=ctx)),
            st.none() | st.just(agent.RequestContext()),
        ),
    ),
    st.tuples(st.just("user_message"), st.none() | st.builds(agent.UserMessage, text=texts, mode=_modes)),
    st.tuples(
        st.just("conversation_state"), st.none() | st.builds(agent.ConversationStateStructure, mode=_modes)
    ),
)


def _edit_run_request(req: agent.AgentRunRequest, edits: list[tuple[str, Any]]) -> agent.AgentRunRequest:
    for name, value in edits:
        if name != "user_message":
            setattr(req, name, value)
        elif req.action is not None and req.action.user_message_action is not None:
            req.action.user_message_action.user_message = value
    return req


# Every action a run request may carry but ``cancel_action`` (a live run's own message).
_SUPPORTED_ACTIONS = (
    "user_message_action",
    "start_plan_action",
    "resume_action",
    "summarize_action",
    "background_task_completion_action",
    "async_ask_question_completion_action",
    "execute_plan_action",
    "cancel_subagent_action",
    "background_subagent_action",
    "shell_command_action",
    "background_shell_action",
)


def _startable(action: Any) -> bool:
    """An action a run can start from, with what its kind needs (parse_run_request's checks)."""
    if isinstance(action, agent.UserMessageAction | agent.StartPlanAction):
        return action.user_message is not None
    if isinstance(action, agent.BackgroundTaskCompletionAction):
        return bool(action.completions) and all(c.task_id for c in action.completions)
    if isinstance(action, agent.AsyncAskQuestionCompletionAction):
        answered, _ = betterproto2.which_one_of(action.result or agent.AskQuestionResult(), "result")
        return bool(action.original_tool_call_id) and answered in ("success", "rejected", "error")
    if isinstance(action, agent.CancelSubagentAction):
        return bool(action.subagent_id)
    if isinstance(action, agent.BackgroundSubagentAction | agent.BackgroundShellAction):
        return bool(action.tool_call_id)
    if isinstance(action, agent.ShellCommandAction):
        return action.shell_command is not None and bool(action.shell_command.command.strip())
    return isinstance(action, agent.ResumeAction | agent.SummarizeAction | agent.ExecutePlanAction)


_RUN_MODES = {
    agent.AgentMode.UNSPECIFIED,
    agent.AgentMode.AGENT,
    agent.AgentMode.ASK,
    agent.AgentMode.PLAN,
    agent.AgentMode.DEBUG,
    agent.AgentMode.MULTITASK,
}


def test_parse_run_request_on_any_run_request() -> None:
    """A valid run_request with fields cleared or replaced: a RunStart that carries exactly what
    the request asked for, or RunRequestError with the right code; a request with a model, a
    conversation id and a startable action is never refused. The tally makes sure both happen."""
    tally: Counter[str] = Counter()

    @fuzz(300)
    @example(user_turn("hi", conversation_id="c", model_id="m", message_id="u1"), [])
    @example(
        user_turn("hi", conversation_id="c", model_id="m", message_id="u1"),
        [("action", agent.ConversationAction(cancel_action=agent.CancelAction()))],
    )
    @given(_base_run_requests, st.lists(_run_request_edits, max_size=3))
    def prop(req: agent.AgentRunRequest, edits: list[tuple[str, Any]]) -> None:
        req = _edit_run_request(req, edits)
        model_id = (req.requested_model.model_id if req.requested_model is not None else "") or (
            req.model_details.model_id if req.model_details is not None else ""
        )
        action, value = ("", None) if req.action is None else betterproto2.which_one_of(req.action, "action")
        try:
            start = parse_run_request("req-1", req)
        except RunRequestError as e:
            tally[e.code] += 1
            # Model, conversation id and action are checked first; then an action we do not run,
            # what the action needs, and last a mode byok does not run.
            assert e.message
            if not (model_id and req.conversation_id and action):
                assert e.code == "invalid_argument"
            elif action not in _SUPPORTED_ACTIONS:
                assert e.code == "unimplemented"
            elif not _startable(value):
                assert e.code == "invalid_argument", e.message
            else:
                assert e.code == "unimplemented" and "does not run mode" in e.message, e.message
            return
        tally["ok"] += 1
        assert (start.request_id, start.conversation_id, start.model_id) == (
            "req-1",
            req.conversation_id,
            model_id,
        )
        assert model_id and req.conversation_id
        assert start.action == action and action in _SUPPORTED_ACTIONS
        assert start.client_state is req.conversation_state
        turn = isinstance(value, agent.UserMessageAction | agent.StartPlanAction)
        message = value.user_message if turn else None
        assert start.user_message is message and (not turn or message is not None)
        assert start.request_context is getattr(value, "request_context", None)
        completions = value.completions if isinstance(value, agent.BackgroundTaskCompletionAction) else []
        assert list(start.completions) == completions and all(c.task_id for c in completions)
        assert (action == "background_task_completion_action") == bool(completions)
        assert start.mode in _RUN_MODES
        if action in ("start_plan_action", "execute_plan_action"):
            return  # their own modes (plan; the execution mode)
        # The message's mode wins, then the restored state's; AGENT when neither says.
        state_mode = req.conversation_state.mode if req.conversation_state is not None else 0
        if message is not None and message.mode != agent.AgentMode.UNSPECIFIED:
            assert start.mode == message.mode
        else:
            assert start.mode == (state_mode or agent.AgentMode.AGENT)

    prop()
    total = sum(tally.values())
    assert tally["ok"] >= total // 10 and tally["invalid_argument"] >= total // 10, tally
    assert tally["unimplemented"] >= 1, tally


_REGISTRY = build_registry()
_VALID_ARGS: dict[str, dict[str, Any]] = {
    "Read": {"path": "a.txt"},
    "Delete": {"path": "a.txt"},
    "ReadLints": {"paths": ["a.txt"]},
    "Grep": {"pattern": "x"},
    "Glob": {"glob_pattern": "*.py"},
    "Write": {"path": "a.txt", "contents": "x\r\ny"},
    "StrReplace": {"path": "a.txt", "old_string": "x", "new_string": "y"},
    "Shell": {"command": "ls"},
    "EditNotebook": {
        "target_notebook": "a.ipynb",
        "cell_idx": 0,
        "is_new_cell": True,
        "cell_language": "python",
        "old_string": "",
        "new_string": "x = 1",
    },
    "TodoWrite": {"todos": [{"id": "a", "content": "x", "status": "pending"}], "merge": False},
    "AwaitShell": {"shell_id": "3", "block_until_ms": 0},
    "GetMcpTools": {},
    "CallMcpTool": {"server": "s", "toolName": "t", "arguments": {}},
    "FetchMcpResource": {"server": "s", "uri": "notes://a"},
    "AskQuestion": {
        "questions": [
            {"id": "q", "prompt": "?", "options": [{"id": "a", "label": "A"}, {"id": "b", "label": "B"}]}
        ]
    },
    "CreatePlan": {"plan": "do it"},
    "SwitchMode": {"target_mode_id": "plan"},
    "WebFetch": {"url": "https://example.com/"},
    "WebSearch": {"search_term": "x"},
    "GenerateImage": {"description": "a cat"},
    "Task": {"description": "d", "prompt": "p"},
    "UpdateCurrentStep": {"current_step": "s"},
}


def test_every_registered_tool_is_fuzzed() -> None:
    assert set(_REGISTRY) == set(_VALID_ARGS)


_client_exec = st.one_of(
    protos(agent.ExecClientMessage, 3).map(lambda m: ("result", m)),
    protos(agent.ExecClientControlMessage, 2).map(lambda m: ("control", m)),
    protos(agent.InteractionResponse, 3).map(lambda m: ("answer", m)),
    any_json.map(lambda v: ("work", v)),
)


@fuzz(400)
@given(st.sampled_from(sorted(_REGISTRY)), st.lists(_client_exec, max_size=5))
def test_tool_executions_survive_any_client_exec_messages(name: str, messages: list[tuple[str, Any]]) -> None:
    """Any well-typed Exec answer (wrong variant, missing result, repeated, unknown id, throw,
    close), interaction answer or server-work result is absorbed by the run's ExecRouter and the
    tool's state machine; each call finishes at most once."""
    tool = _REGISTRY[name]
    sent: list[bytes] = []
    finished: list[tuple[str, object]] = []
    router = ExecRouter(
        sent.append,
        "req-1",
        lambda call_id, outcome: finished.append((call_id, outcome)),
        on_work=lambda call_id, work: None,
        on_note=lambda call_id, note: None,
    )
    env = ToolEnv(request_id="req-1", conversation_id="c", root_conversation_id="c", model_id="m")
    args = tool.parse(_VALID_ARGS[name])
    router.begin("call-1", "mc-1", tool.execute(Invocation("call-1", name, "mc-1", args, env)))
    for kind, msg in messages:
        if kind in ("result", "answer"):
            msg.id = msg.id % 4  # hit the live exec or query (id 1, 2 after a second phase) often
        try:
            if kind == "result":
                router.on_exec_message(msg)
            elif kind == "answer":
                router.on_interaction(msg)
            elif kind == "work":
                router.work_done("call-1", msg)
            else:
                router.on_control(msg)
        except Exception as e:
            if known_bug(e):
                return
            raise
    assert len(finished) <= 1


@fuzz(300)
@given(
    st.sampled_from(sorted(_REGISTRY)),
    any_json
    | st.dictionaries(
        st.sampled_from(
            [
                "path",
                "paths",
                "contents",
                "old_string",
                "new_string",
                "replace_all",
                "pattern",
                "glob_pattern",
                "command",
                "offset",
                "limit",
                "target_directory",
                "is_background",
                "timeout",
                "-i",
                "output_mode",
            ]
        ),
        any_json,
        max_size=5,
    ),
)
def test_tool_argument_validation_on_any_json(name: str, args: Any) -> None:
    tool = _REGISTRY[name]
    if not isinstance(args, dict):
        return  # the round answers "arguments must be a JSON object" itself
    try:
        parsed = tool.parse(args)
    except ToolArgError:
        return
    env = ToolEnv(request_id="req-1", conversation_id="c", root_conversation_id="c", model_id="m")
    execution = tool.execute(Invocation("call-1", name, "mc-1", parsed, env))
    assert execution.start()


def _set_frames(frames: list[bytes]) -> dict[int, bytes]:
    """kv id -> blob id of the SET frames KvLink sent."""
    out = {}
    for frame in frames:
        kv = agent.AgentServerMessage.parse(frame).kv_server_message
        assert kv is not None and kv.set_blob_args is not None
        out[kv.id] = kv.set_blob_args.blob_id
    return out


_kv_answers = st.one_of(
    protos(agent.KvClientMessage, 2),
    st.builds(
        lambda i: agent.KvClientMessage(id=i, set_blob_result=agent.SetBlobResult()), st.integers(0, 5)
    ),
    st.builds(
        lambda i, m: agent.KvClientMessage(
            id=i, set_blob_result=agent.SetBlobResult(error=agent.Error(message=m))
        ),
        st.integers(0, 5),
        st.sampled_from(["", "disk full"]),
    ),
)


@fuzz(300)
@given(
    st.lists(st.binary(max_size=3), min_size=1, max_size=4, unique=True),
    st.sets(st.integers(0, 3)),
    st.lists(_kv_answers, max_size=6),
)
def test_kv_link_absorbs_any_kv_answer(
    datas: list[bytes], held: set[int], answers: list[agent.KvClientMessage]
) -> None:
    """SETs offered, then any answers (right or wrong variant, errors, unknown and repeated ids):
    an answer is taken (True) only for a SET still waiting, once; the client holds (acked) only
    blobs whose SET it answered with success; unanswered SETs are the ones resent; an offer
    after that SETs again exactly the blobs that are neither held nor still waiting."""
    blobs = [Blob.of(d) for d in datas]
    preacked = {b.id for i, b in enumerate(blobs) if i in held}
    sent: list[bytes] = []
    kv = KvLink(sent.append, set(preacked))
    assert kv.offer(blobs) == len(sent)
    waiting = _set_frames(sent)
    assert sorted(waiting.values()) == sorted(b.id for b in blobs if b.id not in preacked)
    assert len(waiting) == len(sent)  # one kv id per SET
    acked = set(preacked)
    for msg in answers:
        msg.id = msg.id % (len(waiting) + 2)  # the SETs' ids, and some that name nothing
        expected = msg.id in waiting
        assert kv.on_client(kv_answer(msg)) is expected
        if expected:
            blob_id = waiting.pop(msg.id)
            result = msg.set_blob_result
            if result is not None and result.error is None:
                acked.add(blob_id)
        assert kv.acked == acked
    sent.clear()
    assert kv.resend_unacked() == len(waiting)
    assert _set_frames(sent) == waiting  # the same kv ids, the same blobs
    sent.clear()
    kv.offer(blobs)
    assert sorted(_set_frames(sent).values()) == sorted(
        b.id for b in blobs if b.id not in acked and b.id not in waiting.values()
    )


def test_exec_control_message_without_a_variant() -> None:
    router = ExecRouter(lambda _b: None, "req-1", lambda _c, _o: None)
    router.on_control(agent.ExecClientControlMessage())
