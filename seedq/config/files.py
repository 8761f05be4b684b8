"""A run config to and from JSON (config.json, checkpoints, --config files)."""

from __future__ import annotations

import dataclasses
import json
import typing
from typing import Any

from seedq import atomic_files
from seedq.config.layout import LAYOUT_KEY, migrated, with_layout
from seedq.config.run import TrainConfig


def to_dict(config: Any) -> dict:
    return dataclasses.asdict(config)


def save(config: TrainConfig, path: str) -> None:
    """Writes config.json (with its layout version) whole and durably: `--resume`
    reads it, so a kill or a full disk mid-write must leave the previous file, not a part."""
    atomic_files.write_json_atomically(path, saved_dict(config), indent=2, sort_keys=True)


def from_dict(cls: type, data: dict) -> Any:
    """Builds a (nested) config dataclass from `data`; unknown keys are errors."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(
            f"unknown {cls.__name__} field(s) {', '.join(unknown)}; valid: {', '.join(sorted(names))}"
        )
    kwargs = {}
    for name, value in data.items():
        hint = hints[name]
        if dataclasses.is_dataclass(hint):
            kwargs[name] = from_dict(hint, value)
        elif typing.get_origin(hint) is tuple:
            kwargs[name] = tuple(value)
        else:
            kwargs[name] = value
    return cls(**kwargs)


def updated(config: Any, data: dict, where: str = "") -> Any:
    """`config` with the (possibly partial, nested) fields in `data` replaced;
    an unknown key is a ValueError naming it."""
    if not isinstance(data, dict):
        raise ValueError(f"{where or 'config'}: expected a JSON object, got {type(data).__name__}")
    cls = type(config)
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(
            f"unknown field(s) {', '.join(where + k for k in unknown)}; "
            f"valid{' in ' + where.rstrip('.') if where else ''}: {', '.join(sorted(names))}"
        )
    changes = {}
    for name, value in data.items():
        hint = hints[name]
        if dataclasses.is_dataclass(hint):
            changes[name] = updated(getattr(config, name), value, f"{where}{name}.")
        elif typing.get_origin(hint) is tuple:
            changes[name] = tuple(value)
        else:
            changes[name] = value
    return dataclasses.replace(config, **changes)


def read_json(path: str) -> dict:
    """The fields in a run config file: a run's config.json (it records its
    layout) migrated to this code's layout, a file of some fields written by
    hand as it is. OSError / ValueError with a one-line message."""
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        raise OSError(f"{path}: no such file") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object of config fields")
    if LAYOUT_KEY not in data:
        return data  # some fields, written by hand
    try:
        return migrated(data)  # a run's config.json
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None


def from_saved(data: dict) -> TrainConfig:
    """The TrainConfig of a saved config.json (or a checkpoint's config), migrated
    from the layout it was saved in (seedq.config.layout); ValueError as from_dict."""
    return from_dict(TrainConfig, migrated(data))


def saved_dict(config: TrainConfig) -> dict:
    """`config` as config.json and checkpoints hold it: its fields and the layout version."""
    return with_layout(to_dict(config))


def load(path: str) -> TrainConfig:
    with open(path) as f:
        return from_saved(json.load(f))
