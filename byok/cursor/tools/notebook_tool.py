"""EditNotebook: one cell of a Jupyter notebook, over the edit path Write and StrReplace use.

A hidden ``read_args`` gets the notebook's text, byok edits the cell in its JSON
(``notebook_edit``), and ``write_args`` writes the whole text back; Cursor's ``edit_tool_call``
card shows the file's diff, its streamed content the cell's new text.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from byok.cursor.tools.base import (
    Invocation,
    ToolArgError,
    ToolDef,
    optional_bool,
    optional_int,
    optional_str,
    require_str,
)
from byok.cursor.tools.edit_tools import ContentStream, EditExecution
from byok.cursor.tools.notebook_edit import CellEdit, edit_notebook
from byok.cursor.tools.text_edit import normalize_newlines
from byok.pb.agent import v1 as agent


def _parse(args: Mapping[str, Any]) -> Mapping[str, Any]:
    path = require_str(args, "target_notebook")
    cell_idx = optional_int(args, "cell_idx", minimum=0)
    if cell_idx is None:
        raise ToolArgError("missing required argument 'cell_idx'")
    is_new = optional_bool(args, "is_new_cell")
    if is_new is None:
        raise ToolArgError("missing required argument 'is_new_cell'")
    old = normalize_newlines(optional_str(args, "old_string") or "")
    new = normalize_newlines(require_str(args, "new_string", allow_empty=True))
    if is_new and old:
        raise ToolArgError("a new cell has no old_string; put its whole text in new_string")
    language = optional_str(args, "cell_language") or "python"
    edit = CellEdit(cell_idx, is_new, language, old, new)
    # "path" and "new_string" as the edit path and its streamed card read them.
    return {"path": path, "new_string": new, "edit": edit}


def _edit_args(args: Mapping[str, Any]) -> agent.EditArgs:
    return agent.EditArgs(path=args["path"], stream_content=args["new_string"])


def _execute(inv: Invocation) -> EditExecution:
    path: str = inv.args["path"]
    edit: CellEdit = inv.args["edit"]

    def apply(before: str | None) -> str:
        return edit_notebook(before, edit, cell_id_seed=inv.call_id, path=path)

    def describe(before: str | None, after: str, added: int, removed: int) -> str:
        if before is None:
            return f"Created {path} with a new cell {edit.cell_idx}."
        if edit.is_new_cell:
            return f"Inserted a new cell at index {edit.cell_idx} of {path} (+{added} -{removed})."
        return f"Edited cell {edit.cell_idx} of {path} (+{added} -{removed})."

    return EditExecution(inv, _edit_args(inv.args), apply, describe)


EDIT_NOTEBOOK = ToolDef(
    name="EditNotebook",
    ui_field="edit_tool_call",
    placeholder=agent.EditToolCall,
    parse=_parse,
    ui=lambda args: agent.EditToolCall(args=_edit_args(args)),
    execute=_execute,
    args_stream=lambda: ContentStream("new_string"),
)

TOOLS: tuple[ToolDef, ...] = (EDIT_NOTEBOOK,)
