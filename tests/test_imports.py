"""The import structure: no cycles between modules or between seedq's
first-level packages (lazy imports inside functions included), and every
module importable on its own.

The graph is grimp's (import-linter's graph builder), which reads every import
statement of every module, function-level ones too; the cycle search is the
standard library's `graphlib`.
"""

import graphlib
import pathlib
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
    assert {m for m in GRAPH.find_modules_directly_imported_by("seedq.flags")
            if not m.startswith("seedq.config.")} <= {"seedq.config", "seedq.envs"}


@pytest.mark.unit
def test_the_networks_own_their_input_hooks_and_quant_registers_into_them():
    agents_import = GRAPH.find_upstream_modules("seedq.agents", as_package=True)
    assert not [m for m in agents_import if m.startswith("seedq.quant")]
    assert "seedq.agents.inputs" in GRAPH.find_upstream_modules("seedq.quant", as_package=True)


# Imports each module named on the command line in a process of its own: a fork
# of a parent that has loaded the third-party libraries seedq builds on but no
# seedq module, so every child imports exactly one seedq module first (what
# `python -c "import M"` checks, without paying JAX's start-up 78 times).
IMPORT_ALONE = r"""
import importlib, os, sys
for lib in ("numpy", "jax", "jax.numpy", "flax.linen", "optax", "chex", "grpc", "grpc.aio",
            "google.protobuf", "gymnasium", "orbax.checkpoint", "tensorboardX", "rich"):
    importlib.import_module(lib)
assert not [m for m in sys.modules if m == "seedq" or m.startswith("seedq.")]
failed = []
for module in sys.argv[1:]:
    pid = os.fork()
    if pid == 0:
        try:
            importlib.import_module(module)
            os._exit(0)
        except BaseException as e:
            sys.stderr.write(f"{module}: {type(e).__name__}: {e}\n")
            os._exit(1)
    if os.waitpid(pid, 0)[1]:
        failed.append(module)
print(" ".join(failed))
"""


def import_alone(modules) -> list[str]:
    done = subprocess.run([sys.executable, "-c", IMPORT_ALONE, *modules], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


@pytest.mark.e2e
def test_every_module_imports_alone():
    assert import_alone(["seedq.no_such_module", "seedq.schema"]) == ["seedq.no_such_module"]
    assert import_alone(sorted(GRAPH.modules)) == []


@pytest.mark.e2e
def test_the_actor_command_runs_without_jax():
    """`seedq actor` starts fast: the CLI imports JAX only in the commands that need it."""
    code = (
        "import sys; from seedq import cli; "
        "code = cli.main(['actor', '--print-config', '--server', 'unix:/nowhere.sock', '--env', 'CartPole-v1']); "
        "assert code == 0, code; "
        "print(sorted(m for m in sys.modules if m == 'jax' or m.startswith('jax.')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.e2e
def test_vulture_finds_no_dead_code():
    """Every function, class, method and variable of seedq is used, or named in
    vulture_whitelist.py with what calls it (pyproject.toml's [tool.vulture]
    leaves out protoc's output)."""
    root = pathlib.Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-m", "vulture", "seedq", "vulture_whitelist.py"],
                          capture_output=True, text=True, timeout=120, cwd=root)
    assert done.returncode == 0 and done.stdout == "", done.stdout + done.stderr


@pytest.mark.unit
def test_every_test_folder_is_a_package():
    """Test modules get package names (tests.agents.vtrace.test_agent), so two
    folders may hold test files of the same name without pytest refusing one."""
    tests = pathlib.Path(__file__).resolve().parent
    folders = {p.parent for p in tests.rglob("test_*.py")}
    assert tests in folders
    assert sorted(str(f.relative_to(tests.parent)) for f in folders if not (f / "__init__.py").exists()) == []
