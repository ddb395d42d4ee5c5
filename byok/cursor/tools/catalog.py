"""The model-visible tool catalog and the per-mode tool manifests.

``prompt/tools/<Name>.json`` holds one tool byok can offer, in OpenAI function-tool shape
(``{"name", "description", "parameters"}``; the file is named for the tool). The catalog is the
folder. ``prompt/modes/<mode>/tools.json`` lists, in order, the names one mode offers. Both are
validated when loaded so a broken asset stops the daemon at start-up, with a one-line error
naming the file, instead of failing a user's turn.

The parameters schema is stored as canonical JSON text so the same catalog always produces the
same provider request bytes (prompt caches key on them).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from byok.model.messages import canonical_json
from byok.model.request import ToolSpec

CATALOG_DIR = Path("tools")
MANIFEST_FILE = "tools.json"

# OpenAI and Anthropic both restrict function names to this alphabet and length.
_TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_ENTRY_KEYS = frozenset({"name", "description", "parameters"})


class ToolCatalogError(Exception):
    """The tool catalog or a mode manifest is missing or malformed; one line naming the file."""


def load_tool_catalog(prompt_root: Path) -> dict[str, ToolSpec]:
    folder = prompt_root / CATALOG_DIR
    if not folder.is_dir():
        raise ToolCatalogError(f"{folder}: the tool catalog folder is missing")
    catalog: dict[str, ToolSpec] = {}
    for path in sorted(folder.glob("*.json")):
        spec = _tool_spec(_read_json(path), where=str(path))
        if spec.name != path.stem:
            raise ToolCatalogError(f"{path}: the file defines tool {spec.name!r}; name it {spec.name}.json")
        catalog[spec.name] = spec
    if not catalog:
        raise ToolCatalogError(f"{folder}: the catalog defines no tools")
    return catalog


def mode_tools(prompt_root: Path, mode: str, catalog: dict[str, ToolSpec]) -> tuple[ToolSpec, ...]:
    """The tools one mode offers, in manifest order (the order the provider sees them)."""
    path = prompt_root / "modes" / mode / MANIFEST_FILE
    names = _read_json(path)
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ToolCatalogError(f"{path}: expected a JSON array of tool names")
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ToolCatalogError(f"{path}: tool {name!r} is listed more than once")
        if name not in catalog:
            raise ToolCatalogError(f"{path}: unknown tool {name!r} (not in the tool catalog)")
        seen.add(name)
    return tuple(catalog[name] for name in names)


def _tool_spec(entry: Any, *, where: str) -> ToolSpec:
    if not isinstance(entry, dict):
        raise ToolCatalogError(f"{where}: expected an object, got {_json_type(entry)}")
    unknown = sorted(set(entry) - _ENTRY_KEYS)
    if unknown:
        # Catches the wrapped {"type": "function", "function": {...}} shape and misspelt keys.
        raise ToolCatalogError(f"{where}: unexpected keys {unknown} (allowed: name, description, parameters)")
    name = entry.get("name")
    if not isinstance(name, str) or not _TOOL_NAME.match(name):
        raise ToolCatalogError(f"{where}: 'name' must match {_TOOL_NAME.pattern}, got {name!r}")
    where = f"{where} ({name})"
    description = entry.get("description")
    if not isinstance(description, str) or not description.strip():
        raise ToolCatalogError(f"{where}: 'description' must be a non-empty string")
    parameters = entry.get("parameters")
    if not isinstance(parameters, dict) or parameters.get("type") != "object":
        raise ToolCatalogError(f'{where}: \'parameters\' must be a JSON Schema object with "type": "object"')
    properties = parameters.get("properties", {})
    if not isinstance(properties, dict):
        raise ToolCatalogError(f"{where}: 'parameters.properties' must be an object")
    required = parameters.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) and r in properties for r in required):
        raise ToolCatalogError(f"{where}: 'parameters.required' must list names defined in 'properties'")
    return ToolSpec(name=name, description=description, parameters_json=canonical_json(parameters).decode())


def _read_json(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ToolCatalogError(f"{path}: file is missing") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ToolCatalogError(f"{path}: cannot read file: {exc}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ToolCatalogError(
            f"{path}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
        ) from None


def _json_type(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number"
    )
