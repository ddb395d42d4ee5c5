from __future__ import annotations

import json
import shutil
from pathlib import Path

import betterproto2
import pytest

from byok.cursor.agent_modes import REQUIRED_MODES
from byok.cursor.prompting import default_prompt_root
from byok.cursor.tools.catalog import ToolCatalogError, load_tool_catalog, mode_tools
from byok.cursor.tools.registry import build_registry, placeholder_call
from byok.model.messages import canonical_json

ROOT = default_prompt_root()

# Parameter names are the ones Cursor-trained models expect (reference catalogs); only the
# descriptions are ours.
EXPECTED_PARAMETERS = {
    "Read": {"path", "offset", "limit"},
    "Write": {"path", "contents"},
    "StrReplace": {"path", "old_string", "new_string", "replace_all"},
    "Delete": {"path"},
    "Grep": {
        "pattern",
        "path",
        "glob",
        "output_mode",
        "-A",
        "-B",
        "-C",
        "-i",
        "type",
        "head_limit",
        "multiline",
        "offset",
    },
    "Glob": {"glob_pattern", "target_directory"},
    "ReadLints": {"paths"},
    "Shell": {"command", "working_directory", "block_until_ms", "description", "required_permissions"},
    "GetMcpTools": {"server", "toolName", "pattern"},
    "CallMcpTool": {"server", "toolName", "arguments"},
    "FetchMcpResource": {"server", "uri", "downloadPath"},
    "TodoWrite": {"todos", "merge"},
    "AwaitShell": {"shell_id", "block_until_ms", "pattern"},
    "EditNotebook": {
        "target_notebook",
        "cell_idx",
        "is_new_cell",
        "cell_language",
        "old_string",
        "new_string",
    },
    "AskQuestion": {"title", "questions"},
    "CreatePlan": {"name", "overview", "plan", "todos"},
    "SwitchMode": {"target_mode_id", "explanation"},
    "WebFetch": {"url"},
    "WebSearch": {"search_term", "explanation"},
    "GenerateImage": {"description", "file_path"},
    "Task": {"description", "prompt", "subagent_type", "model", "resume", "run_in_background"},
    "UpdateCurrentStep": {"current_step", "final_summary", "completed_subtitle"},
}
# Interaction tools by mode (seeds 000 §26.13; PROTOCOL §5's sets, CreatePlan only in plan mode).
INTERACTIONS = {
    "agent": {"AskQuestion", "SwitchMode", "WebFetch", "WebSearch", "GenerateImage"},
    "ask": {"AskQuestion", "WebFetch", "WebSearch"},
    "debug": {"AskQuestion", "WebFetch", "WebSearch"},
    "plan": {"AskQuestion", "CreatePlan", "WebFetch", "WebSearch"},
}
READ_ONLY = {"Read", "Grep", "Glob", "ReadLints"}
MCP = {"GetMcpTools", "CallMcpTool", "FetchMcpResource"}  # every mode: MCP servers are the user's own
EVERY_MODE = {"TodoWrite"}  # server-local tools that change nothing in the workspace
AWAITING_MODULES: set[str] = set()


def params(name: str) -> dict:
    return json.loads(load_tool_catalog(ROOT)[name].parameters_json)


def test_catalog_has_the_tools_with_reference_parameter_names() -> None:
    catalog = load_tool_catalog(ROOT)
    assert set(catalog) == set(EXPECTED_PARAMETERS)
    for name, spec in catalog.items():
        assert spec.name == name
        assert spec.description.strip()
        assert set(json.loads(spec.parameters_json)["properties"]) == EXPECTED_PARAMETERS[name], name


def test_required_arguments_and_enums() -> None:
    assert params("Read")["required"] == ["path"]
    assert params("Write")["required"] == ["path", "contents"]
    assert params("StrReplace")["required"] == ["path", "old_string", "new_string"]
    assert params("Grep")["required"] == ["pattern"]
    assert params("Glob")["required"] == ["glob_pattern"]
    assert "required" not in params("ReadLints")
    assert params("Shell")["required"] == ["command"]
    assert params("Grep")["properties"]["output_mode"]["enum"] == ["content", "files_with_matches", "count"]
    perms = params("Shell")["properties"]["required_permissions"]
    assert perms["type"] == "array" and perms["items"]["enum"] == ["full_network", "all"]
    assert params("ReadLints")["properties"]["paths"]["items"] == {"type": "string"}
    assert "required" not in params("GetMcpTools")
    assert params("CallMcpTool")["required"] == ["server", "toolName"]
    assert params("CallMcpTool")["properties"]["arguments"]["type"] == "object"
    assert params("FetchMcpResource")["required"] == ["server", "uri"]


