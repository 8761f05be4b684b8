"""The acting core: one implementation of "act on a batch of env steps and
book it", shared by the SEED server, the IMPALA actor and evaluation.

For a set of env *slots* (indices into per-env arrays) the core keeps:
  * each env's recurrent core state between steps (empty for MLPs) and the
    per-env constants `act` reads (R2D2's epsilons);
  * episode book-keeping (`EpisodeTracker`): which step starts an episode,
    running returns and lengths, the episodes that ended;
  * optionally the unroll store (`seedq.rollout.store.UnrollStore`) that
    cuts each env's steps into training sequences, with the step record
    defined once in `seedq.schema`; training rewards are clipped here and
    nowhere else (`reward_clip`).

`ActingCore.step` runs the agent's `act` at the inference precision
(`seedq.quant.mode.InferencePrecision`), jitted, optionally padded to a fixed
batch size (so a server never recompiles in steady state). The SEED server
is batching across actor streams plus this core; an IMPALA actor is this core
on its own envs plus a stream of unrolls; evaluation is this core without a
store, acting greedily.
"""

from __future__ import annotations

import dataclasses
import logging
import time

import jax
import numpy as np

from seedq import schema
from seedq.rollout.store import UnrollStore

log = logging.getLogger("seedq.rollout")


def training_reward_clip(config) -> float:
    """The bound training rewards are clipped to (0: none), for a TrainConfig:
    the agent section's `reward_clip` when set, else [-1, 1] on Atari with
    `atari.clip_rewards` (the DQN/IMPALA convention). Reported returns are
    always the unclipped ones."""
    from seedq.envs import env_kind

    if config.agent_section.reward_clip > 0:
        return float(config.agent_section.reward_clip)
    return 1.0 if env_kind(config.env) == "atari" and config.atari.clip_rewards else 0.0


def pad_rows(x: np.ndarray, size: int, fill=0) -> np.ndarray:
    """`x` with axis 0 padded to `size` rows of `fill` (unchanged if it has as
    many): fixed batch shapes, one compiled program per size; growing tables."""
    if len(x) >= size:
        return x
    out = np.full((size, *x.shape[1:]), fill, x.dtype)
    out[: len(x)] = x
    return out


class EpisodeTracker:
    """Per-slot episode book-keeping: starts, running returns and lengths.

    The step after a terminated or truncated one starts a new episode (the
    vector env auto-reset), as does the first step of a slot after `start`.
    The reward arriving with a first step belongs to no episode (the reset
    step's 0, or nothing at all on connection).
    """

    def __init__(self, capacity: int = 0):
        self.returns = np.zeros(capacity, np.float64)
        self.lengths = np.zeros(capacity, np.int64)
        self.needs_reset = np.ones(capacity, bool)

    def ensure_capacity(self, num_slots: int) -> None:
        if num_slots > len(self.needs_reset):
            size = max(num_slots, 2 * len(self.needs_reset))
            self.returns, self.lengths = pad_rows(self.returns, size), pad_rows(self.lengths, size)
            self.needs_reset = pad_rows(self.needs_reset, size, fill=True)

    def start(self, slots: np.ndarray) -> None:
        """Fresh envs in `slots`: their next step starts an episode."""
        self.needs_reset[slots] = True

    def observe(self, slots, rewards, terminated, truncated):
        """Books one step per slot: (first [n] bool, ended [n] bool, returns [n],
        lengths [n]); returns/lengths are the running ones, final where `ended`."""
        first = self.needs_reset[slots]
        ret = np.where(first, 0.0, self.returns[slots] + rewards)
        length = np.where(first, 0, self.lengths[slots] + 1)
        ended = (terminated | truncated) & ~first
        self.returns[slots] = ret
        self.lengths[slots] = length
        self.needs_reset[slots] = ended
        return first, ended, ret, length


@dataclasses.dataclass
class StepResult:
    """What one `ActingCore.step` did for its n envs."""

    actions: np.ndarray  # [n, *action_shape]
    first: np.ndarray  # [n] bool: the step started an episode
    ended_slots: np.ndarray  # slots whose episode this step ended
    ended_returns: np.ndarray  # their (unclipped) returns
    ended_lengths: np.ndarray  # their lengths
    unrolls: dict | None  # sequences this step completed (store only), else None


