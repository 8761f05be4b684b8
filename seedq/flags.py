"""Config dataclasses <-> command-line flags, in both directions.

Every field of `seedq.config.TrainConfig` is a flag `--field-name`, nested
sections are `--section.field-name` (`add_config_flags`); parsed flags are
applied to a base config (`config_from_args`), and a config is turned back
into the flags that reproduce it (`config_flags`: launchers, local mode and
the comparisons start processes with them). Help texts are the comments
above each field in `seedq/config/` (`field_comments`).

A leaf module (config and the standard library; the env registry only to
resolve per-env defaults), so the CLI, local mode, the launchers, the docs
generator and the benchmarks all share it without importing each other.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import io
import textwrap
import tokenize
import types
import typing

from seedq import config as config_lib
from seedq.config import TrainConfig
from seedq.config.resolve import Layer


def flag_name(prefix: str, name: str) -> str:
    """`--section.field-name` for a config field."""
    return "--" + prefix + name.replace("_", "-").rstrip("-")


# An optional field's flag spells "no value" as `none`; it parses to this
# sentinel, since None itself means "flag not given". (An object of its own,
# never a string: a str field's value "none" is a real value.)
NONE_WORD = "none"


class _NoneGiven:
    def __repr__(self) -> str:
        return NONE_WORD


NONE_GIVEN = _NoneGiven()


def parser_for(hint):
    """The argparse `type` that parses a config field of type `hint`."""
    inner = optional_inner(hint)
    if inner is not None:
        parse_inner = parser_for(inner)

        def parse_optional(text: str):
            return NONE_GIVEN if text.lower() == NONE_WORD else parse_inner(text)

        parse_optional.__name__ = inner.__name__  # argparse names the type in its errors
        return parse_optional
    if typing.get_origin(hint) is tuple:
        (inner, _) = typing.get_args(hint)

        def parse_tuple(text: str):
            try:
                return tuple(inner(x) for x in text.split(",") if x.strip())
            except ValueError:
                raise argparse.ArgumentTypeError(
                    f"expected comma-separated {inner.__name__}s, got {text!r}"
                ) from None

        return parse_tuple
    if hint is bool:
        def parse_bool(text: str) -> bool:
            value = {"true": True, "1": True, "false": False, "0": False}.get(text.lower())
            if value is None:
                raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
            return value

        return parse_bool
    return hint


def metavar(hint) -> str:
    inner = optional_inner(hint)
    if inner is not None:
        return f"{inner.__name__.upper()}|none"
    return hint.__name__.upper() if isinstance(hint, type) else "LIST"


@functools.lru_cache(maxsize=None)
def field_comments(cls) -> dict[str, str]:
    """{field name: its comment} for a dataclass: the comment block right above
    the field plus a comment at the end of its line, joined into one sentence;
    an inherited field's from the class that declares it.
    (Cached: the CLI asks for every field of every section.)"""
    out = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass):
            out.update(_declared_field_comments(klass))
    return out


def _declared_field_comments(cls) -> dict[str, str]:
    """`field_comments` of the fields declared in `cls`'s own body."""
    lines, _ = inspect.getsourcelines(cls)
    source = textwrap.dedent("".join(lines))
    inline: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            inline[tok.start[0]] = tok.string.lstrip("#").strip()
    src_lines = source.splitlines()
    out = {}
    (node,) = [n for n in ast.parse(source).body if isinstance(n, ast.ClassDef)]
    for stmt in node.body:
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        above = []
        lineno = stmt.lineno - 1  # 1-based line above the field
        while lineno >= 1 and src_lines[lineno - 1].strip().startswith("#"):
            above.insert(0, src_lines[lineno - 1].strip().lstrip("#").strip())
            lineno -= 1
        parts = [" ".join(above)] if above else []
        if stmt.end_lineno in inline and not src_lines[stmt.end_lineno - 1].strip().startswith("#"):
            parts.append(inline[stmt.end_lineno])
        out[stmt.target.id] = " ".join(p for p in parts if p)
    return out


