"""Engine options derived from the config tree: the `LLM(...)` keywords and the CLI flags.

Every leaf field of `EngineConfig` is one option. Its keyword is the field's name, prefixed with
the names of the configs it is nested in below a section (`speculative.draft.model` becomes
`draft_model`; `model.dtype` stays `dtype`); its flag is the keyword with dashes
(`--draft-model`). A field's metadata may adjust that:

- `name`: the keyword (and flag) instead of the derived one;
- `flag`: the CLI flag alone, with `cli_scale`: the CLI value times the scale is the field's value
  (`kv_cache_bytes` is `--kv-cache-mb`);
- `help`: the help text;
- `choices`: the allowed values, a tuple or a function returning them (called only when needed,
  so listing proposers imports none of them).

Names a registry looks up (the attention backend, the speculative method) are plain strings in
the config, which sits below the registries; their choices are attached here (`REGISTRY_CHOICES`).

A new field becomes a keyword and a flag with no change here.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import functools
import os
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import UnionType
from typing import Any

from speculant.attention.registry import available_backends
from speculant.config import EngineConfig, ModelConfig, SpeculativeConfig
from speculant.speculative.registry import available_methods

_SCALARS = (bool, int, float, str)
_PARSE_ORDER = (int, float, str)  # "3" is an int before it is a float or a string


def _attention_backends() -> list[str]:
    return ["auto", *available_backends()]


# (config class, field name) -> the registry's names, asked only when the choices are needed
REGISTRY_CHOICES: dict[tuple[type, str], Callable[[], list[str]]] = {
    (ModelConfig, "attention_backend"): _attention_backends,
    (SpeculativeConfig, "method"): available_methods,
}


@dataclass(frozen=True)
class Option:
    """One user-facing engine option, backed by one leaf field of `EngineConfig`."""

    path: tuple[str, ...]  # field names from EngineConfig down, e.g. ("speculative", "draft", "model")
    name: str  # the LLM keyword
    flag: str  # the CLI flag
    types: tuple[type, ...]  # accepted value types, None aside
    optional: bool  # None is a valid value
    default: Any  # the field's value in a default EngineConfig
    help: str = ""
    cli_scale: int = 1
    choices_from: tuple | Callable[[], list] | None = None

    @property
    def choices(self) -> list | None:
        if self.choices_from is None:
            return None
        return list(self.choices_from() if callable(self.choices_from) else self.choices_from)

    @property
    def is_flag(self) -> bool:
        return self.types == (bool,)

    def check(self, value: Any) -> Any:
        """The value, checked against the field's type and choices; errors name the keyword."""
        if value is None and self.optional:
            return None
        if isinstance(value, os.PathLike) and str in self.types:
            value = os.fspath(value)
        if not any(_is_instance(value, t) for t in self.types):
            expected = " or ".join(t.__name__ for t in self.types) + (" or None" if self.optional else "")
            raise TypeError(f"{self.name} must be {expected}, got {value!r}")
        choices = self.choices
        if choices is not None and value not in choices:
            raise ValueError(f"{self.name} must be one of {choices}, got {value!r}")
        return value

    def parse_cli(self, text: str) -> Any:
        """The field's value for a CLI string: the first of the field's types that parses it."""
        for t in sorted(self.types, key=_PARSE_ORDER.index):
            try:
                value = t(text)
            except ValueError:
                continue
            return value * self.cli_scale if self.cli_scale != 1 else value
        raise argparse.ArgumentTypeError(f"cannot read {text!r} as {' or '.join(t.__name__ for t in self.types)}")


def _is_instance(value: Any, t: type) -> bool:
    if t is int or t is float:  # a bool is not a number here; an int is a valid float
        return isinstance(value, int if t is int else (int, float)) and not isinstance(value, bool)
    return isinstance(value, t)


@functools.cache
def engine_options(root: type = EngineConfig) -> tuple[Option, ...]:
    """Every option of a config tree (`EngineConfig`), in field order; names and flags are unique."""
    options = tuple(_walk(root, root(), (), ()))
    for attr in ("name", "flag"):
        seen: dict[str, Option] = {}
        for opt in options:
            other = seen.setdefault(getattr(opt, attr), opt)
            if other is not opt:
                raise TypeError(f"config fields {'.'.join(other.path)} and {'.'.join(opt.path)} share the {attr} {getattr(opt, attr)!r}")
    return options


def _walk(cls: type, default: Any, path: tuple[str, ...], prefix: tuple[str, ...]):
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        value, hint = getattr(default, f.name), hints[f.name]
        if dataclasses.is_dataclass(hint):
            # sections (the root's fields) add no prefix; deeper configs add their name
            yield from _walk(hint, value, path + (f.name,), prefix + (f.name,) if path else ())
        else:
            yield _option(cls, f, hint, value, path + (f.name,), prefix)


