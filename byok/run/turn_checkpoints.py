"""The checkpoints a run publishes, built from its context (the head, the turn, the client's
memory) and the turn machine's steps. Each step is hashed once, and a turn that extends the last
one built only adds what is new (run/turn_effects.py asks for them)."""

from __future__ import annotations

from byok.cursor import encode
from byok.cursor.checkpoint import (
    Blob,
    Checkpoint,
    TurnRecord,
    assistant_step,
    build_checkpoint,
    thinking_step,
)
from byok.cursor.plan_state import current_plan
from byok.cursor.tools.base import ToolOutcome
from byok.cursor.tools.subagent_tools import parent_progress
from byok.loop.compaction import summary_count, summary_text
from byok.loop.turn_values import AnswerStep, FinalCheckpoints, Step, ThinkingStep
from byok.model.messages import Message
from byok.run.context import RunContext


class TurnCheckpoints:
    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx
        self._step_blobs: dict[int, tuple[Step, Blob]] = {}  # id(step) -> (step, its blob)
        self._turn: tuple[tuple[Step, ...], TurnRecord] | None = None  # the last turn built

    def final(self, final: FinalCheckpoints) -> tuple[Checkpoint, Checkpoint]:
        messages = self.ctx.head.messages
        if final.answer is not None:
            messages = (*messages, final.answer)
        staged = self.checkpoint(messages[:-1], [messages[-1]], final.steps)
        return staged, self.checkpoint(messages, [], final.steps)

    def checkpoint(
        self,
        stable: tuple[Message, ...],
        pending: list[Message],
        steps: tuple[Step, ...],
        shell: tuple[Blob, ...] = (),
    ) -> Checkpoint:
        c = self.ctx
        first = stable[0] if stable else None
        todos = c.memory.todos
        return build_checkpoint(
            system_prompt=c.assets.system,
            stable=stable,
            pending=pending,
            prior_turns=c.prior_turns,
            turn=None if shell else self.turn_of(steps),
            token_details=c.details,
            mode=c.agent_mode,
            root_of=c.memory.root_of,
            roots=c.memory.root_list,
            summary=summary_text(first) if first is not None and first.origin == "summary" else None,
            summaries=summary_count(stable),
            todos=todos.blobs(todos.todos(stable)),
            shell_turn=shell,
            plan=current_plan(stable),
            # A subagent's progress for its parent's Task card (seeds 000 §33.2).
            progress=parent_progress(c.start.parent[1], (*stable, *pending)),
        )

    def turn_of(self, steps: tuple[Step, ...]) -> TurnRecord:
        """The turn the run started from with this run's ``steps`` (each step hashed once; a
        turn that extends the last one built only adds what is new)."""
        built, turn = self._turn or ((), self.ctx.turn)
        if len(steps) < len(built) or any(a is not b for a, b in zip(built, steps, strict=False)):
            built, turn = (), self.ctx.turn
        turn = turn.with_steps([self.step_blob(s) for s in steps[len(built) :]])
        self._turn = (steps, turn)
        return turn

    def step_blob(self, step: Step) -> Blob:
        held = self._step_blobs.get(id(step))
        if held is not None and held[0] is step:
            return held[1]
        if isinstance(step, ThinkingStep):
            data = thinking_step(step.text, step.duration_ms)
        elif isinstance(step, AnswerStep):
            data = assistant_step(step.text)
        else:
            assert isinstance(step.result, ToolOutcome)
            data = encode.tool_step(step.result.ui_bytes())
        blob = Blob.of(data)
        self._step_blobs[id(step)] = (step, blob)
        return blob
