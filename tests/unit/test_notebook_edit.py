"""EditNotebook's edit of a notebook's JSON (cursor/tools/notebook_edit.py) and its arguments."""

from __future__ import annotations

import json

import pytest

from byok.cursor.tools.base import ToolArgError
from byok.cursor.tools.notebook_edit import CellEdit, cell_source, edit_notebook
from byok.cursor.tools.notebook_tool import EDIT_NOTEBOOK
from byok.cursor.tools.text_edit import EditError


def notebook(*cells: dict, minor: int = 5) -> str:
    nb = {
        "cells": list(cells),
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3 (ünïcode)"}},
        "nbformat": 4,
        "nbformat_minor": minor,
    }
    return json.dumps(nb, indent=1, ensure_ascii=False) + "\n"


CODE = {
    "cell_type": "code",
    "execution_count": 3,
    "id": "aaaa1111",
    "metadata": {},
    "outputs": [{"output_type": "stream", "name": "stdout", "text": ["2\n"]}],
    "source": ["x = 1\n", "print(x + 1)"],
}
MD = {"cell_type": "markdown", "id": "bbbb2222", "metadata": {}, "source": ["# Title\n", "Some text"]}


def edit(idx: int, old: str, new: str, *, new_cell: bool = False, lang: str = "python") -> CellEdit:
    return CellEdit(idx, new_cell, lang, old, new)


def test_replacing_text_in_a_cell_changes_only_that_cell() -> None:
    before = notebook(CODE, MD)
    after = edit_notebook(before, edit(0, "x = 1", "x = 41"), cell_id_seed="call")
    assert cell_source(after, 0) == "x = 41\nprint(x + 1)"
    nb_before, nb_after = json.loads(before), json.loads(after)
    assert nb_after["cells"][0]["source"] == ["x = 41\n", "print(x + 1)"]
    assert nb_after["cells"][0]["outputs"] == CODE["outputs"]  # outputs kept
    assert nb_after["cells"][1] == nb_before["cells"][1]
    # The document is written as it was read: indent 1, keys in order, non-ASCII as is, "\n" at the end.
    assert after == before.replace('"x = 1\\n"', '"x = 41\\n"')


def test_a_new_cell_is_inserted_at_its_index_with_a_stable_id() -> None:
    before = notebook(CODE, MD)
    once = edit_notebook(
        before, edit(1, "", "## Part 2\ntext", new_cell=True, lang="markdown"), cell_id_seed="c9"
    )
    again = edit_notebook(
        before, edit(1, "", "## Part 2\ntext", new_cell=True, lang="markdown"), cell_id_seed="c9"
    )
    assert once == again  # the same call writes the same bytes
    cells = json.loads(once)["cells"]
    assert [c["cell_type"] for c in cells] == ["code", "markdown", "markdown"]
    assert cells[1]["source"] == ["## Part 2\n", "text"]
    assert len(cells[1]["id"]) == 8 and cells[1]["id"] not in {"aaaa1111", "bbbb2222"}
    code = json.loads(edit_notebook(before, edit(2, "", "y = 2", new_cell=True), cell_id_seed="c1"))["cells"][
        2
    ]
    assert code == {
        "cell_type": "code",
        "execution_count": None,
        "id": code["id"],
        "metadata": {},
        "outputs": [],
        "source": ["y = 2"],
    }


def test_cells_without_ids_get_none_and_string_sources_stay_strings() -> None:
    old = {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": "a = 1\n"}
    before = notebook(old, minor=4)
    after = json.loads(edit_notebook(before, edit(0, "a = 1", "a = 2"), cell_id_seed="c"))
    assert after["cells"][0]["source"] == "a = 2\n"
    added = json.loads(edit_notebook(before, edit(0, "", "b", new_cell=True), cell_id_seed="c"))
    assert "id" not in added["cells"][0]


def test_a_missing_notebook_is_created_by_its_first_cell() -> None:
    created = edit_notebook(None, edit(0, "", "print('hi')\n", new_cell=True), cell_id_seed="c")
    nb = json.loads(created)
    assert (nb["nbformat"], nb["nbformat_minor"]) == (4, 5)
    assert cell_source(created, 0) == "print('hi')\n"
    with pytest.raises(EditError, match="file not found"):
        edit_notebook(None, edit(0, "a", "b"), cell_id_seed="c")


@pytest.mark.parametrize(
    ("text", "change", "problem"),
    [
        ("{not json", edit(0, "a", "b"), "does not parse"),
        ('{"cells": 3}', edit(0, "a", "b"), "no 'cells' list"),
        (notebook(CODE), edit(1, "a", "b"), "has no cell 1"),
        (notebook(CODE), edit(2, "", "b", new_cell=True), "past the end"),
        (notebook(CODE), edit(0, "nothing like it", "b"), "not found in cell 0"),
        (notebook(CODE), edit(0, "x", "y"), "occurs 2 times"),
        (notebook(CODE), edit(0, "", "y"), "old_string is empty"),
    ],
)
def test_an_edit_that_cannot_apply_says_why(text: str, change: CellEdit, problem: str) -> None:
    with pytest.raises(EditError, match=problem):
        edit_notebook(text, change, cell_id_seed="c")


def test_arguments() -> None:
    args = EDIT_NOTEBOOK.parse(
        {
            "target_notebook": "/w/a.ipynb",
            "cell_idx": 2.0,
            "is_new_cell": False,
            "cell_language": "python",
            "old_string": "a\r\nb",
            "new_string": "c",
        }
    )
    assert args["path"] == "/w/a.ipynb" and args["edit"] == CellEdit(2, False, "python", "a\nb", "c")
    with pytest.raises(ToolArgError, match="no old_string"):
        EDIT_NOTEBOOK.parse(
            {"target_notebook": "a", "cell_idx": 0, "is_new_cell": True, "old_string": "x", "new_string": "y"}
        )
    with pytest.raises(ToolArgError, match="is_new_cell"):
        EDIT_NOTEBOOK.parse({"target_notebook": "a", "cell_idx": 0, "new_string": "y"})