def _option(cls: type, f: dataclasses.Field, hint: Any, default: Any, path: tuple[str, ...], prefix: tuple[str, ...]) -> Option:
    meta: Mapping[str, Any] = f.metadata
    types, choices = _types_of(hint, path)
    name = meta.get("name", "_".join(prefix + (f.name,)))
    return Option(
        path=path,
        name=name,
        flag=meta.get("flag", "--" + name.replace("_", "-")),
        types=tuple(t for t in types if t is not type(None)),
        optional=type(None) in types,
        default=default,
        help=meta.get("help", ""),
        cli_scale=meta.get("cli_scale", 1),
        choices_from=meta.get("choices", REGISTRY_CHOICES.get((cls, f.name), choices)),
    )


def _types_of(hint: Any, path: tuple[str, ...]) -> tuple[tuple[type, ...], tuple | None]:
    """(types, Literal choices) of a field's annotation: scalars, their unions, or a Literal."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Literal:
        return (type(args[0]),), args
    members = args if origin in (typing.Union, UnionType) else (hint,)
    scalars = [t for t in members if t is not type(None)]
    if any(t not in _SCALARS for t in scalars) or (bool in scalars and len(scalars) > 1):
        raise TypeError(
            f"config field {'.'.join(path)}: type {hint} cannot be an option "
            "(use bool, int, float, str, a union of int, float and str, optional or not, or a Literal)"
        )
    return members, None


def build_engine_config(options: Mapping[str, Any], base: Any = None) -> EngineConfig:
    """`base` (default: `EngineConfig()`) with the given options set; None leaves an option that
    does not accept None at its default. Unknown names are a TypeError naming them."""
    base = base if base is not None else EngineConfig()
    by_name = {opt.name: opt for opt in engine_options(type(base))}
    unknown = [k for k in options if k not in by_name]
    if unknown:
        close = difflib.get_close_matches(unknown[0], by_name, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise TypeError(f"unknown engine option {unknown[0]!r}{hint}")
    values = {}
    for key, value in options.items():
        opt = by_name[key]
        if value is not None or opt.optional:
            values[opt.path] = opt.check(value)
    return _replace(base, (), values)


def _replace(config: Any, path: tuple[str, ...], values: dict[tuple[str, ...], Any]) -> Any:
    """`config` with the values under `path` set, inner configs first (their checks run first)."""
    changes = {}
    for f in dataclasses.fields(config):
        sub = path + (f.name,)
        if sub in values:
            changes[f.name] = values[sub]
        elif any(p[: len(sub)] == sub for p in values) and dataclasses.is_dataclass(getattr(config, f.name)):
            changes[f.name] = _replace(getattr(config, f.name), sub, values)
    return dataclasses.replace(config, **changes) if changes else config


def resolve_engine_config(config: EngineConfig | None, options: Mapping[str, Any]) -> EngineConfig:
    """The engine config of `LLM(config=...)` or of `LLM(**options)`; both at once is an error."""
    if config is not None and options:
        raise TypeError(f"pass engine options either as config= or as keywords, not both (got config= and {', '.join(options)})")
    return config if config is not None else build_engine_config(options)


def add_engine_arguments(parser: argparse.ArgumentParser, root: type = EngineConfig) -> None:
    """One flag per engine option; an option not given keeps the config's default."""
    group = parser.add_argument_group("engine options")
    for opt in engine_options(root):
        kwargs: dict[str, Any] = {"dest": opt.name, "default": None, "help": _help(opt)}
        if opt.is_flag:
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs["type"] = opt.parse_cli
            kwargs["choices"] = opt.choices
            kwargs["metavar"] = None if opt.choices else "|".join(t.__name__.upper() for t in opt.types)
        group.add_argument(opt.flag, **kwargs)


def _help(opt: Option) -> str:
    if opt.default is None:
        return opt.help.replace("%", "%%")
    default = opt.default // opt.cli_scale if opt.cli_scale != 1 else opt.default
    return f"{opt.help} (default: {default})".strip().replace("%", "%%")


def engine_config_from_args(args: argparse.Namespace, base: Any = None) -> EngineConfig:
    """The config of parsed CLI arguments (from a parser given `add_engine_arguments`)."""
    base = base if base is not None else EngineConfig()
    options = engine_options(type(base))
    given = {opt.name: getattr(args, opt.name) for opt in options if getattr(args, opt.name, None) is not None}
    return build_engine_config(given, base)
