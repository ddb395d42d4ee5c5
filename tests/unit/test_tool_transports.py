"""The router's three transports: Exec ids, interaction ids (a separate counter), server work and
turn notes, each routed by id and each finished call's late answers ignored."""

from __future__ import annotations

from typing import Any

from byok.cursor.exec_router import ExecRouter
from byok.cursor.tools.base import Finish, Note, Phased, SendExec, SendQuery, StartWork, ToolOutcome
from byok.pb.agent import v1 as agent


def outcome(text: str) -> ToolOutcome:
    return ToolOutcome(content=text, is_error=False, ui=agent.ToolCall())


class Asks(Phased):
    """A query, then (on approval) an Exec or server work; a note on the way."""

    def __init__(self, then: str) -> None:
        self.then = then

    def start(self) -> list:
        return [SendQuery(agent.InteractionQuery(switch_mode_request_query=agent.SwitchModeRequestQuery()))]

    def fail(self, message: str) -> list:
        return self.finish(ToolOutcome(content=message, is_error=True, ui=agent.ToolCall()))

    def on_answer(self, response: agent.InteractionResponse) -> list:
        if self.then == "exec":
            return [SendExec(agent.ExecServerMessage(fetch_args=agent.FetchArgs(url="http://x")))]
        if self.then == "work":
            return [StartWork("search: x")]
        return [Note("switched"), *self.finish(outcome("answered"))]

    def on_result(self, msg: agent.ExecClientMessage) -> list:
        return self.finish(outcome("fetched"))

    def on_work(self, result: Any) -> list:
        return self.finish(outcome(f"worked: {result}"))


def make() -> tuple[ExecRouter, list[bytes], list[tuple[str, Any]], tuple[list[Any], list[Any]]]:
    sent: list[bytes] = []
    done: list[tuple[str, Any]] = []
    work: list[Any] = []
    notes: list[Any] = []
    router = ExecRouter(
        sent.append,
        "req",
        lambda cid, o: done.append((cid, o.content)),
        on_work=lambda cid, w: work.append((cid, w)),
        on_note=lambda cid, n: notes.append((cid, n)),
    )
    return router, sent, done, (work, notes)


def sent_message(frame: bytes) -> agent.AgentServerMessage:
    return agent.AgentServerMessage().parse(frame)


def answer(query_id: int) -> agent.InteractionResponse:
    response = agent.SwitchModeRequestResponse()
    return agent.InteractionResponse(id=query_id, switch_mode_request_response=response)


def test_queries_have_their_own_counter_and_answers_route_by_id() -> None:
    router, sent, done, (_work, notes) = make()
    router.begin("c1", "m1", Asks("exec"))
    router.begin("c2", "m1", Asks("note"))
    q1, q2 = (sent_message(f).interaction_query for f in sent)
    assert (q1.id, q2.id) == (1, 2)
    router.on_interaction(answer(2))
    assert done == [("c2", "answered")] and notes == [("c2", "switched")]
    router.on_interaction(answer(2))  # repeated: ignored
    router.on_interaction(answer(9))  # unknown: ignored
    assert len(done) == 1
    # The approval moves c1 on to an Exec, whose id comes from the Exec counter.
    router.on_interaction(answer(1))
    exec_msg = sent_message(sent[-1]).exec_server_message
    assert (exec_msg.id, exec_msg.exec_id) == (1, "c1")
    router.on_exec_message(agent.ExecClientMessage(id=1, fetch_result=agent.FetchResult()))
    assert done[-1] == ("c1", "fetched")
    assert router.running == 0


def test_server_work_comes_back_to_its_call_once() -> None:
    router, _sent, done, (work, _notes) = make()
    router.begin("c1", "m1", Asks("work"))
    router.on_interaction(answer(1))
    assert work == [("c1", "search: x")] and router.running == 1
    router.work_done("c1", "results")
    router.work_done("c1", "again")  # finished: ignored
    assert done == [("c1", "worked: results")]


def test_abort_drops_open_queries_and_work() -> None:
    router, _sent, done, (_work, _notes) = make()
    router.begin("c1", "m1", Asks("work"))
    router.begin("c2", "m1", Asks("note"))
    router.on_interaction(answer(1))
    router.abort_all()
    assert router.running == 0
    router.on_interaction(answer(2))
    router.work_done("c1", "late")
    assert done == []


def test_an_unexpected_answer_fails_the_call_with_a_protocol_error() -> None:
    router, _sent, done, _ = make()

    class OnlyExec(Phased):
        def start(self) -> list:
            return [SendQuery(agent.InteractionQuery())]

        def fail(self, message: str) -> list:
            return self.finish(ToolOutcome(content=message, is_error=True, ui=agent.ToolCall()))

    router.begin("c1", "m1", OnlyExec())
    router.on_interaction(answer(1))
    assert done == [("c1", "protocol error: unexpected interaction response")]
    # Once finished, nothing more is said.
    execution = OnlyExec()
    assert isinstance(execution.on_answer(answer(1))[0], Finish)
    assert execution.on_answer(answer(1)) == [] and execution.on_stream_close() == []
