from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from byok.cursor.agent_modes import UnknownModeError, mode_name, mode_value, run_mode
from byok.cursor.prompting import (
    REQUIRED_MODES,
    ModeAssets,
    PromptAssetError,
    build_runtime_message,
    default_prompt_root,
    load_prompt_assets,
    render_runtime_message,
    request_context_sections,
)
from byok.pb.agent import v1 as agent

NOW = "2025-06-01T10:00:00Z"
TEMPLATE = load_prompt_assets(default_prompt_root())["agent"].runtime_template


def full_context() -> agent.RequestContext:
    return agent.RequestContext(
        env=agent.RequestContextEnv(
            os_version="darwin 24.1.0", shell="zsh", workspace_paths=["/w/proj"], time_zone="Europe/Berlin"
        ),
        git_repos=[agent.GitRepoInfo(path="/w/proj", status=" M a.py\n", branch_name="main")],
        rules=[agent.CursorRule(full_path="/w/proj/.cursor/rules/style.mdc", content="Use tabs.")],
        non_file_rules=[agent.CursorRule(full_path="team", content="Be kind.")],
        agent_skills=[agent.AgentSkill(full_path="/skills/pdf/SKILL.md", description="Make PDFs")],
        custom_subagents=[agent.CustomSubagent(name="reviewer", description="Reviews diffs")],
        mcp_instructions=[agent.McpInstructions(server_name="gh", instructions="Use for GitHub.")],
        project_layouts=[
            agent.LsDirectoryTreeNode(
                abs_path="/w/proj",
                children_were_processed=True,
                children_files=[agent.LsDirectoryTreeNodeFile(name="README.md")],
            )
        ],
        file_contents={"/w/proj/b.py": "print(2)\n", "/w/proj/a.py": "print(1)\n"},
    )


def user(text: str = "do it", selected: agent.SelectedContext | None = None) -> agent.UserMessage:
    return agent.UserMessage(text=text, selected_context=selected)


def render(
    text: str = "do it",
    rc: agent.RequestContext | None = None,
    selected: agent.SelectedContext | None = None,
    template: str = TEMPLATE,
    time_zone: str | None = None,
) -> str:
    return render_runtime_message(
        template, user_message=user(text, selected), request_context=rc, now_iso=NOW, time_zone=time_zone
    )


# --- assets -----------------------------------------------------------------------------------


def test_real_assets_load() -> None:
    assets = load_prompt_assets(default_prompt_root())
    assert set(REQUIRED_MODES) <= set(assets)
    for mode, a in assets.items():
        assert isinstance(a, ModeAssets) and a.mode == mode
        assert a.system.strip() and len(a.system.splitlines()) <= 80
        assert "{{TIMESTAMP}}" in a.runtime_template and "{{USER_QUERY}}" in a.runtime_template
    for mode in ("ask", "plan", "debug", "multitask"):
        assert f"{mode.capitalize()} mode" in assets[mode].runtime_template
    # Every mode has its own prompt (no mode borrows another's text).
    systems = [a.system for a in assets.values()]
    assert len(set(systems)) == len(systems)


@pytest.fixture
def assets_copy(tmp_path: Path) -> Path:
    shutil.copytree(default_prompt_root(), tmp_path / "prompt")
    return tmp_path / "prompt"


@pytest.mark.parametrize("name", ["system.md", "runtime.md"])
def test_missing_file(assets_copy: Path, name: str) -> None:
    (assets_copy / "modes" / "plan" / name).unlink()
    with pytest.raises(PromptAssetError, match=f"plan/{name}: required prompt file is missing"):
        load_prompt_assets(assets_copy)


@pytest.mark.parametrize("mode", REQUIRED_MODES)
def test_every_required_mode_must_be_there(assets_copy: Path, mode: str) -> None:
    shutil.rmtree(assets_copy / "modes" / mode)
    with pytest.raises(PromptAssetError, match=f"{mode}: required mode directory is missing"):
        load_prompt_assets(assets_copy)


def test_missing_mode_and_root(assets_copy: Path, tmp_path: Path) -> None:
    shutil.rmtree(assets_copy / "modes" / "debug")
    with pytest.raises(PromptAssetError, match="debug: required mode directory is missing"):
        load_prompt_assets(assets_copy)
    with pytest.raises(PromptAssetError, match="modes directory not found"):
        load_prompt_assets(tmp_path / "nowhere")


