"""Command-line flags derived from a config dataclass's fields.

Each field declared with `mara_common.config.setting` becomes `--field-name`
(its help, type and choices from the declaration); a flag left unset keeps
the profile's value. The same fields turn back into argv for a job that runs
the command elsewhere (`to_argv`). Flags that take several values take them
comma-separated (`comma_list`).
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from collections.abc import Callable
from typing import Any, TypeVar

from mara_common.config import ConfigError, field_types

T = TypeVar("T")


def _scalar(tp: Any) -> Any:
    """The scalar type behind `tp` (X for `X | None`), or None for fields without a flag form."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        tp = args[0] if len(args) == 1 else None
    return tp if tp in (int, float, str, bool) else None


def flag_fields(cls: type) -> list[dataclasses.Field]:
    types_ = field_types(cls)
    return [f for f in dataclasses.fields(cls)
            if f.metadata.get("flag", True) and _scalar(types_[f.name]) is not None]


def flag_name(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def add_flags(parser: argparse.ArgumentParser, cls: type, skip: tuple[str, ...] = ()) -> None:
    """One flag per scalar field of `cls` (except `skip`), default None (= the profile's)."""
    types_ = field_types(cls)
    group = parser.add_argument_group(f"{cls.__name__} settings (default: the profile's)")
    for f in flag_fields(cls):
        if f.name in skip:
            continue
        tp = _scalar(types_[f.name])
        options: dict[str, Any] = {"dest": f.name, "default": None, "help": f.metadata.get("help") or None}
        if tp is bool:
            options["action"] = argparse.BooleanOptionalAction
        else:
            options["type"] = tp
            if f.metadata.get("choices"):
                options["choices"] = f.metadata["choices"]
            else:
                options["metavar"] = tp.__name__.upper()
        group.add_argument(flag_name(f.name), **options)


def overrides(args: argparse.Namespace, cls: type) -> dict[str, Any]:
    """The flags of `cls` that were set, as {field: value}."""
    return {f.name: getattr(args, f.name) for f in flag_fields(cls)
            if getattr(args, f.name, None) is not None}


def to_argv(values: dict[str, Any]) -> list[str]:
    """{field: value} back to flags, for a command run elsewhere."""
    argv: list[str] = []
    for name, value in values.items():
        if isinstance(value, bool):
            argv.append(flag_name(name) if value else "--no-" + name.replace("_", "-"))
        else:
            argv += [flag_name(name), str(value)]
    return argv


def comma_list(text: str | None, flag: str, item: Callable[[str], T] = str) -> list[T]:
    """The non-empty, stripped items of a comma-separated value of `flag`, each read by
    `item`; an item that `item` rejects is a ConfigError naming the flag and the item."""
    out = []
    for word in (x.strip() for x in (text or "").split(",")):
        if not word:
            continue
        try:
            out.append(item(word))
        except ValueError as e:
            raise ConfigError(f"{flag}: cannot read {word!r} ({e})") from None
    return out