def test_parameters_json_is_canonical() -> None:
    raw = read_entries(ROOT)
    catalog = load_tool_catalog(ROOT)
    for entry in raw:
        text = catalog[entry["name"]].parameters_json
        assert text == canonical_json(entry["parameters"]).decode()
        assert json.loads(text) == entry["parameters"]
        assert text == json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _keys_reversed(value: object) -> object:
    """The same JSON value with every object's keys in reverse order."""
    if isinstance(value, dict):
        return {key: _keys_reversed(value[key]) for key in reversed(value)}
    if isinstance(value, list):
        return [_keys_reversed(v) for v in value]
    return value


def test_the_same_catalog_gives_identical_specs(root: Path) -> None:
    """The specs depend on what the catalog says, not on how its file is written: a fresh load
    of a copy with every object's keys reversed and other whitespace gives the same specs, the
    parameters text byte for byte (the provider request bytes prompt caches key on)."""
    raw = read_entries(ROOT)
    write_catalog(root, [_keys_reversed(e) for e in raw])  # a copy of the prompt folder, keys reversed
    # The rewrite really reorders the schemas: a parameters text that followed the file's key
    # order (not canonical) would differ between the two loads.
    assert any(json.dumps(_keys_reversed(e["parameters"])) != json.dumps(e["parameters"]) for e in raw)
    original = load_tool_catalog(ROOT)
    fresh = load_tool_catalog(root)
    assert fresh == original


@pytest.mark.parametrize("mode", REQUIRED_MODES)
def test_every_mode_manifest_names_catalog_tools(mode: str) -> None:
    catalog = load_tool_catalog(ROOT)
    tools = mode_tools(ROOT, mode, catalog)
    names = [t.name for t in tools]
    # Compaction's call only summarises: it offers no tools.
    assert (not names) if mode == "compaction" else (names and len(names) == len(set(names)))
    assert all(catalog[t.name] is t for t in tools)


def test_mode_tool_sets() -> None:
    catalog = load_tool_catalog(ROOT)
    names = {mode: [t.name for t in mode_tools(ROOT, mode, catalog)] for mode in REQUIRED_MODES}
    interactions = set().union(*INTERACTIONS.values())
    everything = set(EXPECTED_PARAMETERS) - interactions - {"UpdateCurrentStep"}
    assert set(names["agent"]) - INTERACTIONS["agent"] == everything
    assert set(names["debug"]) - INTERACTIONS["debug"] == everything
    # A tool added to the agent's manifest belongs in these two as well (docs/architecture.md).
    assert names["multitask"] == names["agent"], "prompt/modes/multitask/tools.json: the agent's tools"
    # Subagents write files and run commands (seeds 000 §32); they never ask the user, not even
    # for an approval, and they report their progress to the parent's Task (seeds 000 §33).
    assert set(names["subagent"]) == set(names["agent"]) - interactions | {"UpdateCurrentStep"}, (
        "prompt/modes/subagent/tools.json: the agent's tools but the interactions, and UpdateCurrentStep"
    )
    assert names["compaction"] == []
    assert set(names["ask"]) - INTERACTIONS["ask"] == READ_ONLY | MCP | EVERY_MODE
    # Plan mode delegates research to subagents; ask mode does not (a subagent can write files).
    shells = {"Shell", "AwaitShell"}
    assert set(names["plan"]) - INTERACTIONS["plan"] == READ_ONLY | shells | {"Task"} | MCP | EVERY_MODE
    for mode, offered in INTERACTIONS.items():
        assert offered <= set(names[mode]), mode
        assert not (interactions - offered) & set(names[mode]), mode
    # Manifest order is the order the provider sees.
    manifest = json.loads((ROOT / "modes" / "plan" / "tools.json").read_text(encoding="utf-8"))
    assert names["plan"] == manifest