def test_empty_file(assets_copy: Path) -> None:
    (assets_copy / "modes" / "ask" / "system.md").write_text("\n  \n")
    with pytest.raises(PromptAssetError, match=r"ask/system\.md: prompt file is empty"):
        load_prompt_assets(assets_copy)


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("{{USER_QUERY}}", r"lacks required placeholder \{\{TIMESTAMP\}\}"),
        ("{{TIMESTAMP}}", r"lacks required placeholder \{\{USER_QUERY\}\}"),
        ("{{TIMESTAMP}} {{USER_QUERRY}} {{USER_QUERY}}", r"unknown placeholder \{\{USER_QUERRY\}\}"),
        ("{{TIMESTAMP}} {{ USER_QUERY }}", r"unknown placeholder \{\{ USER_QUERY \}\}"),
        ("{{TIMESTAMP}} {{USER_QUERY}} {{USER_QUERY}}", r"\{\{USER_QUERY\}\} appears more than once"),
    ],
)
def test_bad_template(assets_copy: Path, template: str, message: str) -> None:
    (assets_copy / "modes" / "agent" / "runtime.md").write_text(template)
    with pytest.raises(PromptAssetError, match=f"agent/runtime.md: .*{message}") as info:
        load_prompt_assets(assets_copy)
    assert "\n" not in str(info.value)
    # Rendering an unvalidated template applies the same rules.
    with pytest.raises(PromptAssetError, match=message):
        render(template=template)


def test_mode_name() -> None:
    assert mode_name(agent.AgentMode.UNSPECIFIED) == "agent"
    assert mode_name(agent.AgentMode.AGENT) == "agent"
    assert mode_name(agent.AgentMode.ASK) == "ask"
    assert mode_name(agent.AgentMode.PLAN) == "plan"
    assert mode_name(agent.AgentMode.DEBUG) == "debug"
    assert mode_name(agent.AgentMode.MULTITASK) == "multitask"
    for other in (agent.AgentMode.TRIAGE, agent.AgentMode.PROJECT, agent.AgentMode(42)):
        with pytest.raises(UnknownModeError, match=r"byok does not run mode (TRIAGE|PROJECT|42 \(unknown)"):
            mode_name(other)
    assert run_mode(agent.AgentMode.ASK, "explore") == "subagent"
    assert run_mode(agent.AgentMode.ASK, "") == "ask"


def test_mode_value_round_trips_the_user_modes() -> None:
    for value in (agent.AgentMode.AGENT, agent.AgentMode.ASK, agent.AgentMode.PLAN, agent.AgentMode.DEBUG):
        assert mode_value(mode_name(value)) == value
    assert mode_value("multitask") == agent.AgentMode.MULTITASK
    for name in ("subagent", "compaction", "triage"):
        with pytest.raises(ValueError, match="no AgentMode"):
            mode_value(name)


# --- rendering --------------------------------------------------------------------------------


def test_minimal_render_has_only_time_and_query() -> None:
    assert render("hi") == f"<current_time>{NOW}</current_time>\n\n<user_query>\nhi\n</user_query>"
    assert render("hi", rc=agent.RequestContext(), selected=agent.SelectedContext()) == render("hi")


def test_single_pass_keeps_placeholders_in_user_text_verbatim() -> None:
    query = "explain {{REQUEST_CONTEXT}} and {{USER_QUERY}} and {{TIMESTAMP}} and {{NOPE}}"
    out = render(query, rc=full_context())
    assert f"<user_query>\n{query}\n</user_query>" in out
    assert out.count("<user_info>") == 1
    assert out.count(NOW) == 1


def test_sections_in_order() -> None:
    selected = agent.SelectedContext(files=[agent.SelectedFile(path="/w/proj/c.py", content="c = 3")])
    out = render(rc=full_context(), selected=selected)
    tags = [
        "<user_info>",
        "<git_status>",
        "<rules>",
        "<agent_skills>",
        "<subagents>",
        "<mcp_instructions>",
        "<project_layout>",
        "<open_files>",
        "<selected_context>",
        "<current_time>",
        "<user_query>",
    ]
    positions = [out.index(tag) for tag in tags]
    assert positions == sorted(positions)
    assert out.index("Use tabs.") < out.index("Be kind.")  # rules before non_file_rules
    assert out.index('path="/w/proj/a.py"') < out.index('path="/w/proj/b.py"')
    assert "\n\n\n" not in out


@pytest.mark.parametrize(
    ("rc", "absent"),
    [
        (agent.RequestContext(env=agent.RequestContextEnv()), "<user_info>"),
        (agent.RequestContext(git_repos=[agent.GitRepoInfo()]), "<git_status>"),
        (agent.RequestContext(rules=[agent.CursorRule(full_path="/r.mdc")]), "<rules>"),
        (
            agent.RequestContext(
                agent_skills=[
                    agent.AgentSkill(full_path="/s", description="d", disable_model_invocation=True)
                ]
            ),
            "<agent_skills>",
        ),
        (
            agent.RequestContext(mcp_instructions=[agent.McpInstructions(server_name="x")]),
            "<mcp_instructions>",
        ),
    ],
)
def test_sections_without_data_are_absent(rc: agent.RequestContext, absent: str) -> None:
    out = render(rc=rc)
    assert absent not in out
    assert out == render()


