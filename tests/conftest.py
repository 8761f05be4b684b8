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



@pytest.fixture
def importable_module(tmp_path, monkeypatch):
    """`importable_module("name", source)` writes tmp_path/name.py, makes it importable
    here, and returns the environment (PYTHONPATH) that makes it importable in the
    seedq processes a test starts (its actors register the module's envs too)."""
    import os

    def write(name: str, source: str) -> dict[str, str]:
        (tmp_path / f"{name}.py").write_text(source)
        monkeypatch.syspath_prepend(str(tmp_path))
        return {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}

    return write

TIERS = ("unit", "e2e", "learning")


def pytest_configure(config):
    # The in-process tests compile through JAX's persistent compilation cache, as
    # the seedq processes do (seedq.process.jax_setup; SEEDQ_JAX_CACHE_DIR=off disables
    # it), every compile included: the tests' many small functions each compile
    # in under the processes' 0.1 s threshold, and together they are half of the
    # unit tier's time (docs/testing.md).
    import jax

    from seedq.process import jax_setup

    jax_setup.configure()
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


def pytest_collection_modifyitems(config, items):
    """Every test names its tier (pyproject.toml's markers, docs/testing.md): an
    unmarked test would silently fall out of `-m unit` and of `-m e2e`, so it
    fails collection instead; a unit test is nothing else."""
    wrong = []
    for item in items:
        tiers = {m.name for m in item.iter_markers() if m.name in TIERS}
        if not tiers or ("unit" in tiers and len(tiers) > 1):
            wrong.append(f"{item.nodeid} ({', '.join(sorted(tiers)) or 'no tier'})")
    if wrong:
        raise pytest.UsageError(
            f"{len(wrong)} test(s) need exactly one of unit, or e2e and/or learning "
            f"(pytest.mark.<tier> or the module's pytestmark): " + "; ".join(wrong[:5])
        )
    # The slow tiers first: pytest-xdist hands out tests in this order, so the
    # long runs start early and the many short unit tests even out the
    # workers' ends (longest-first scheduling). A stable sort keeps each
    # tier's own order.
    items.sort(key=lambda item: 0 if item.get_closest_marker("unit") is None else 1)