def test_every_registered_tool_is_in_the_catalog_and_draws_a_card() -> None:
    catalog = load_tool_catalog(ROOT)
    registry = build_registry()
    assert set(registry) <= set(catalog)
    assert set(catalog) - set(registry) <= AWAITING_MODULES
    for name, tool in registry.items():
        assert tool.name == name
        field, record = betterproto2.which_one_of(placeholder_call(tool), "tool")
        assert field == tool.ui_field
        assert record == tool.placeholder()


# --- malformed assets --------------------------------------------------------------------------


@pytest.fixture
def root(tmp_path: Path) -> Path:
    shutil.copytree(ROOT, tmp_path / "prompt")
    return tmp_path / "prompt"


def read_entries(root: Path) -> list[dict]:
    return [json.loads(p.read_text(encoding="utf-8")) for p in sorted((root / "tools").glob("*.json"))]


def write_catalog(root: Path, entries: list) -> None:
    """Replace the catalog folder with one file per entry (named for the entry's name)."""
    shutil.rmtree(root / "tools")
    (root / "tools").mkdir()
    for index, entry in enumerate(entries):
        name = entry.get("name") if isinstance(entry, dict) else None
        stem = name if isinstance(name, str) and "/" not in name else f"entry{index}"
        (root / "tools" / f"{stem}.json").write_text(json.dumps(entry), encoding="utf-8")


def tool(name: str = "Read", **extra: object) -> dict:
    entry = {"name": name, "description": "Reads.", "parameters": {"type": "object", "properties": {}}}
    return {**entry, **extra}


def catalog_error(root: Path) -> str:
    with pytest.raises(ToolCatalogError) as info:
        load_tool_catalog(root)
    message = str(info.value)
    assert "\n" not in message and "tools" in message
    return message


def test_missing_catalog(root: Path) -> None:
    shutil.rmtree(root / "tools")
    assert "catalog folder is missing" in catalog_error(root)


def test_bad_json_names_file_line_and_column(root: Path) -> None:
    (root / "tools" / "Read.json").write_text('{"name": "Read",\n oops}', encoding="utf-8")
    message = catalog_error(root)
    assert "Read.json" in message and "invalid JSON at line 2 column 2" in message


def test_a_file_named_for_another_tool(root: Path) -> None:
    (root / "tools" / "Read.json").rename(root / "tools" / "Reader.json")
    assert "name it Read.json" in catalog_error(root)


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ([], "defines no tools"),
        (["Read"], "expected an object, got a string"),
        ([tool(name="has space")], "'name' must match"),
        ([tool(description="  ")], "'description' must be a non-empty string"),
        ([tool(parameters={"type": "string"})], "'parameters' must be a JSON Schema object"),
        (
            [tool(parameters={"type": "object", "properties": [], "required": []})],
            "properties' must be an object",
        ),
        (
            [tool(parameters={"type": "object", "properties": {}, "required": ["path"]})],
            "'parameters.required'",
        ),
        ([{"type": "function", "function": tool()}], "unexpected keys ['function', 'type']"),
    ],
)
def test_malformed_catalog(root: Path, value: object, fragment: str) -> None:
    write_catalog(root, value)
    assert fragment in catalog_error(root)


def manifest_error(root: Path, mode: str = "ask") -> str:
    catalog = load_tool_catalog(root)
    with pytest.raises(ToolCatalogError) as info:
        mode_tools(root, mode, catalog)
    message = str(info.value)
    assert "\n" not in message and "tools.json" in message
    return message


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ('["Read", "Nope"]', "unknown tool 'Nope' (not in the tool catalog)"),
        ('["Read", "Read"]', "'Read' is listed more than once"),
        ('{"tools": ["Read"]}', "expected a JSON array of tool names"),
        ('["Read", 3]', "expected a JSON array of tool names"),
        ('["Read",', "invalid JSON"),
    ],
)
def test_malformed_manifest(root: Path, text: str, fragment: str) -> None:
    (root / "modes" / "ask" / "tools.json").write_text(text, encoding="utf-8")
    assert fragment in manifest_error(root)


def test_missing_manifest(root: Path) -> None:
    assert "file is missing" in manifest_error(root, mode="nosuchmode")
    (root / "modes" / "multitask" / "tools.json").unlink()
    assert "multitask/tools.json: file is missing" in manifest_error(root, mode="multitask")
