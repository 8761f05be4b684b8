"""The layout of a saved run config (config.json, a checkpoint's config), and
the migration of configs saved in an older layout.

A saved config records `layout_version`. It goes up by one with every change
after which a config saved before would mean something else to this code: a
field renamed or removed, or a default changed (a saved config that lacks a
field takes today's default). To bump it: raise LAYOUT_VERSION and add one
step to MIGRATIONS that turns a config of the layout before into one of the
new layout (e.g. fill in the former default where a saved config lacks the
field). A run saved in an older layout then resumes through the steps in
turn; one from a layout that has no step, or from a newer seedq, is refused
in one line.
"""

from __future__ import annotations

from typing import Callable

LAYOUT_VERSION = 1
LAYOUT_KEY = "layout_version"


def _from_unrecorded_layout(data: dict) -> dict:
    """Layout 0 (configs saved before the layout was recorded) -> 1. Their
    V-trace section may lack fields added since; those runs ran with no
    LayerNorm, a constant entropy bonus and targets cut at the unroll's end."""
    vtrace = data.get("vtrace")
    if not isinstance(vtrace, dict):
        return data
    ran_with = {"layer_norm": "none", "anneal_entropy_cost": False, "lookahead": 0, "grow_lookahead": False}
    return {**data, "vtrace": {**ran_with, **vtrace}}


# MIGRATIONS[n] turns a config saved in layout n into one of layout n + 1.
MIGRATIONS: dict[int, Callable[[dict], dict]] = {0: _from_unrecorded_layout}


def with_layout(data: dict) -> dict:
    """A config's fields (`to_dict`) as saved: with this code's layout version."""
    return {**data, LAYOUT_KEY: LAYOUT_VERSION}


def check_layout_number(key: str, version, current: int, what: str) -> None:
    """ValueError in one line unless `version` (the saved `key`) is a layout
    number this code can migrate from: a whole number >= 0, at most `current`.
    Shared by the config's and the learner state's layouts."""
    if not isinstance(version, int) or isinstance(version, bool) or version < 0:
        raise ValueError(f"{key}={version!r}: expected a layout number")
    if version > current:
        raise ValueError(
            f"{what} {version} is newer than this seedq's ({current}): "
            "use the seedq that wrote it, or a newer one"
        )


def migrated(data: dict) -> dict:
    """The fields of a saved config in this code's layout (without the version
    key); ValueError in one line for a layout it cannot take."""
    version = data.get(LAYOUT_KEY, 0)
    check_layout_number(LAYOUT_KEY, version, LAYOUT_VERSION, "config layout")
    fields = {k: v for k, v in data.items() if k != LAYOUT_KEY}
    for step in range(version, LAYOUT_VERSION):
        if step not in MIGRATIONS:
            raise ValueError(
                f"config layout {version} is too old for this seedq (layout {LAYOUT_VERSION}): "
                "use the seedq that wrote it"
            )
        fields = MIGRATIONS[step](fields)
    return fields
