"""Tooling behind pip extras (seedq.extras): a command whose extra is missing says
which one to install in one line; training imports none of the extras' packages."""

import subprocess
import sys

import grimp
import pytest

from seedq import cli, extras
from seedq.reporting import curves

# The extras' packages, by import name, and the only seedq packages that may import them.
# (PyYAML is a core dependency: config files.)
EXTRA_PACKAGES = {"matplotlib": "bench", "psutil": "bench", "minatar": "minatar"}
TOOLING = ("seedq.bench", "seedq.launch")
# Training modules that use an extra's package only where it is installed.
OPTIONAL_USERS = {"seedq.reporting.curves", "seedq.envs"}  # curves.png; MinAtar ids


def _uninstalled(monkeypatch, name: str) -> None:
    """`name` as if not installed: importing it fails and find_spec finds nothing."""
    for module in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        monkeypatch.delitem(sys.modules, module)
    monkeypatch.setitem(sys.modules, name, None)


@pytest.mark.unit
def test_require_returns_when_installed_and_exits_2_naming_the_extra_when_not(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["seedq", "bench", "soak", "--actors", "2"])
    extras.require("bench", "json", "numpy")
    assert capsys.readouterr().err == ""
    _uninstalled(monkeypatch, "psutil")
    with pytest.raises(SystemExit) as exit_:
        extras.require("bench", "numpy", "psutil")
    assert exit_.value.code == 2
    assert capsys.readouterr().err == "seedq bench soak: needs the 'bench' extra: pip install 'seedq[bench]'\n"


@pytest.mark.unit
def test_command_name_is_the_subcommand_the_user_typed():
    assert extras.command_name(["seedq", "compare", "--out", "x"]) == "seedq compare"
    assert extras.command_name(["seedq", "launch", "k8s", "--env", "Pong"]) == "seedq launch k8s"
    assert extras.command_name(["seedq"]) == "seedq"


@pytest.mark.unit
@pytest.mark.parametrize("argv, package, extra, module", [
    (["launch", "k8s", "--env", "CartPole-v1"], "yaml", "launch", "seedq.launch.k8s"),
    (["compare", "--plot-only", "--out", "nowhere"], "matplotlib", "bench", "seedq.bench.compare"),
])
def test_the_cli_names_the_missing_extra_in_one_line(monkeypatch, capsys, argv, package, extra, module):
    _uninstalled(monkeypatch, package)
    monkeypatch.delitem(sys.modules, module, raising=False)
    # `from seedq.launch import k8s` takes the package's attribute when an earlier
    # test imported the module: remove it too, so the module runs its check again.
    parent, _, child = module.rpartition(".")
    if parent in sys.modules:
        monkeypatch.delattr(sys.modules[parent], child, raising=False)
    monkeypatch.setattr(sys, "argv", ["seedq", *argv])
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 2
    command = "seedq " + " ".join(argv[: 2 if argv[0] == "launch" else 1])
    assert capsys.readouterr().err == f"{command}: needs the '{extra}' extra: pip install 'seedq[{extra}]'\n"


@pytest.mark.unit
def test_only_the_tooling_imports_the_extras_packages():
    graph = grimp.build_graph("seedq", include_external_packages=True, cache_dir=None)
    for package in EXTRA_PACKAGES:
        importers = graph.find_modules_that_directly_import(package)
        assert importers and all(m.startswith(TOOLING) or m in OPTIONAL_USERS for m in importers), (
            package, importers)


# The modules a `seedq train` run loads (CLI, learner, server, agents, actors, evaluation).
TRAINING_PATH = r"""
import sys
import seedq.cli, seedq.local, seedq.learner.learner, seedq.server.service, seedq.actor.seed_actor
import seedq.evaluation, seedq.distributed, seedq.checkpoint, seedq.agents.vtrace.agent, seedq.agents.r2d2.agent
print(" ".join(sorted(m for m in ("matplotlib", "psutil") if m in sys.modules)))
"""


@pytest.mark.e2e
def test_the_training_path_imports_no_plotting_or_process_library():
    # PyYAML is left out of this check: flax imports it itself.
    done = subprocess.run([sys.executable, "-c", TRAINING_PATH], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == []


@pytest.mark.unit
def test_a_run_without_matplotlib_writes_its_curves_csv_and_leaves_out_the_png(monkeypatch, capsys, tmp_path):
    _uninstalled(monkeypatch, "matplotlib")
    sink = curves.CurvesSink(str(tmp_path))
    sink.close()
    assert (tmp_path / curves.CSV_FILE).exists() and not (tmp_path / curves.PNG_FILE).exists()
    assert capsys.readouterr().out == "curves.png left out: matplotlib is not installed (pip install 'seedq[bench]')\n"


@pytest.mark.unit
def test_a_minatar_env_without_its_extra_names_the_pip_install(monkeypatch):
    from seedq import envs

    _uninstalled(monkeypatch, "minatar")
    monkeypatch.delitem(envs.gym.registry, "MinAtar/Breakout-v1", raising=False)
    with pytest.raises(ValueError, match=r"^MinAtar envs need the 'minatar' extra: pip install 'seedq\[minatar\]'$"):
        envs.env_spec("MinAtar/Breakout-v1")