def test_each_section_alone_leaves_no_blank_runs() -> None:
    full = full_context()
    for field in ("env", "git_repos", "rules", "agent_skills", "mcp_instructions", "project_layouts"):
        rc = agent.RequestContext(**{field: getattr(full, field)})
        out = render(rc=rc)
        assert "\n\n\n" not in out and not out.startswith("\n")


def test_selected_context_text_parts() -> None:
    selected = agent.SelectedContext(
        code_selections=[
            agent.SelectedCodeSelection(
                content="x = 1",
                path="/w/a.py",
                range=agent.Range(start=agent.Position(line=3), end=agent.Position(line=4)),
            )
        ],
        git_diff=agent.SelectedGitDiff(content="diff --git a b"),
        extra_context=["note"],
    )
    out = render(selected=selected)
    assert '<code_selection path="/w/a.py" lines="3-4">\nx = 1\n</code_selection>' in out
    assert "<git_diff>\ndiff --git a b\n</git_diff>" in out
    assert "<extra_context>\nnote\n</extra_context>" in out
    # An image's bytes go as the message's image part; the text says where each one is.
    images = agent.SelectedContext(selected_images=[agent.SelectedImage(path="/i.png", data=b"\x89PNG")])
    assert (
        render(selected=images)
        == '<selected_context>\n<image index="1" path="/i.png"/>\n</selected_context>\n\n' + render()
    )


def test_time_zone_argument_wins_over_env() -> None:
    rc = full_context()
    assert f"<current_time>{NOW} (Europe/Berlin)</current_time>" in render(rc=rc)
    assert f"<current_time>{NOW} (UTC)</current_time>" in render(rc=rc, time_zone="UTC")


def test_attributes_are_escaped() -> None:
    rc = agent.RequestContext(rules=[agent.CursorRule(full_path='/a "b" & c', content="x")])
    assert '<rule path="/a &quot;b&quot; &amp; c">' in render(rc=rc)


def test_deterministic() -> None:
    first = render(rc=full_context())
    reordered = full_context()
    reordered.file_contents = dict(reversed(list(reordered.file_contents.items())))
    assert render(rc=full_context()) == first == render(rc=reordered)


def test_sections_expose_rendered_blocks() -> None:
    sections = request_context_sections(full_context())
    assert sections.rules.startswith("<rules>") and "Use tabs." in sections.rules
    assert sections.joined() in render(rc=full_context())
    assert request_context_sections(None).joined() == ""


def test_build_runtime_message() -> None:
    msg = build_runtime_message(
        TEMPLATE,
        request_id="req-1",
        user_message=user("hi"),
        request_context=None,
        now_iso=NOW,
        time_zone=None,
    )
    assert (msg.role, msg.origin, msg.event_id) == ("user", "runtime", "run-request:req-1")
    assert msg.text == render("hi")


@given(text=st.text(max_size=200))
def test_user_text_inserted_verbatim_exactly_once(text: str) -> None:
    rc = full_context()
    baseline = render("", rc=rc)
    empty_query = "<user_query>\n\n</user_query>"
    assert baseline.count(empty_query) == 1
    out = render(text, rc=rc)
    assert out == baseline.replace(empty_query, f"<user_query>\n{text}\n</user_query>")
    marked = f"\x00{text}\x00"
    assert render(marked, rc=rc).count(marked) == 1


@pytest.mark.parametrize("broken", ["multitask/runtime.md", "subagent", "compaction/tools.json"])
async def test_a_missing_mode_asset_stops_start_up(
    assets_copy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, broken: str
) -> None:
    from byok import daemon
    from byok.config_load import load_config

    target = assets_copy / "modes" / broken
    shutil.rmtree(target) if target.is_dir() else target.unlink()
    monkeypatch.setattr(daemon, "default_prompt_root", lambda: assets_copy)
    (tmp_path / "byok.toml").write_text(f'[server]\ndata_dir = "{tmp_path / "data"}"\nport = 0\n')
    config = load_config(tmp_path / "byok.toml", overrides={})
    with pytest.raises(daemon.StartupError, match=f"cannot load the prompt assets: .*{broken}") as info:
        await daemon.run_daemon(config)
    assert "\n" not in str(info.value)
    assert not (tmp_path / "data").exists()  # stopped before it opened anything
