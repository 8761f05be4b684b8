"""An R2D2 replay that cannot fit in this machine's memory is refused at
start-up in one line naming the setting and what fits, instead of being
killed for memory once it fills, hours into the run."""

import numpy as np
import pytest

from seedq import replay, schema
from seedq.agents import make_agent
from seedq.config import R2D2Config, TrainConfig
from seedq.envs import env_spec
from seedq.server.unrolls import UnrollQueue

pytestmark = pytest.mark.unit


def test_a_replay_larger_than_the_memory_available_is_one_line_naming_what_fits():
    with pytest.raises(ValueError) as e:
        replay.check_replay_fits(20_000, 269_000, 2, available=8 * 10**9)
    message = str(e.value)
    assert "\n" not in message and message.startswith("r2d2.replay_capacity=20000: ")
    assert "10.8 GB" in message and "at most 14869 fit" in message  # 8e9 // (269e3 * 2)
    replay.check_replay_fits(14_869, 269_000, 2, available=8 * 10**9)  # what it names fits
    replay.check_replay_fits(10**9, 10**9, 2, available=None)  # unknown memory: no refusal


def test_the_memory_available_is_read_from_this_machine_and_capped_by_the_container(monkeypatch, tmp_path):
    from seedq.process import host_memory

    available = host_memory.memory_available_bytes()
    assert available is not None and 0 < available <= host_memory.memory_bytes()
    limit = tmp_path / "memory.max"
    limit.write_text("1048576\n")  # a container limited to 1 MiB: MemAvailable counts the host's
    monkeypatch.setattr(host_memory, "CGROUP_LIMIT", str(limit))
    assert host_memory.memory_available_bytes() == host_memory.memory_bytes() == 1 << 20


def test_the_r2d2_agent_checks_its_replay_and_its_checkpoint_copy_before_allocating(monkeypatch):
    spec = env_spec("CartPole-v1")
    config = TrainConfig(env="CartPole-v1", agent="r2d2", r2d2=R2D2Config(replay_capacity=1000))
    agent = make_agent(config, spec)
    seen = {}

    def fake_check(capacity, sequence_bytes, copies, available):
        seen.update(capacity=capacity, sequence_bytes=sequence_bytes, copies=copies)
        raise ValueError("refused")

    monkeypatch.setattr("seedq.agents.r2d2.agent.check_replay_fits", fake_check)
    with pytest.raises(ValueError, match="refused"):
        agent.make_batch_source(UnrollQueue(16))
    stored = schema.stored_sequence_shapes(agent, spec)
    assert seen == {"capacity": 1000, "copies": 2, "sequence_bytes": sum(
        int(np.prod(s.shape)) * np.dtype(s.dtype).itemsize for s in stored.values())}


def test_seedq_train_refuses_an_oversized_replay_before_any_actor_starts(monkeypatch, tmp_path):
    from seedq import local

    spawned = []
    monkeypatch.setattr(local, "spawn_actors", lambda *a, **k: spawned.append(a) or [])
    monkeypatch.setattr("seedq.agents.r2d2.agent.memory_available_bytes", lambda: 10**6)
    config = TrainConfig(env="CartPole-v1", agent="r2d2", logdir=str(tmp_path / "run"),
                         r2d2=R2D2Config(replay_capacity=1000))
    with pytest.raises(ValueError, match="r2d2.replay_capacity=1000"):
        local.train(config, quiet=True)
    assert spawned == []
    assert not (tmp_path / "run").exists()  # nothing written for a run that never started
