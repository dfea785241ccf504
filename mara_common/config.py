"""Typed settings: one declaration per setting, checked where it is read.

A config is a dataclass whose fields may be declared with `setting(...)`,
which records the setting's bounds, choices and help text beside its
default. `check_settings` enforces them (call it from `__post_init__`),
`make_config` builds a config from plain values (a profile section, command
line overrides), checking names and types and recursing into nested
configs, and `mara_common.flags` derives command-line flags from the same
fields.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Sequence
from typing import Any, TypeVar

T = TypeVar("T")


class ConfigError(ValueError):
    """A profile, override or input file that does not fit what it is meant for."""


def setting(default: Any = dataclasses.MISSING, *, help: str = "", ge: float | None = None,
            gt: float | None = None, le: float | None = None, choices: Sequence[Any] | None = None,
            label: str | None = None, flag: bool = True, resumable: bool = False,
            default_factory: Any = dataclasses.MISSING) -> Any:
    """A dataclass field with its checks and help in one place.

    `label`: the setting names a variant of a training run, and run folders
    carry it as `<label><value>` when it differs from the profile (see
    `mara_rl.scheduler_config.run_name`). `flag=False`: no command-line flag.
    `resumable`: an operational setting that a resumed run may change (a
    thread count, a worker count) without becoming another experiment.
    """
    meta = {"help": help, "ge": ge, "gt": gt, "le": le, "choices": tuple(choices) if choices else None,
            "label": label, "flag": flag, "resumable": resumable}
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def check_settings(obj: Any) -> None:
    """Raise ConfigError naming the first field outside its declared bounds or choices
    (and any float that is NaN or infinite)."""
    name = type(obj).__name__
    for f in dataclasses.fields(obj):
        value, meta = getattr(obj, f.name), f.metadata
        if value is None:
            continue
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{name}.{f.name} must be a finite number, got {value}")
        if meta.get("choices") and value not in meta["choices"]:
            raise ConfigError(f"{name}.{f.name} must be one of {list(meta['choices'])}, got {value!r}")
        for key, ok, word in (("ge", lambda v, b: v >= b, ">="), ("gt", lambda v, b: v > b, ">"),
                              ("le", lambda v, b: v <= b, "<=")):
            bound = meta.get(key)
            if bound is not None and not ok(value, bound):
                raise ConfigError(f"{name}.{f.name} must be {word} {bound}, got {value}")


def field_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _is_dataclass_type(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _coerce(tp: Any, value: Any, where: str) -> Any:
    """`value` as type `tp` (int, float, str, bool, tuples, optionals, nested configs)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(arg, value, where)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if len(errors) == 1 else
                          f"{where}={value!r} fits none of {[a for a in args if a is not type(None)]}")
    if origin in (tuple, list) or tp in (tuple, list):
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{where}={value!r} should be a list, got {type(value).__name__}")
        inner = typing.get_args(tp)
        item = inner[0] if inner else Any
        return tuple(_coerce(item, v, f"{where}[{i}]") for i, v in enumerate(value))
    if _is_dataclass_type(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"{where} should be a table of {tp.__name__} settings, got {value!r}")
        return make_config(tp, value, where)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}={value!r} should be true or false, got {type(value).__name__}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}={value!r} should be an integer, got {type(value).__name__}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{where}={value!r} should be a number, got {type(value).__name__}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}={value!r} should be a string, got {type(value).__name__}")
        return value
    return value  # anything else (a Predictor object, Any) is passed through


def make_config(cls: type[T], values: dict[str, Any], where: str = "config") -> T:
    """Instantiate dataclass `cls` from plain values, naming unknown keys, wrong types and
    values outside their bounds (`where` says which file and section they came from)."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown} for {cls.__name__}; known: {sorted(fields)}")
    types_ = field_types(cls)
    coerced = {name: _coerce(types_[name], value, f"{where}: {name}") for name, value in values.items()}
    try:
        return cls(**coerced)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{where}: {exc}") from None
