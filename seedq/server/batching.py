"""Which rule the dynamic batcher follows: wait for the streams, or take what is queued.

`wait`: once a request is queued, the batcher waits (up to
`server.batch_timeout_ms`) for every stream its previous batch answered, so
all actors share one inference call. `greedy`: it runs whatever is queued at
once; requests that arrive meanwhile form the next batch.

Neither wins everywhere (docs/benchmarks.md). Waiting runs the
fewest, largest batches, which pays when CPU time is short: many small
actors on few cores, or a training thread that needs the cores. But it also
puts all actors in lockstep: the learner idles while every actor steps and
every actor idles while the learner infers. Greedy batching lets the actors
drift out of phase, so the learner infers for one while another steps; with
2 actors x 32 CartPole envs and spare cores that served 1.33x the env steps.

`auto` (the default) therefore measures: after a warm-up it alternates the
two rules over short windows, keeps the one that served more env steps per
second (the median of its windows; `wait` on a tie), and measures again
after a while or when the number of connected streams changes. Nothing is
hand-tuned per machine; this is the same "measure at start-up, then fix"
choice as the int8 layer plan (seedq.quant.plan), repeated because load
changes during a run.
"""

from __future__ import annotations

import dataclasses
import statistics

from seedq.config import check_batching_rule

WAIT, GREEDY = "wait", "greedy"


@dataclasses.dataclass(frozen=True)
class TrialSchedule:
    """How `auto` measures: `rounds` windows of `window_seconds` per rule,
    alternating, after `warmup_seconds` of traffic; again `hold_seconds`
    after each choice, or `warmup_seconds` after the stream count changed."""

    warmup_seconds: float = 2.0
    window_seconds: float = 1.0
    rounds: int = 3
    hold_seconds: float = 60.0


class BatchingRule:
    """The batcher's rule at each batch. `rule`: one of config.BATCHING_RULES.

    `current(now, env_steps, streams)` is called once per batch with the
    clock (seconds), the env steps served so far and the connected streams;
    it returns WAIT or GREEDY. Plain attributes, read by other threads
    (`choice`, `trials`, `last_rates`)."""

    def __init__(self, rule: str = "auto", schedule: TrialSchedule = TrialSchedule()):
        check_batching_rule(rule)
        self.rule = rule
        self.schedule = schedule
        # The rule in force outside trials (auto: WAIT until the first trial ends).
        self.choice = GREEDY if rule == GREEDY else WAIT
        self.trials = 0  # finished measurements
        # Env steps per second of each rule's windows in the latest trial.
        self.last_rates: dict[str, list[float]] = {}
        self._streams = None
        # When the next measurement starts: a warm-up after the first traffic or
        # a change of the stream count, a hold after each choice.
        self._next_trial_at = 0.0
        self._windows: list[str] = []  # rules of the trial's windows still to run
        self._window: tuple[str, float, int] | None = None  # (rule, started, env steps at start)
        self._rates: dict[str, list[float]] = {}

    def current(self, now: float, env_steps: int, streams: int) -> str:
        if self.rule != "auto":
            return self.choice
        if streams != self._streams:  # actors came or went: the old figures no longer apply
            self._streams = streams
            self._window, self._windows = None, []
            self._next_trial_at = now + self.schedule.warmup_seconds
        if self._window is not None:
            rule, started, steps = self._window
            if now - started < self.schedule.window_seconds:
                return rule
            self._rates[rule].append((env_steps - steps) / (now - started))
            self._window = None
            if not self._windows:
                self._decide(now)
                return self.choice
        elif not self._windows:
            if now < self._next_trial_at:
                return self.choice
            self._windows = [WAIT, GREEDY] * self.schedule.rounds
            self._rates = {WAIT: [], GREEDY: []}
        rule = self._windows.pop(0)
        self._window = (rule, now, env_steps)
        return rule

    def _decide(self, now: float) -> None:
        wait, greedy = (statistics.median(self._rates[r]) for r in (WAIT, GREEDY))
        self.choice = GREEDY if greedy > wait else WAIT
        self.last_rates = self._rates
        self.trials += 1
        self._next_trial_at = now + self.schedule.hold_seconds
