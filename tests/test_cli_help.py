"""The CLI explains itself: short grouped help, a description for every flag,
one-line config-file errors naming the field, `python -m seedq --version`."""

import argparse
import subprocess
import sys

import pytest

from seedq import cli

pytestmark = pytest.mark.unit


def run_cli(args, capsys):
    try:
        code = cli.main([str(a) for a in args])
    except SystemExit as e:
        code = e.code
    return (code, *capsys.readouterr())


def test_train_help_is_short_and_shows_the_everyday_flags(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    code, out, err = run_cli(["train", "--help"], capsys)
    assert code == 0 and err == ""
    assert len(out.splitlines()) <= 80, out
    for flag in ("--agent {vtrace,r2d2}", "--env", "--seed", "--num-actors", "--envs-per-actor", "--max-frames",
                 "--max-seconds", "--target-return", "--logdir", "--resume", "--config", "--print-config",
                 "--overwrite", "--help-all"):
        assert flag in out, flag
    assert "--vtrace.learning-rate" not in out and "--parent-pid" not in out
    assert "env-dependent" in out  # --target-return's default is the env's threshold


def test_help_of_one_section_and_of_everything(capsys):
    code, out, _ = run_cli(["train", "--help", "vtrace"], capsys)
    assert code == 0 and "--vtrace.learning-rate" in out and "--num-actors INT" not in out
    assert "env-dependent" in out  # Box actions change the learning rate
    code, out, _ = run_cli(["train", "--help-all"], capsys)
    assert code == 0 and "--vtrace.learning-rate" in out and "--server.batching {auto,wait,greedy}" in out
    assert "--parent-pid" not in out
    code, _, err = run_cli(["train", "--help", "nosuch"], capsys)
    assert code == 2 and "vtrace" in err and len(err.strip().splitlines()) == 1


def test_every_flag_of_every_command_has_a_description():
    for line, sub in cli.subcommands(cli.build_parser(), "seedq"):
        for action in sub._actions:
            if action.help == argparse.SUPPRESS or isinstance(action, argparse._SubParsersAction):
                continue
            text = (action.help or "").split("(default:")[0].strip()
            assert text, f"{line} {action.option_strings or action.dest} has no description"


def test_a_mistyped_flag_is_one_short_line_with_close_matches(capsys):
    code, _, err = run_cli(["train", "--num-actor", "2"], capsys)
    assert code == 2 and "did you mean --num-actors" in err
    assert len(err) < 300 and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("name, text", [
    ("c.yaml", "num_actors: two\n"), ("c.json", '{"num_actors": "two"}'),
    ("c.yaml", "vtrace:\n  hidden_sizes: [a, b]\n"),
])
def test_a_wrongly_typed_config_field_is_one_line_naming_it(tmp_path, capsys, name, text):
    path = tmp_path / name
    path.write_text(text)
    code, _, err = run_cli(["train", "--config", path, "--print-config"], capsys)
    assert code == 2, err
    field = "num_actors" if "num_actors" in text else "vtrace.hidden_sizes"
    assert f"{field}: expected" in err and len(err.strip().splitlines()) == 1, err


def test_yaml_config_sets_fields_and_sections(tmp_path, capsys):
    import json

    path = tmp_path / "run.yml"
    path.write_text("num_actors: 1\ntarget_return: null\nvtrace:\n  learning_rate: 3e-4\n  hidden_sizes: [32, 32]\n")
    code, out, err = run_cli(["train", "--config", path, "--print-config"], capsys)
    assert code == 0, err
    config = json.loads(out)
    assert config["num_actors"] == 1 and config["target_return"] is None
    assert config["vtrace"]["learning_rate"] == 3e-4 and config["vtrace"]["hidden_sizes"] == [32, 32]


@pytest.mark.parametrize("name, text", [("missing.yaml", None), ("bad.yaml", "a: [\n"), ("bad.json", "{\n")])
def test_a_missing_or_malformed_config_file_exits_2_with_one_line(tmp_path, capsys, name, text):
    if text is not None:
        (tmp_path / name).write_text(text)
    code, _, err = run_cli(["train", "--config", tmp_path / name, "--print-config"], capsys)
    assert code == 2 and name in err and len(err.strip().splitlines()) == 1, err


def test_python_m_seedq_prints_its_version():
    result = subprocess.run([sys.executable, "-m", "seedq", "--version"], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("seedq ") and result.stdout.split()[1][0].isdigit(), result.stdout


def test_a_command_called_in_process_counts_its_time_from_the_call(monkeypatch):
    """--max-seconds and seconds-to-target of `cli.main([...])` start at the call,
    not when seedq.cli was imported (a test session or a notebook imports it early)."""
    import time

    seen = []
    monkeypatch.setattr(cli.run, "run", lambda args, argv, started: seen.append(started) or 0)
    monkeypatch.setattr(cli, "COMMAND_STARTED", time.monotonic() - 1000.0)  # imported long ago
    before = time.monotonic()
    assert cli.main(["train", "--env", "CartPole-v1"]) == 0
    assert seen and seen[0] >= before
    monkeypatch.setattr(sys, "argv", ["seedq", "train", "--env", "CartPole-v1"])
    assert cli.main() == 0  # the process's own command counts from the import
    assert seen[1] == cli.COMMAND_STARTED


def test_help_shows_the_given_envs_env_dependent_defaults(capsys):
    """`--target-return` of CartPole-v1 is its reward_threshold (475), and `--env X --help`
    shows X's defaults, not CartPole's."""
    from seedq.envs import run_defaults
    from seedq.flags import format_default

    def flag_help(out: str, flag: str) -> str:
        return " ".join(out.split()).split(f" {flag} ", 1)[1].split(" --", 1)[0]

    code, out, _ = run_cli(["train", "--help"], capsys)
    line = flag_help(out, "--target-return")
    assert code == 0 and f"(default: {format_default(run_defaults('CartPole-v1').target_return)} for CartPole-v1" in line
    code, out, _ = run_cli(["train", "--env", "Pendulum-v1", "--help", "vtrace"], capsys)
    pendulum, cartpole = run_defaults("Pendulum-v1").vtrace, run_defaults("CartPole-v1").vtrace
    assert pendulum.learning_rate != cartpole.learning_rate  # Box actions: a default that differs
    line = flag_help(out, "--vtrace.learning-rate")
    assert f"(default: {format_default(pendulum.learning_rate)} for Pendulum-v1" in line, line