def format_default(value) -> str:
    """A default as it is written on the command line."""
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return value if value else '""'
    if value is None:
        return "none"
    return repr(value)


def optional_inner(hint):
    """T for Optional[T], else None."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and len(args) == 2 and type(None) in args:
        return next(a for a in args if a is not type(None))
    return None


# The everyday flags: `seedq train --help` shows these (with the command's own
# --config, --resume, ...); every other field is listed per section.
COMMON_FIELDS = (
    "agent", "env", "seed", "num_actors", "envs_per_actor", "max_frames", "max_seconds", "target_return",
    "logdir", "precision", "deterministic",
)

# The help's group of the top-level fields that are not common.
RUN_SECTION = "run"


def field_choices() -> dict[str, tuple[str, ...]]:
    """{dotted field name: its choices} for the config's string fields that take one of a few words."""
    c = config_lib
    return {
        "agent": c.AGENTS, "architecture": c.ARCHITECTURES, "precision": c.PRECISIONS,
        "actor_precision": c.ACTOR_PRECISIONS, "server.batching": c.BATCHING_RULES,
        "server.queue_full": c.QUEUE_FULL_RULES, "vtrace.layer_norm": c.LAYER_NORM_MODES,
        "vtrace.network": c.NETWORK_CHOICES, "r2d2.network": c.NETWORK_CHOICES,
    }


@functools.lru_cache(maxsize=None)
def env_dependent_fields() -> frozenset[str]:
    """Dotted names of the fields whose default depends on the env (its target
    return, Box actions, pixel frames: config.defaults_for)."""
    variants = [config_lib.dotted_fields(config_lib.to_dict(config_lib.defaults_for(box, None, pixels)))
                for box, pixels in ((False, False), (True, False), (False, True))]
    changing = {k for k in variants[0] if len({repr(v[k]) for v in variants}) > 1}
    return frozenset(changing | {"target_return"})


def section_summary(cls) -> str:
    """The first sentence of a config section's docstring (its help group's description)."""
    doc = " ".join((inspect.getdoc(cls) or "").split())
    return doc.split(". ")[0].rstrip(".")


def _help_text(cls, field, dotted: str, defaults: TrainConfig | None = None, env_id: str = "") -> str:
    """A flag's help: its comment and default. An env-dependent default is the
    one of `defaults` (the env `env_id`'s: seedq.envs.run_defaults) where given."""
    comment = field_comments(cls).get(field.name, "")
    if dotted in env_dependent_fields():
        if defaults is None:
            default = "env-dependent; see --print-config --env ENV"
        else:
            value = functools.reduce(getattr, dotted.split("."), defaults)
            default = f"{format_default(value)} for {env_id}, env-dependent; see --print-config --env ENV"
    else:
        default = format_default(field.default)
    return (f"{comment} " if comment else "").replace("%", "%%") + f"(default: {default})"


def show_env_defaults(parser: argparse.ArgumentParser, env_id: str) -> None:
    """Rewrites the help of `parser`'s env-dependent flags with `env_id`'s
    defaults (done when help is printed: resolving them builds the env)."""
    dependent = [a for a in parser._actions if getattr(a, "doc_class", None) and a.dest in env_dependent_fields()]
    if not dependent:
        return
    from seedq.envs import run_defaults  # (gymnasium: only when help is printed)

    defaults = run_defaults(env_id)
    for action in dependent:
        field = next(f for f in dataclasses.fields(action.doc_class) if f.name == action.dest.rsplit(".", 1)[-1])
        action.help = _help_text(action.doc_class, field, action.dest, defaults, env_id)


def help_group(parser: argparse.ArgumentParser, name: str, description: str | None = None):
    """The argument group `name` of `parser` (created on first use): `--help
    SECTION` shows one group (seedq.cli.common.SectionHelp)."""
    groups = parser.__dict__.setdefault("help_sections", {})
    if name not in groups:
        groups[name] = parser.add_argument_group(name, description)
    return groups[name]


