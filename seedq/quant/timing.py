"""Timing jitted functions side by side on a shared machine (the int8 choices' measurements)."""

from __future__ import annotations

import time
from typing import Callable

import jax


def time_interleaved(fns: dict[str, Callable], args: tuple, budget_s: float = 0.25,
                     rounds: int = 5, statistic: Callable = min) -> dict[str, float]:
    """Seconds per call of each (already compiled) function: `statistic` (best
    by default; the int8 plan uses the median) over interleaved rounds.

    Each round runs every function in turn, so load changes hit all of them
    alike; the number of calls per round is sized to spend ~budget_s total.
    """
    single = {}
    for name, f in fns.items():
        started = time.perf_counter()
        jax.block_until_ready(f(*args))
        single[name] = max(time.perf_counter() - started, 1e-6)
    per_round = budget_s / rounds
    calls = {name: max(1, int(per_round / len(fns) / t)) for name, t in single.items()}
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, f in fns.items():
            started = time.perf_counter()
            for _ in range(calls[name]):
                out = f(*args)
            jax.block_until_ready(out)
            samples[name].append((time.perf_counter() - started) / calls[name])
    return {name: float(statistic(s)) for name, s in samples.items()}
