"""Editing one cell of a Jupyter notebook's JSON text (pure; EditNotebook's edit).

A notebook (nbformat 4) is a JSON object whose ``cells`` each hold a ``source``: a list of
lines or one string. An edit either inserts a new cell at an index or replaces a unique piece
of one cell's source. The rest of the document is kept as it was read: key order, the
indentation the file uses (nbformat writes 1), non-ASCII text as is, the final newline, each
cell's outputs. A new cell gets an ``id`` when the notebook's cells carry ids (nbformat 4.5),
derived from the tool call's id so the same call always writes the same bytes.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

import attrs

from byok.cursor.tools.text_edit import EditError, count_occurrences

CELL_TYPES = {"markdown": "markdown", "raw": "raw"}  # any other language is a code cell


@attrs.frozen
class CellEdit:
    cell_idx: int
    is_new_cell: bool
    cell_language: str
    old_string: str
    new_string: str


def edit_notebook(text: str | None, edit: CellEdit, *, cell_id_seed: str, path: str = "the notebook") -> str:
    """The notebook's new text; ``text`` None: the file does not exist yet (only a first new
    cell may create it). Raises EditError, with a message for the model."""
    if text is None:
        if not (edit.is_new_cell and edit.cell_idx == 0):
            raise EditError(f"file not found: {path} (a new notebook starts with a new cell at index 0)")
        nb: dict[str, Any] = _empty_notebook()
        indent, newline = 1, True
    else:
        nb = _parse(text, path)
        indent, newline = _indent_of(text), text.endswith("\n")
    cells: list[Any] = nb["cells"]
    if edit.is_new_cell:
        if edit.cell_idx > len(cells):
            raise EditError(f"cell_idx {edit.cell_idx} is past the end of {path} ({len(cells)} cells)")
        cells.insert(edit.cell_idx, _new_cell(edit, cells, nb, cell_id_seed))
    else:
        if edit.cell_idx >= len(cells):
            raise EditError(f"{path} has no cell {edit.cell_idx} ({len(cells)} cells, counted from 0)")
        cell = cells[edit.cell_idx]
        source = _source_text(cell.get("source", ""))
        cell["source"] = _source_like(cell.get("source"), _replaced(source, edit, path))
    out = json.dumps(nb, indent=indent, ensure_ascii=False)
    return out + "\n" if newline else out


def cell_source(text: str, index: int) -> str:
    """The source of cell ``index`` of a notebook's text (what a test or a description reads)."""
    return _source_text(_parse(text, "the notebook")["cells"][index].get("source", ""))


def _parse(text: str, path: str) -> dict[str, Any]:
    try:
        nb = json.loads(text)
    except ValueError as e:
        raise EditError(f"{path} is not a notebook: its JSON does not parse ({e})") from None
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise EditError(f"{path} is not a notebook: it has no 'cells' list")
    if not all(isinstance(c, dict) for c in nb["cells"]):
        raise EditError(f"{path} is not a notebook: a cell is not an object")
    return nb


def _replaced(source: str, edit: CellEdit, path: str) -> str:
    where = f"cell {edit.cell_idx} of {path}"
    if not edit.old_string:
        if source:
            raise EditError(
                f"old_string is empty but {where} is not; give the text to replace (or use a new cell)"
            )
        return edit.new_string
    if edit.old_string == edit.new_string:
        raise EditError("old_string and new_string are identical; there is nothing to change")
    n = count_occurrences(source, edit.old_string)
    if n == 0:
        raise EditError(f"old_string not found in {where}")
    if n > 1:
        raise EditError(f"old_string occurs {n} times in {where}; include more context to make it unique")
    return source.replace(edit.old_string, edit.new_string, 1)


def _source_text(source: Any) -> str:
    if isinstance(source, list):
        return "".join(s for s in source if isinstance(s, str))
    return source if isinstance(source, str) else ""


def _source_like(original: Any, text: str) -> Any:
    """``text`` in the shape the cell held its source (nbformat writes a list of lines)."""
    return text if isinstance(original, str) else text.splitlines(keepends=True)


def _new_cell(edit: CellEdit, cells: list[Any], nb: dict[str, Any], seed: str) -> dict[str, Any]:
    cell_type = CELL_TYPES.get(edit.cell_language.strip().lower(), "code")
    cell: dict[str, Any] = {"cell_type": cell_type}
    if cell_type == "code":
        cell["execution_count"] = None
    if _has_ids(cells, nb):
        cell["id"] = _cell_id(seed, {c.get("id") for c in cells})
    cell["metadata"] = {}
    if cell_type == "code":
        cell["outputs"] = []
    cell["source"] = edit.new_string.splitlines(keepends=True)
    return cell


def _has_ids(cells: list[Any], nb: dict[str, Any]) -> bool:
    if cells:
        return all("id" in c for c in cells)
    return (nb.get("nbformat"), nb.get("nbformat_minor", 0)) >= (4, 5)


def _cell_id(seed: str, taken: set[Any]) -> str:
    n = 0
    while True:
        cell_id = hashlib.sha256(f"{seed}:{n}".encode()).hexdigest()[:8]
        if cell_id not in taken:
            return cell_id
        n += 1


def _indent_of(text: str) -> int:
    match = re.search(r"\n( +)\"", text)
    return len(match.group(1)) if match else 1


def _empty_notebook() -> dict[str, Any]:
    return {"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