@dataclasses.dataclass
class PendingRecord:
    """A step acted on but not yet written to the unroll store (`ActingCore.record`):
    the arguments of `schema.step_record`, for the n envs in `slots`."""

    slots: np.ndarray  # [n]
    obs: np.ndarray
    rewards: np.ndarray  # clipped for training
    terminated: np.ndarray
    truncated: np.ndarray
    first: np.ndarray
    actions: np.ndarray
    version: int
    outputs: dict  # act's outputs, padded rows included (cut to n when recorded)
    core_before: dict


class ActingCore:
    def __init__(self, agent, spec: schema.EnvSpec, precision, *, record: bool = True,
                 reward_clip: float = 0.0, greedy: bool = False, capacity: int = 64,
                 devices=None):
        """`precision`: a `seedq.quant.mode.InferencePrecision` for `agent`.
        `record`: keep an unroll store (training); `greedy`: act with the
        agent's greedy policy (evaluation); `devices`: several inference
        devices to split every batch across (`seedq.devices.sharded_act`)."""
        self.agent = agent
        self.reward_clip = float(reward_clip)
        act = precision.greedy_act if greedy else precision.act
        self.shards = len(devices) if devices else 1
        if self.shards > 1:
            from seedq.devices import sharded_act

            self._act = sharded_act(act, devices)
        else:
            self._act = jax.jit(act)
        self.core = {k: np.asarray(v) for k, v in agent.initial_core_state(capacity).items()}
        self.episodes = EpisodeTracker(capacity)
        self.store = None
        if record:
            fields, initial_only = schema.sequence_fields(agent, spec)
            sequence = agent.sequence_spec()
            self.store = UnrollStore(sequence.length, fields, overlap=sequence.overlap,
                                     initial_only=initial_only, capacity=capacity)
        self._num_slots = -1
        self.ensure_capacity(capacity)
        # CPU seconds of the calling thread inside the jitted policy, its
        # dispatch and the wait for its outputs (`seedq bench ingress` splits
        # the learner's CPU per frame into this and everything else).
        self.compute_cpu_seconds = 0.0

    def warm_up(self, params, rng, obs_example: np.ndarray, size: int):
        """A function that compiles `act`'s program for batches of `size` (a
        call on zeros; no table is read or written by it, so another thread
        may run it while this one serves). The arrays are made here."""
        obs = np.zeros((size, *obs_example.shape[1:]), obs_example.dtype)
        first = np.ones(size, bool)
        core = {k: np.zeros((size, *v.shape[1:]), v.dtype) for k, v in self.core.items()}
        inputs = {k: np.zeros((size, *v.shape[1:]), v.dtype) for k, v in self.inputs.items()}

        def compile_program() -> None:
            jax.block_until_ready(self._act(params, rng, obs, first, core, inputs))

        return compile_program

    @property
    def compiles(self) -> int:
        """Programs compiled so far (one per padded batch size)."""
        return self._act._cache_size()

    def ensure_capacity(self, num_slots: int) -> None:
        """Makes slots [0, num_slots) exist (arrays grow by doubling)."""
        for name, table in self.core.items():
            if len(table) < num_slots:
                self.core[name] = pad_rows(table, max(num_slots, 2 * len(table)))
        self.episodes.ensure_capacity(num_slots)
        if self.store is not None:
            self.store.ensure_capacity(num_slots)
        if num_slots != self._num_slots:  # per-slot constants of `act`, and which slots are recorded
            self._num_slots, slots = num_slots, np.arange(num_slots)
            self.inputs = self.agent.actor_inputs(slots)
            store_mask = self.agent.store_mask(slots)  # False: not recorded (R2D2's eval envs)
            self.store_mask = None if store_mask is None else np.asarray(store_mask, bool)
            report_mask = self.agent.report_mask(slots)  # False: not in the run's return
            self.report_mask = None if report_mask is None else np.asarray(report_mask, bool)

    def reported_episodes(self, result: StepResult) -> tuple[np.ndarray, np.ndarray]:
        """(returns, lengths) of the episodes `result` ended that count in the run's return."""
        if self.report_mask is None:
            return result.ended_returns, result.ended_lengths
        keep = self.report_mask[result.ended_slots]
        return result.ended_returns[keep], result.ended_lengths[keep]

    def start(self, slots: np.ndarray) -> None:
        """Fresh envs in `slots` (a connected actor's block): episodes restart
        there and no partial unroll is inherited."""
        self.episodes.start(slots)
        self.drop(slots)

    def drop(self, slots: np.ndarray) -> int:
        """Forgets the partial unrolls of `slots`; returns the env steps lost."""
        return self.store.drop(slots) if self.store is not None else 0

    def padded_size(self, n: int, pad_to: int | None = None) -> int:
        """The batch size `act` runs n envs at: `pad_to` (at least n), rounded up
        to a multiple of the inference devices so they split it evenly."""
        return -(-max(pad_to or n, n) // self.shards) * self.shards

    def step(self, params, version: int, rng, slots, obs, rewards, terminated, truncated,
             *, pad_to: int | None = None):
        """Acts on one step of the envs in `slots` (unique) and books it.

        Returns (StepResult, new rng). `params`: published at the core's
        precision; `version`: their policy version (recorded per step).
        """
        result, rng, pending = self.act(params, version, rng, slots, obs, rewards, terminated, truncated,
                                        pad_to=pad_to)
        result.unrolls = self.record(pending)
        return result, rng

    def act(self, params, version: int, rng, slots, obs, rewards, terminated, truncated,
            *, pad_to: int | None = None, max_rows: int | None = None):
        """`step` up to the actions: books the episodes and the recurrent state,
        and returns (StepResult without unrolls, new rng, PendingRecord or None).
        `record(pending)` must follow before the next `act` on any of these
        slots; the server answers its actors in between. `max_rows`: more
        envs than this run in chunks of `pad_to` rows, so the set of compiled
        batch sizes stays the one fixed in advance however large a request."""
        n = len(slots)
        first, ended, returns, lengths = self.episodes.observe(slots, rewards, terminated, truncated)
        core_before = {name: table[slots] for name, table in self.core.items()}
        inputs = {k: v[slots] for k, v in self.inputs.items()}
        chunk = n if not max_rows or n <= max_rows else max_rows
        computing = time.thread_time()
        parts = []
        for start in range(0, n, chunk):
            rows = slice(start, min(n, start + chunk))
            m = rows.stop - rows.start
            size = self.padded_size(m, pad_to if chunk == n else max_rows)
            actions, outputs, new_core, rng = self._act(
                params, rng, pad_rows(obs[rows], size), pad_rows(first[rows], size, fill=True),
                {k: pad_rows(v[rows], size) for k, v in core_before.items()},
                {k: pad_rows(v[rows], size) for k, v in inputs.items()},
            )
            parts.append((actions, outputs, new_core, m))
        if len(parts) == 1:  # the usual case: outputs stay on the device until `record`
            actions, outputs, new_core, _ = parts[0]
            actions = np.asarray(actions)[:n]
            new_core = {k: np.asarray(v)[:n] for k, v in new_core.items()}
        else:
            actions = np.concatenate([np.asarray(p[0])[:p[3]] for p in parts])
            outputs = {k: np.concatenate([np.asarray(p[1][k])[:p[3]] for p in parts]) for k in parts[0][1]}
            new_core = {k: np.concatenate([np.asarray(p[2][k])[:p[3]] for p in parts]) for k in parts[0][2]}
        self.compute_cpu_seconds += time.thread_time() - computing
        for name, table in self.core.items():
            table[slots] = new_core[name]
        result = StepResult(actions, first, slots[ended], returns[ended], lengths[ended], None)
        if self.store is None:
            return result, rng, None
        if self.reward_clip > 0:
            rewards = np.clip(rewards, -self.reward_clip, self.reward_clip)
        pending = PendingRecord(slots, obs, rewards, terminated, truncated, first, actions, version,
                                outputs, core_before)
        return result, rng, pending

    def record(self, pending: PendingRecord | None) -> dict | None:
        """Writes an acted step into the unroll store; returns the sequences it
        completed (name -> [k, length, ...]) or None."""
        if pending is None:
            return None
        p, slots = pending, pending.slots
        step = schema.step_record(
            p.obs, p.rewards, p.terminated, p.truncated, p.first, p.actions, p.version,
            {k: np.asarray(v)[: len(slots)] for k, v in p.outputs.items()}, p.core_before,
        )
        if self.store_mask is not None and not self.store_mask[slots].all():
            keep = self.store_mask[slots]
            slots, step = slots[keep], {k: v[keep] for k, v in step.items()}
        return self.store.append(slots, step) if len(slots) else None
