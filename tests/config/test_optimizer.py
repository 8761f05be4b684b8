"""seedq.config.optimizer: the optimizer fields both sections inherit keep
their flags, their names in saved configs, their help and their checks."""

from __future__ import annotations

import json
import pathlib

import pytest

pytestmark = pytest.mark.unit

OPTIMIZER_FIELDS = ("learning_rate", "learning_rate_decay_frames", "adam_eps", "max_grad_norm")


@pytest.mark.parametrize("section", ["vtrace", "r2d2"])
def test_each_sections_optimizer_flags_parse_into_its_own_section(section, capsys):
    from seedq import cli

    other = "r2d2" if section == "vtrace" else "vtrace"
    args = ["train", "--agent", section, "--print-config", f"--{section}.learning-rate", "3e-4",
            f"--{section}.learning-rate-decay-frames", "0", f"--{section}.adam-eps", "1e-5",
            f"--{section}.max-grad-norm", "2.5"]
    assert cli.main(args) == 0
    printed = json.loads(capsys.readouterr().out)
    assert [printed[section][f] for f in OPTIMIZER_FIELDS] == [3e-4, 0, 1e-5, 2.5]
    assert [printed[other][f] for f in OPTIMIZER_FIELDS] == [1e-3, -1, 1e-8, 10.0]


def test_a_config_json_saved_before_the_section_existed_loads_its_optimizer_values():
    """The layout-0 CartPole config.json (tests/data) names the fields as they are now."""
    from seedq import config

    path = pathlib.Path(__file__).parent.parent / "data" / "config_layout0_cartpole.json"
    saved = json.loads(path.read_text())
    saved["vtrace"] = {**saved["vtrace"], "learning_rate": 7e-4, "max_grad_norm": 3.0}
    loaded = config.from_saved(saved)
    assert (loaded.vtrace.learning_rate, loaded.vtrace.max_grad_norm) == (7e-4, 3.0)
    assert [getattr(loaded.r2d2, f) for f in OPTIMIZER_FIELDS] == [saved["r2d2"][f] for f in OPTIMIZER_FIELDS]


def test_inherited_fields_keep_their_help_and_their_checks():
    from seedq.config import R2D2Config, TrainConfig, VTraceConfig
    from seedq.flags import field_comments

    for cls in (VTraceConfig, R2D2Config):
        comments = field_comments(cls)
        assert all(comments[f] for f in OPTIMIZER_FIELDS), cls
        assert "Adam's learning rate" in comments["learning_rate"]
    with pytest.raises(ValueError, match=r"^r2d2\.learning_rate_decay_frames=-2: must be >= 0, or -1"):
        TrainConfig(agent="r2d2", r2d2=R2D2Config(learning_rate_decay_frames=-2)).validate()
    with pytest.raises(ValueError, match=r"^vtrace\.learning_rate=0\.0: must be > 0"):
        VTraceConfig(learning_rate=0.0).validate()
