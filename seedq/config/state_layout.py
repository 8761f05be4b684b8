"""The layout of a checkpoint's learner state (its `state` item, as nested
dicts: `seedq.checkpoint`), and the migration of states saved in an older
layout, as `layout` does for configs.

A checkpoint's meta records `state_layout`. It goes up by one with every
change to what the agents store (an optimiser state of another shape, a
renamed parameter) after which a saved state would not restore into the
state this code builds. To bump it: raise STATE_LAYOUT_VERSION and add one
step to MIGRATIONS that turns a state tree of the layout before into one of
the new layout. A step takes the tree as `seedq.checkpoint` reads it: either
the arrays themselves or orbax's metadata of them (shape and dtype), so it
must only move, drop or copy entries, never compute values.
"""

from __future__ import annotations

from typing import Callable

from seedq.config.layout import check_layout_number

STATE_LAYOUT_VERSION = 1
STATE_LAYOUT_KEY = "state_layout"


def _without_schedule_count(tree: dict) -> dict:
    """Layout 0 (unrecorded) -> 1. V-trace put an annealed learning rate into
    Adam as an optax schedule, which kept its own count of updates (opt_state
    1/1 {"count"}, the learner's step by another name); now the rate follows
    the learner's step in both agents (seedq.agents.optimizer) and that entry
    is empty, as R2D2's and a constant-rate V-trace's always were."""
    learner = tree.get("learner")
    opt_state = learner.get("opt_state") if isinstance(learner, dict) else None
    adam = opt_state.get("1") if isinstance(opt_state, dict) else None
    rate = adam.get("1") if isinstance(adam, dict) else None
    if not (isinstance(rate, dict) and "count" in rate):
        return tree
    opt_state = {**opt_state, "1": {**adam, "1": {}}}
    return {**tree, "learner": {**learner, "opt_state": opt_state}}


# MIGRATIONS[n] turns a state tree saved in layout n into one of layout n + 1.
MIGRATIONS: dict[int, Callable[[dict], dict]] = {0: _without_schedule_count}


def saved_state_layout(meta: dict) -> int:
    """The state layout a checkpoint's meta records (0: from before it was recorded)."""
    return meta.get(STATE_LAYOUT_KEY, 0)


def migrated_state(tree: dict, version: int) -> dict:
    """A saved state tree of layout `version` in this code's layout; ValueError
    in one line for a layout it cannot take."""
    check_layout_number(STATE_LAYOUT_KEY, version, STATE_LAYOUT_VERSION, "learner state layout")
    for step in range(version, STATE_LAYOUT_VERSION):
        tree = MIGRATIONS[step](tree)
    return tree
