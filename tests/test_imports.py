"""The import structure: no cycles between modules or between seedq's
first-level packages (lazy imports inside functions included), and every
module importable on its own.

The graph is grimp's (import-linter's graph builder), which reads every import
statement of every module, function-level ones too; the cycle search is the
standard library's `graphlib`.
"""

import concurrent.futures
import graphlib
import subprocess
import sys

import grimp
import pytest

GRAPH = grimp.build_graph("seedq", cache_dir=None)


def _first_level(module: str) -> str:
    """seedq.server.inference -> seedq.server; seedq.cli -> seedq.cli."""
    return ".".join(module.split(".")[:2])


def _cycle(edges: dict[str, set[str]]) -> list[str] | None:
    try:
        graphlib.TopologicalSorter(edges).prepare()
    except graphlib.CycleError as e:
        return e.args[1]
    return None


def module_edges() -> dict[str, set[str]]:
    return {m: set(GRAPH.find_modules_directly_imported_by(m)) for m in GRAPH.modules}


def package_edges() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for module, imported in module_edges().items():
        for other in imported:
            a, b = _first_level(module), _first_level(other)
            if a != b:
                edges.setdefault(a, set()).add(b)
    return edges


@pytest.mark.unit
def test_the_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) is not None
    assert _cycle({"a": {"b"}, "b": {"c"}}) is None


@pytest.mark.unit
def test_grimp_sees_lazy_imports():
    # cli imports the commands inside the functions that run them.
    assert "seedq.local" in GRAPH.find_modules_directly_imported_by("seedq.cli")


@pytest.mark.unit
def test_no_module_import_cycle():
    assert _cycle(module_edges()) is None, " -> ".join(_cycle(module_edges()))


@pytest.mark.unit
def test_no_first_level_package_import_cycle():
    cycle = _cycle(package_edges())
    assert cycle is None, " -> ".join(cycle)


@pytest.mark.unit
def test_leaf_modules_import_nothing_of_seedq_that_imports_them_back():
    # The shared types and the flag machinery are leaves: whatever they need
    # from seedq must not depend on the agents, the server or the CLI.
    assert GRAPH.find_modules_directly_imported_by("seedq.schema") == set()
    assert GRAPH.find_modules_directly_imported_by("seedq.flags") <= {"seedq.config", "seedq.envs"}


@pytest.mark.e2e
@pytest.mark.parametrize("chunk", range(2))
def test_every_module_imports_alone(chunk):
    modules = sorted(GRAPH.modules)[chunk::2]

    def import_alone(module: str):
        done = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True,
                              text=True, timeout=120)
        return module, done.returncode, done.stderr.strip().splitlines()[-1:]

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        failed = [r for r in pool.map(import_alone, modules) if r[1] != 0]
    assert not failed, failed