def add_config_flags(parser: argparse.ArgumentParser, cls=TrainConfig, prefix: str = "") -> None:
    """One flag per field of `cls` (sections nested as `--section.field`), each
    in the help group of its section; a TrainConfig's everyday fields in the
    group `common`."""
    hints = typing.get_type_hints(cls)
    choices = field_choices()
    for field in dataclasses.fields(cls):
        hint = hints[field.name]
        dotted = prefix + field.name
        if dataclasses.is_dataclass(hint):
            help_group(parser, dotted, section_summary(hint))
            add_config_flags(parser, hint, dotted + ".")
            continue
        if cls is TrainConfig:
            group = help_group(parser, "common" if dotted in COMMON_FIELDS else RUN_SECTION,
                               None if dotted in COMMON_FIELDS else section_summary(TrainConfig))
        else:
            group = help_group(parser, prefix.rstrip(".") or "options") if prefix else parser
        # A bare boolean flag (`--insecure`) means true; `--flag false` still works.
        bare = {"nargs": "?", "const": True} if hint is bool else {}
        action = group.add_argument(
            flag_name(prefix, field.name),
            dest=dotted,
            type=parser_for(hint),
            default=None,
            choices=choices.get(dotted),
            **bare,
            metavar=None if dotted in choices else metavar(hint),
            help=_help_text(cls, field, dotted),
        )
        action.doc_default = field.default  # for the generated CLI reference
        action.doc_class = cls


def given_fields(args: argparse.Namespace, cls=TrainConfig, prefix: str = "") -> dict:
    """The config fields set by the flags given in `args`, nested by section
    (`none` as None); sections with no flag given are left out."""
    hints = typing.get_type_hints(cls)
    fields = {}
    for field in dataclasses.fields(cls):
        hint = hints[field.name]
        if dataclasses.is_dataclass(hint):
            section = given_fields(args, hint, prefix + field.name + ".")
            if section:
                fields[field.name] = section
            continue
        value = getattr(args, prefix + field.name, None)
        if value is not None:
            fields[field.name] = None if value is NONE_GIVEN else value
    return fields


def flag_layer(args: argparse.Namespace) -> Layer:
    """The flags given, as a layer of the run's config (seedq.config.resolve)."""
    return Layer(given_fields(args))


def config_from_args(args: argparse.Namespace, cls=TrainConfig, prefix: str = "", base=None):
    """The config `base` (default: `cls()`) with the flags given in `args` applied."""
    base = cls() if base is None else base
    hints = typing.get_type_hints(cls)
    overrides = {}
    for field in dataclasses.fields(cls):
        hint = hints[field.name]
        if dataclasses.is_dataclass(hint):
            overrides[field.name] = config_from_args(
                args, hint, prefix + field.name + ".", getattr(base, field.name)
            )
            continue
        value = getattr(args, prefix + field.name, None)
        if value is not None:
            overrides[field.name] = None if value is NONE_GIVEN else value
    return dataclasses.replace(base, **overrides)


def config_flags(config, base=None, prefix: str = "") -> list[str]:
    """The flags that turn `base` into `config` (inverse of `config_from_args`).

    `base` is a config, or a config dataclass (its defaults). It defaults, for
    a TrainConfig, to the defaults `seedq train` applies flags to for
    `config.env` (seedq.envs.run_defaults), so the flags reproduce `config` in a fresh
    process; for a section, to that section's defaults."""
    if base is None:
        from seedq.envs import run_defaults  # (gymnasium: only where a config is turned into flags)

        base = run_defaults(config.env) if isinstance(config, TrainConfig) else type(config)()
    elif isinstance(base, type):
        base = base()
    flags = []
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if dataclasses.is_dataclass(value):
            flags += config_flags(value, getattr(base, field.name), prefix + field.name + ".")
        elif value != getattr(base, field.name):
            if isinstance(value, tuple):
                text = ",".join(str(v) for v in value)
            elif isinstance(value, bool):
                text = str(value).lower()
            elif value is None:
                text = NONE_WORD
            else:
                text = str(value)
            flags += [flag_name(prefix, field.name), text]
    return flags
