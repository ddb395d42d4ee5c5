"""Bench 5: a 5,000-message conversation: building the next request, checkpoints, memory kept
per conversation, and two turns on the daemon after a restart."""

from __future__ import annotations

import gc
import shutil
import statistics
import time
import tracemalloc
from pathlib import Path

import trio

from byok.cursor.checkpoint import Checkpoint, RootList, TurnRecord, build_checkpoint, root_blob, system_root
from byok.cursor.prompting import default_prompt_root, load_prompt_assets
from byok.cursor.tools.catalog import load_tool_catalog, mode_tools
from byok.model.messages import Message
from byok.model.projection import final_prefix, project, start_from
from byok.model.request import ModelRequest, ModelSettings, RenderedPrefix
from byok.pb.agent import v1 as agent
from byok.providers import rendering
from byok.providers.adapters import adapter_for
from byok.providers.render_cache import owned_by
from byok.run import call_meter
from byok.run.call_log import CallLog
from byok.run.call_meter import finalize_and_hash
from byok.run.conversation import ConversationMemory, Supervisors
from byok.run.conversation_caches import ConversationCaches, own_cap
from byok.run.stored_render import StoredRenders, render_key
from byok.store import AsyncStore, LlmCallRecord, SQLiteStore
from byok.store.history_cache import DEFAULT_CACHE_BYTES
from byok.store.rendered_prefixes import messages_digest
from tests.bench.common import loadavg, measured_turn, note
from tests.bench.driver import PREFIX, child_daemon, direct_first_content, harness_gc_off, ms, report
from tests.bench.long_history import LONG_CONV, N_BLOCKS, block
from tests.support.fake_provider import chat_text_script

SMALL_BUDGET = 2**20  # the least allowed: smaller than the conversation's caches (~16 MiB)
LARGE_BUDGET = 256 * 2**20  # the default
WINDOW_CONV = "window-conv"
WINDOW_BYTES = 800_000  # a 200K-token context window's request, at ~4 bytes a token


def timed(fn, reps: int = 5) -> tuple[float, object]:  # type: ignore[no-untyped-def]
    times, result = [], None
    for _ in range(reps):
        t = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), result


async def budget_heap(data_dir: Path, max_bytes: int, template: ModelRequest) -> tuple[int, int, int]:
    """(Python heap kept, bytes the budget charged it, conversations evicted) once a turn on
    ``LONG_CONV`` ended under a cache budget of ``max_bytes``: the daemon's own parts (store,
    call log, supervisors, renders, ConversationCaches) fill the caches as a run does (head,
    render, call record, the client's roots acked), then the run's end charges it and evicts
    past the budget."""
    rendering.forget_rendered()
    call_meter.forget_element_digests()
    store = await AsyncStore.open(data_dir, cache_bytes=own_cap(max_bytes))
    call_log, supervisors, renders = CallLog(store), Supervisors(), StoredRenders()
    caches = ConversationCaches(
        max_bytes, store=store, call_log=call_log, renders=renders, supervisors=supervisors
    )
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    caches.run_started(LONG_CONV)
    memory = supervisors.get(LONG_CONV).memory
    messages = (await store.head(LONG_CONV)).messages
    request = await renders.request(store, LONG_CONV, messages, "openai_chat", template)
    with owned_by(LONG_CONV):
        rendered = adapter_for("openai_chat").render(request)
    call_log.submit(
        LlmCallRecord("r", LONG_CONV, "p", "", rendered.source, "", "", "ok", 0, rendered=rendered)
    )
    await call_log.flush()
    memory.acked.update(memory.root_of(m).id for m in messages)
    memory.drop_acked_roots()
    memory.saved(list(memory.unsaved.items()))  # as the run's terminal write does
    del messages, request, rendered, memory  # what the run held goes with it
    caches.charge(LONG_CONV)
    charged = caches.budget.size_of(LONG_CONV)
    await caches.run_ended(LONG_CONV)
    gc.collect()
    kept = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    caches.close()
    await store.aclose()
    return kept, charged, caches.evicted


