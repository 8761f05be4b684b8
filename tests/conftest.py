"""Fixtures shared by several test modules."""

from __future__ import annotations

import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture
def run_notebook(tmp_path):
    """`run_notebook("name.ipynb")` executes notebooks/name.ipynb headless, with
    tmp_path as its working directory, asserts that no code cell raised, and
    returns (outputs of the code cells, their concatenated text)."""

    def run(name: str):
        import nbformat
        from nbclient import NotebookClient

        notebook = nbformat.read(REPO / "notebooks" / name, as_version=4)
        NotebookClient(
            notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
        ).execute()
        outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
        assert not [o for o in outputs if o.output_type == "error"]
        return outputs, "".join(o.get("text", "") for o in outputs)

    return run
