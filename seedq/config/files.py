"""A run config to and from JSON (config.json, checkpoints, --config files)."""

from __future__ import annotations

import dataclasses
import json
import typing
from typing import Any

from seedq.process import atomic_files
from seedq.config.layout import LAYOUT_KEY, migrated, with_layout
from seedq.config.run import TrainConfig


def to_dict(config: Any) -> dict:
    return dataclasses.asdict(config)


def dotted_fields(data: dict, prefix: str = "") -> dict:
    """A (nested) config dict as {"section.field": value}: {"a": {"b": 1}} -> {"a.b": 1}."""
    out = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out.update(dotted_fields(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out


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
        raise ValueError(f"{where.rstrip('.') or 'config'}: expected a mapping of fields, got {type(data).__name__}")
    cls = type(config)
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        import difflib

        close = difflib.get_close_matches(unknown[0], sorted(names), n=2)
        hint = f" (did you mean {' or '.join(where + c for c in close)}?)" if close else ""
        raise ValueError(
            f"unknown field(s) {', '.join(where + k for k in unknown)}{hint}; "
            f"valid{' in ' + where.rstrip('.') if where else ''}: {', '.join(sorted(names))}"
        )
    changes = {}
    for name, value in data.items():
        hint = hints[name]
        if dataclasses.is_dataclass(hint):
            changes[name] = updated(getattr(config, name), value, f"{where}{name}.")
        else:
            changes[name] = typed_value(value, hint, where + name)
    return dataclasses.replace(config, **changes)


def _type_name(hint) -> str:
    args = typing.get_args(hint)
    if typing.get_origin(hint) is tuple:
        return f"a list of {args[0].__name__}"
    if type(None) in args:
        return f"{next(a for a in args if a is not type(None)).__name__} or null"
    return hint.__name__


def typed_value(value: Any, hint, name: str) -> Any:
    """`value` (from a JSON or YAML file) as the field `name` of type `hint`
    holds it; ValueError naming the field and the expected type otherwise.
    Ints pass for floats; bools are not ints here (`true` for a count is a mistake)."""
    args = typing.get_args(hint)
    if type(None) in args:  # Optional[T]
        inner = next(a for a in args if a is not type(None))
        return None if value is None else typed_value(value, inner, name)
    if typing.get_origin(hint) is tuple:
        if isinstance(value, (list, tuple)):
            try:
                return tuple(typed_value(v, args[0], name) for v in value)
            except ValueError:
                pass
    elif hint is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    elif hint is float and isinstance(value, str):
        # PyYAML reads YAML 1.1, where `3e-4` (no dot) is a string, not a float.
        try:
            return float(value)
        except ValueError:
            pass
    elif isinstance(value, hint) and not (hint is int and isinstance(value, bool)):
        return value
    raise ValueError(f"{name}: expected {_type_name(hint)}, got {value!r}")


def _parse(path: str, text: str) -> Any:
    """A config file's content: YAML for .yaml/.yml, JSON otherwise."""
    if path.endswith((".yaml", ".yml")):
        import yaml

        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ValueError(f"{path}: not valid YAML ({' '.join(str(e).split())})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None


def read_json(path: str) -> dict:
    """The fields in a run config file (JSON, or YAML by its .yaml/.yml
    suffix): a run's config.json (it records its layout) migrated to this
    code's layout, a file of some fields written by hand as it is. ValueError
    with a one-line message, a missing or unreadable file included (a usage error)."""
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: cannot be read ({e})") from None
    data = _parse(path, text)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of config fields")
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