async def test_5_long_conversation(tmp_path: Path, nursery: trio.Nursery) -> None:
    print(f"\n[5] long conversation: {N_BLOCKS * 10} messages (load {loadavg()})")
    root = tmp_path / "long"
    data_dir = root / "data"
    with SQLiteStore.open_in(data_dir) as store:
        version = 0
        t = time.perf_counter()
        for start in range(0, N_BLOCKS, 10):  # rounds of 100 messages
            msgs = [m for b in range(start, start + 10) for m in block(b)]
            version = store.append(LONG_CONV, version, msgs, 1_700_000_000_000).version
        fill_s = time.perf_counter() - t
    with SQLiteStore.open_in(data_dir) as store:
        count = len(store.head(LONG_CONV).messages)
    assert count == N_BLOCKS * 10
    print(f"  wrote {count} messages in {fill_s:.2f} s")

    # The pure part of the next turn, as runner._call_model does it: head, projection, request bytes.
    prompt_root = default_prompt_root()
    system = load_prompt_assets(prompt_root)["agent"].system
    tools = mode_tools(prompt_root, "agent", load_tool_catalog(prompt_root))
    adapter = adapter_for("openai_chat")

    def cold_head() -> tuple[Message, ...]:
        with SQLiteStore.open_in(data_dir) as s:
            return s.head(LONG_CONV).messages

    cold_s, messages = timed(cold_head)
    warm_store = SQLiteStore.open_in(data_dir)
    warm_store.head(LONG_CONV)
    warm_s, _ = timed(lambda: warm_store.head(LONG_CONV))
    warm_store.close()
    project_s, history = timed(lambda: project(messages))  # type: ignore[arg-type]

    def project_cold() -> float:
        fresh = cold_head()  # messages never projected: no memo to resume from
        t = time.perf_counter()
        project(fresh)
        return time.perf_counter() - t

    project_cold_s = statistics.median(project_cold() for _ in range(5))
    settings = ModelSettings(upstream_model="gpt-test")
    request = ModelRequest(system=system, tools=tools, history=history, settings=settings)  # type: ignore[arg-type]
    # As the daemon builds it: the render, its body spliced from the cached texts (model/body.py).
    build_s, _ = timed(lambda: adapter.render(request))
    joined_s, body = timed(lambda: adapter.build_request(request))  # the same, joined into bytes
    assert isinstance(body, bytes)

    def build_cold() -> object:
        rendering.forget_rendered()
        return adapter.render(request)

    build_cold_s, _ = timed(build_cold)
    with harness_gc_off():
        build_nogc_s, _ = timed(lambda: adapter.render(request))
        cold_nogc_s, _ = timed(cold_head)

    # The call record (model name, redaction check, request/messages hashes, the prefix meter's
    # per-element hashes) is derived from the render's elements on the call log's own thread;
    # a body without its render (a stored one, after a restart) is walked instead.
    rendered = adapter.render(request)
    record = LlmCallRecord("r", LONG_CONV, "p", "", rendered.source, "", "", "ok", 0, rendered=rendered)
    post_s, _ = timed(lambda: finalize_and_hash(record), reps=3)

    def post_cold() -> object:
        call_meter.forget_element_digests()
        return finalize_and_hash(record)

    post_cold_s, _ = timed(post_cold, reps=3)
    bare = LlmCallRecord("r", LONG_CONV, "p", "", body, "", "", "ok", 0)
    post_walk_s, _ = timed(lambda: finalize_and_hash(bare), reps=3)
    report(
        "5 long conv",
        "build provider request, next turn (warm head + project + render)",
        ms(warm_s + project_s + build_s),
        "ms",
        20,
        note=f"{len(body) / 1e6:.1f} MB body",
    )
    # After a restart the daemon starts from the render it stored at shutdown (run/stored_render.py),
    # as of the history's last answer; the next turn adds its runtime message.
    count, final_items = final_prefix(messages)  # type: ignore[arg-type]
    assert count == len(messages)  # type: ignore[arg-type]
    key, texts = adapter.prefix_texts(
        ModelRequest(system=system, tools=tools, history=final_items, settings=settings)
    )
    stored_key = render_key(key)
    with SQLiteStore.open_in(data_dir) as s:
        s.save_rendered_prefix(
            LONG_CONV,
            stored_key,
            count,
            messages_digest(m.id for m in messages[:count]),
            texts,  # type: ignore[index]
        )
    del final_items, texts

    def from_stored() -> float:
        rendering.forget_rendered()
        next_message = Message(role="user", origin="runtime", text="<user_query>and now?</user_query>")
        t = time.perf_counter()
        with SQLiteStore.open_in(data_dir) as s:
            head = (*s.head(LONG_CONV).messages, next_message)
            stored = s.rendered_prefix(LONG_CONV, stored_key)
        assert stored is not None
        covered = head[: stored.message_count]
        assert messages_digest(m.id for m in covered) == stored.messages_sha256
        start_from(head, RenderedPrefix(key, stored.texts, covered, sum(map(len, stored.texts))))
        adapter.render(ModelRequest(system=system, tools=tools, history=project(head), settings=settings))
        return time.perf_counter() - t

    stored_s = statistics.median(from_stored() for _ in range(5))
    report(
        "5 long conv",
        "build provider request after a restart, from its stored render (cold head + render + new message)",
        ms(stored_s),
        "ms",
        20,
    )
    report(
        "5 long conv",
        "  the same without a stored render (cold head + cold project + cold build; after a kill -9)",
        ms(cold_s + project_cold_s + build_cold_s),
        "ms",
    )
    # The same at the size a 200K-token context window holds (~4 bytes a token): 5,000 such
    # messages are 1.4M tokens, more than any model takes.
    window_blocks = max(1, N_BLOCKS * WINDOW_BYTES // len(body))
    with SQLiteStore.open_in(data_dir) as s:
        s.append(WINDOW_CONV, 0, [m for b in range(window_blocks) for m in block(b)], 1_700_000_000_000)

    def window_cold() -> float:
        t = time.perf_counter()
        with SQLiteStore.open_in(data_dir) as s:
            head = s.head(WINDOW_CONV).messages
        rendering.forget_rendered()
        history = project(head)
        adapter.render(ModelRequest(system=system, tools=tools, history=history, settings=settings))
        return time.perf_counter() - t

    window_s = statistics.median(window_cold() for _ in range(5))
    report(
        "5 long conv",
        f"  the same at a full 200K-token window ({window_blocks * 10:,} messages)",
        ms(window_s),
        "ms",
        20,
        note=f"{window_blocks * len(body) / N_BLOCKS / 1e6:.2f} MB body",
    )
    report("5 long conv", f"  store.head, cold (SQL + decode {count:,} messages)", ms(cold_s), "ms")
    report("5 long conv", "  store.head, warm (revision cache hit)", ms(warm_s), "ms")
    report(
        "5 long conv",
        "  project(), warm / a history never projected",
        ms(project_s),
        "ms",
        note=f"cold {ms(project_cold_s):.1f} ms",
    )
    report(
        "5 long conv",
        "  openai_chat render()",
        ms(build_s),
        "ms",
        note=f"joined into one buffer: {ms(joined_s):.2f} ms",
    )
    report("5 long conv", "  openai_chat render(), fragment cache empty", ms(build_cold_s), "ms")
    report(
        "5 long conv",
        "  the same two with cyclic GC off (head cold / render)",
        ms(cold_nogc_s),
        "ms",
        note=f"render {ms(build_nogc_s):.1f} ms",
    )
    report(
        "5 long conv",
        "  call record + prefix-meter hashes, call-log thread (finalize_and_hash), warm / cold digests",
        ms(post_s),
        "ms",
        note=f"{ms(post_cold_s):.1f} ms cold; a stored body without its render: {ms(post_walk_s):.1f} ms",
    )

    # Checkpoint cost per publish with warm root ids, as Run._checkpoint does (ConversationMemory).
    memory = ConversationMemory()

    def checkpoint(stable: tuple[Message, ...], roots: RootList | None = None) -> Checkpoint:
        return build_checkpoint(
            system_prompt=system,
            stable=stable,
            turn=TurnRecord("r", b"\x0a\x02hi"),
            token_details=agent.ConversationTokenDetails(),
            mode=agent.AgentMode.AGENT,
            root_of=memory.root_of,
            roots=roots,
        )

    memory.acked.update(b.id for b in checkpoint(messages).blobs)  # type: ignore[arg-type]
    memory.drop_acked_roots()
    checkpoint_s, _ = timed(lambda: checkpoint(messages))  # type: ignore[arg-type]
    ids_s, _ = timed(lambda: [m.id for m in messages])  # type: ignore[attr-defined]

    def next_publish() -> float:
        # A publish after the previous one was ACKed: the history has grown by a round's two.
        roots = RootList()
        checkpoint(messages[:-2], roots)  # type: ignore[index]
        t = time.perf_counter()
        checkpoint(messages, roots)  # type: ignore[arg-type]
        return time.perf_counter() - t

    next_s = statistics.median(next_publish() for _ in range(5))
    report(
        "5 long conv",
        "  build_checkpoint, the conversation's first publish in this process (warm root ids)",
        ms(checkpoint_s),
        "ms",
    )
    report("5 long conv", "    of which Message.id for every message (the cache key)", ms(ids_s), "ms")
    report(
        "5 long conv",
        "  build_checkpoint, each later publish (2 per round, 3 per turn end; 2 new messages)",
        ms(next_s),
        "ms",
    )

    # What the daemon keeps per idle conversation. Its own: root ids and acked ids
    # (ConversationMemory, root blob bytes dropped once ACKed), the prefix meter's hashes (CallLog).
    # In caches shared by all conversations and bounded by bytes: the decoded history (store,
    # DEFAULT_CACHE_BYTES) and the request fragments (rendering.FRAGMENTS); an idle conversation
    # holds those only until newer ones push it out, then its next turn decodes from SQLite.
    def idle_heap(
        store: SQLiteStore, conversation_id: str, meter_record: LlmCallRecord
    ) -> tuple[int, int, int, object]:
        """(own, cached, decoded) bytes of heap an idle ``conversation_id`` keeps, and what holds
        its own part (the caller releases it). tracemalloc is on and the store's and the render's
        caches are empty; ``meter_record``: its last call, its element digests already made."""
        start = tracemalloc.get_traced_memory()[0]
        held = store.head(conversation_id).messages
        decoded = tracemalloc.get_traced_memory()[0] - start
        history = project(held)
        held_render = adapter.render(
            ModelRequest(system=system, tools=tools, history=history, settings=settings)
        )
        del held_render, history
        cached = tracemalloc.get_traced_memory()[0] - start
        held_memory = ConversationMemory()
        for m in held:
            held_memory.acked.add(held_memory.root_of(m).id)
        held_memory.drop_acked_roots()
        held_memory.saved(list(held_memory.unsaved.items()))  # as the run's terminal write does
        held_hashes = finalize_and_hash(meter_record)[1]
        own = tracemalloc.get_traced_memory()[0] - start - cached
        return own, cached, decoded, (held_memory, held_hashes)

    with SQLiteStore.open_in(data_dir) as s:
        window_history = project(s.head(WINDOW_CONV).messages)
    window_render = adapter.render(
        ModelRequest(system=system, tools=tools, history=window_history, settings=settings)
    )
    window_record = LlmCallRecord(
        "r", WINDOW_CONV, "p", "", window_render.source, "", "", "ok", 0, rendered=window_render
    )
    finalize_and_hash(window_record)  # its digests made, as the 5,000 messages' above
    del window_history, window_render
    rendering.forget_rendered()
    tracemalloc.start()
    model_store = SQLiteStore.open_in(data_dir)
    own_heap, cached_heap, decoded, held_own = idle_heap(model_store, LONG_CONV, record)
    # The idle conversation's history goes before the active run's is measured: freed during
    # the measurement, it would count against it.
    model_store.forget_cached()
    rendering.forget_rendered()
    del held_own
    window_own, window_cached, window_decoded, held_own = idle_heap(model_store, WINDOW_CONV, window_record)
    model_store.forget_cached()
    rendering.forget_rendered()
    del held_own
    base = tracemalloc.get_traced_memory()[0]
    held = model_store.head(LONG_CONV).messages
    held_history = project(held)
    held_body = adapter.render(  # the run holds the render, its body spliced
        ModelRequest(system=system, tools=tools, history=held_history, settings=settings)
    )
    active_heap = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    model_store.close()
    del held_history, held_body
    report(
        "5 long conv",
        "Python heap kept per idle conversation, evicted from the shared caches (tracemalloc)",
        own_heap / 2**20,
        "MiB",
        5,
        note="root ids, acked ids, meter hashes",
    )
    report(
        "5 long conv",
        "Python heap kept per idle conversation while still in the shared caches",
        (own_heap + cached_heap) / 2**20,
        "MiB",
        5,
        note=f"+ decoded history {decoded / 2**20:.1f} MiB, request fragments "
        f"{(cached_heap - decoded) / 2**20:.1f} MiB (caches bounded across conversations: "
        f"{DEFAULT_CACHE_BYTES / 2**20:.0f} + {rendering.FRAGMENTS.max_bytes / 2**20:.0f} MiB)",
    )
    report(
        "5 long conv",
        f"  the same at a full 200K-token window ({window_blocks * 10:,} messages)",
        (window_own + window_cached) / 2**20,
        "MiB",
        5,
        note=f"own {window_own / 2**20:.2f} MiB, decoded history {window_decoded / 2**20:.1f} MiB, "
        f"request fragments {(window_cached - window_decoded) / 2**20:.1f} MiB",
    )
    report(
        "5 long conv",
        "Python heap of an active run, cold (decoded history + projection + request body)",
        active_heap / 2**20,
        "MiB",
        20,
    )
    template = ModelRequest(system=system, tools=tools, history=(), settings=settings)
    for label, budget in (("small", SMALL_BUDGET), ("large", LARGE_BUDGET)):
        copy = root / f"budget-{label}"  # the eviction stores a render: not into the daemon's data
        shutil.copytree(data_dir, copy)
        kept, charged, evicted = await budget_heap(copy, budget, template)
        report(
            "5 long conv",
            f"Python heap kept per idle conversation, cache budget {budget / 2**20:g} MiB ({label})",
            kept / 2**20,
            "MiB",
            note=f"charged {charged / 2**20:.1f} MiB: "
            + ("evicted at its run's end" if evicted else "kept hot for its next turn"),
        )

    published = [(m.id, root_blob(m).id) for m in messages if m.role != "system"]  # type: ignore[attr-defined]
    held_state = agent.ConversationStateStructure(
        root_prompt_messages_json=[system_root(system).id, *(root_id for _, root_id in published)],
        mode=agent.AgentMode.AGENT,
    )
    # The runs that wrote this history published these roots, and saved their ids as they ended;
    # the call log stored the request of its last answer. The first call after the restart is
    # then stored as a tail of that one, as in a conversation that really ran.
    last_call = adapter.build_request(
        ModelRequest(system=system, tools=tools, history=project(messages[:-1]), settings=settings)  # type: ignore[index]
    )
    with SQLiteStore.open_in(data_dir) as store:
        store.start_run("long-history", LONG_CONV, "byok-demo", 1_700_000_000_000)
        store.finish_run("long-history", "success", 1_700_000_000_001, root_ids=published)
        # Finalized as the call log does: with its compared prefix (schema 6).
        last_record = LlmCallRecord("long-history", LONG_CONV, "fake", "gpt-test", last_call, "", "", "ok", 0)
        store.record_llm_calls([call_meter.finalize_with_layout(last_record).record])
    del last_call
    rendering.forget_rendered()  # the harness keeps no render caches (thousands of GC-tracked keys)

    # End to end on the daemon: turn 1 after a restart (cold), turn 2 warm; RSS sampled throughout.
    samples: list[tuple[str, int]] = []
    phase = "before"
    async with child_daemon(root, nursery) as b:

        async def sample() -> None:
            while True:
                samples.append((phase, b.daemon_rss()))
                await trio.sleep(0.02)

        gc.collect()
        with SQLiteStore.open_in(b.data_dir) as db, harness_gc_off():  # as in bench 1
            await measured_turn(b, db, "long-warm", "long-warm-conv")
            await trio.sleep(0.5)
            async with trio.open_nursery() as n:
                n.start_soon(sample)
                await trio.sleep(0.1)
                phase = "turn 1"
                # Cursor sends the checkpoint it holds: every root of the stored history. (Without
                # it byok must SET all 5,000 roots again, one client ACK each: seconds.)
                cold = await measured_turn(b, db, "long-1", LONG_CONV, held_state)
                phase = "turn 2"
                warm = await measured_turn(b, db, "long-2", LONG_CONV, cold.checkpoint)
                phase = "after"
                # Idle for 2 s: past the daemon's upkeep between runs (1 s after the last one).
                await trio.sleep(2.0)
                n.cancel_scope.cancel()
            # One direct sample of a 5.7 MB request swings by 100 ms with the harness's own GC and
            # JSON parse of it: take the median of a few.
            directs = {}
            for label, sample_ in (("cold", cold), ("warm", warm)):
                body = b.provider.requests[sample_.provider_index].body
                times = []
                for _ in range(5):
                    b.provider.enqueue(chat_text_script(["Hello", " world"]))
                    times.append(await direct_first_content(b.client, b.provider_url, body))
                directs[label] = statistics.median(times)
        PREFIX.add(
            "5 long-conv", [b.provider.requests[i].body for i in (cold.provider_index, warm.provider_index)]
        )
    PREFIX.add_store(data_dir, [LONG_CONV])
    with SQLiteStore.open_in(data_dir) as db:
        assert db._conn is not None
        stored = db._conn.execute(
            "SELECT length(request_body), body_base_id FROM llm_calls WHERE conversation_id = ? ORDER BY id",
            (LONG_CONV,),
        ).fetchall()
        whole = [len(c.request_body or b"") for r in ("long-1", "long-2") for c in db.llm_calls(r)]
    report(
        "5 long conv",
        "bytes stored per provider call record, next turn (llm_calls.request_body)",
        stored[-1][0] / 1e3,
        "KB",
        note=f"of a {whole[-1] / 1e6:.1f} MB body; the first call after the restart, a tail of the "
        f"history's last stored call, {stored[1][0] / 1e3:.1f} KB",
    )
    rss = {p: [v for q, v in samples if q == p] for p in ("before", "turn 1", "turn 2", "after")}
    rss0 = statistics.median(rss["before"])
    report(
        "5 long conv",
        "added TTFT, first turn after a restart (cold)",
        ms(cold.via - directs["cold"]),
        "ms",
        note=f"via {ms(cold.via):.0f} ms (run_request -> provider request {ms(cold.precall):.0f} ms), "
        f"direct median of 5 {ms(directs['cold']):.0f} ms",
    )
    report(
        "5 long conv",
        "added TTFT, next turn (warm)",
        ms(warm.via - directs["warm"]),
        "ms",
        note=f"via {ms(warm.via):.0f} ms (run_request -> provider request {ms(warm.precall):.0f} ms), "
        f"direct median of 5 {ms(directs['warm']):.0f} ms",
    )
    report(
        "5 long conv",
        "  run_request -> turn_ended at the client, first turn after a restart",
        ms(cold.ended),
        "ms",
        note=f"next turn (warm) {ms(warm.ended):.0f} ms; both include the provider streaming its answer",
    )
    report(
        "5 long conv",
        f"RSS growth, idle 2 s after 2 turns on the {count:,}-message conversation (upper bound)",
        (statistics.median(rss["after"][-20:]) - rss0) / 2**20,  # its last 0.4 s
        "MiB",
        5,
    )
    report(
        "5 long conv",
        "RSS peak during the two turns - before",
        (max(rss["turn 1"] + rss["turn 2"]) - rss0) / 2**20,
        "MiB",
        20,
        note=f"turn 1 (cold) {(max(rss['turn 1']) - rss0) / 2**20:.1f}, "
        f"turn 2 (warm) {(max(rss['turn 2']) - rss0) / 2**20:.1f} MiB",
    )
    note(
        f"5: {count:,} messages written by SQLiteStore.append, 100 per round ({N_BLOCKS} exchanges: user, "
        "4 Reads, 2 Greps, answer; ~1.5 KB per tool result). The pure timings are medians of 5 in "
        "this process. The heap rows build, under tracemalloc, the objects the daemon keeps (store "
        "revision cache, ConversationMemory roots/acked, CallLog hashes) or adds for a run. RSS as in 3 "
        "(daemon VmRSS, sampled every 20 ms), relative to after a warm-up turn on another conversation."
    )
