"""Typed settings: one declaration per setting, checked where it is read.

A config is a dataclass whose fields may be declared with `setting(...)`,
which records the setting's bounds, choices and help text beside its
default. `check_settings` enforces them; `check_config` (call it from
`__post_init__` of a config also built from keyword arguments) first checks
every field against its type hint, then the settings. `make_config` builds a
config from plain values (a profile section, command line overrides),
checking names and types and recursing into nested configs. Both check a
value against a type by the same rules (`check_value`), and
`mara_common.flags` derives command-line flags from the same fields.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import types
import typing
from collections.abc import Sequence
from typing import Any, TypeVar

import numpy as np

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


def check_value(tp: Any, value: Any, where: str) -> Any:
    """`value` checked against the declared type `tp`, as that type; ConfigError naming `where`
    otherwise. The one set of rules for `make_config` and `check_config`:

    - int: an integer (numpy's too, stored as int), never a bool or a float;
    - float: a finite number (ints and numpy numbers too, stored as float), never a bool;
    - bool: true or false only (numpy's too, stored as bool); str: a string;
    - `X | None`: None or an X (with several types, the first that fits);
    - tuples and lists: a list or tuple, stored as a tuple, each item checked against the
      item type; `tuple[int, int]` also fixes the length (`tuple[int, ...]` does not);
    - a nested config (dataclass): an instance, or a dict of its settings (`make_config`);
    - anything else (a Predictor object, Any) is passed through.
    """
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None and len(args) < len(typing.get_args(tp)):
            return None
        errors = []
        for arg in args:
            try:
                return check_value(arg, value, where)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if len(errors) == 1 else
                          f"{where} must be a {' or '.join(getattr(a, '__name__', str(a)) for a in args)}, got {value!r}")
    if origin in (tuple, list) or tp in (tuple, list):
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{where} must be a list, got {value!r}")
        items = typing.get_args(tp)
        if origin is tuple and items and items[-1] is not Ellipsis:  # tuple[int, int]: a fixed length
            if len(value) != len(items):
                raise ConfigError(f"{where} must be a list of {len(items)} values, got {value!r}")
        else:  # tuple[int, ...], list[int], tuple, list
            items = (items[0] if items else Any,) * len(value)
        checked = tuple(check_value(item, v, f"{where}[{i}]") for i, (item, v) in enumerate(zip(items, value, strict=True)))
        return value if type(value) is tuple and all(c is v for c, v in zip(checked, value, strict=True)) else checked
    if _is_dataclass_type(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"{where} must be a {tp.__name__} or a table of its settings, got {value!r}")
        return make_config(tp, value, where)
    if tp is bool:
        if not isinstance(value, bool | np.bool_):
            raise ConfigError(f"{where} must be true or false, got {value!r}")
        return bool(value)
    if tp is int:
        if isinstance(value, bool | np.bool_) or not isinstance(value, numbers.Integral):
            raise ConfigError(f"{where} must be an integer, got {value!r}")
        return value if type(value) is int else int(value)
    if tp is float:
        if isinstance(value, bool | np.bool_) or not isinstance(value, numbers.Real):
            raise ConfigError(f"{where} must be a number, got {value!r}")
        try:
            number = value if type(value) is float else float(value)
        except OverflowError:  # an int beyond any float
            number = math.inf
        if not math.isfinite(number):
            raise ConfigError(f"{where} must be a finite number, got {value}")
        return number
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where} must be a string, got {value!r}")
        return value
    return value


def check_config(obj: Any) -> None:
    """Check a config dataclass where it is built (call it from `__post_init__`; configs are
    also built directly from keyword arguments): each field's value against its type hint
    (`check_value`; a converted value — an int given for a float, a list for a tuple, a dict
    for a nested config — is stored in its place, in frozen configs too), then the bounds and
    choices of its `setting` declarations (`check_settings`). Raises ConfigError naming the
    first field that does not fit, as `<Class>.<field>`."""
    name, types_ = type(obj).__name__, field_types(type(obj))
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        checked = check_value(types_[f.name], value, f"{name}.{f.name}")
        if checked is not value:
            object.__setattr__(obj, f.name, checked)  # frozen configs too
    check_settings(obj)


def make_config(cls: type[T], values: dict[str, Any], where: str = "config") -> T:
    """Instantiate dataclass `cls` from plain values, naming unknown keys, wrong types and
    values outside their bounds (`where` says which file and section they came from).
    Each value is checked and converted by `check_value`, as `check_config` does."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown} for {cls.__name__}; known: {sorted(fields)}")
    types_ = field_types(cls)
    checked = {name: check_value(types_[name], value, f"{where}: {cls.__name__}.{name}")
               for name, value in values.items()}
    try:
        return cls(**checked)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{where}: {exc}") from None
