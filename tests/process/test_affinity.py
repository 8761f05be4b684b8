"""Pinning actors to CPU cores: parsing actor_cores and naming bad ids, a pinned
process's threads, and the local actors started with the config's cores."""

import os
import subprocess
import sys

import pytest

from seedq.config import TrainConfig
from seedq.process.affinity import parse_cores, why_not_pinnable


@pytest.mark.unit
def test_actor_cores_parse_and_bad_ones_are_named():
    assert parse_cores("0,2-3") == {0, 2, 3}
    with pytest.raises(ValueError, match="'x' is not a core id"):
        parse_cores("0,x")
    with pytest.raises(ValueError, match="actor_cores"):
        TrainConfig(actor_cores="3-1").validate()


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this OS")
@pytest.mark.e2e
def test_a_pinned_actor_process_and_its_later_threads_run_on_the_given_core():
    code = (
        "import os, threading\n"
        "from seedq.process.affinity import pin_process\n"
        "assert pin_process('0') is None\n"
        "seen = []\n"
        "t = threading.Thread(target=lambda: seen.append(sorted(os.sched_getaffinity(0))))\n"
        "t.start(); t.join()\n"
        "print(sorted(os.sched_getaffinity(0)), seen[0])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["[0]", "[0]"]
    assert "not available" in why_not_pinnable(str(max(os.sched_getaffinity(0)) + 1))


@pytest.mark.unit
def test_local_actors_are_started_with_the_cores_of_the_config():
    from seedq.local import actor_command

    assert actor_command("unix:/x.sock", TrainConfig(actor_cores="0-1"), 0)[-2:] == ["--cores", "0-1"]
    assert "--cores" not in actor_command("unix:/x.sock", TrainConfig(), 0)
