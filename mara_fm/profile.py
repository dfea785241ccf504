"""Run profiles (smoke, default, paper) and typed config sections.

A profile is a TOML file in `experiments/profiles/`; each stage reads its own
section into a dataclass with `section_config`, which rejects unknown keys
and wrong types so that a typo in a profile fails at start-up, not an hour in.
"""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path
from typing import Any, TypeVar

PROJECT_ROOT = Path(__file__).resolve().parents[1]
PROFILE_DIR = PROJECT_ROOT / "experiments" / "profiles"

T = TypeVar("T")


class ConfigError(ValueError):
    """A profile or override that does not fit the config it is meant for."""


def profile_path(profile: str) -> Path:
    """`profile` is a name in `experiments/profiles/` or a path to a TOML file."""
    path = Path(profile)
    if path.suffix != ".toml":
        path = PROFILE_DIR / f"{profile}.toml"
    if not path.exists():
        names = sorted(p.stem for p in PROFILE_DIR.glob("*.toml"))
        raise ConfigError(f"profile {profile!r} not found (known: {names}, or pass a .toml path)")
    return path


def load_profile(profile: str) -> dict[str, dict[str, Any]]:
    with profile_path(profile).open("rb") as fh:
        return tomllib.load(fh)


def section_config(cls: type[T], profile: str, section: str, **overrides: Any) -> T:
    """Build dataclass `cls` from one profile section plus keyword overrides."""
    values = dict(load_profile(profile).get(section, {}))
    values.update({k: v for k, v in overrides.items() if v is not None})
    return make_config(cls, values, where=f"profile {profile!r} section [{section}]")


def make_config(cls: type[T], values: dict[str, Any], where: str = "config") -> T:
    """Instantiate a dataclass config, checking names and simple types."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown} for {cls.__name__}; known: {sorted(fields)}")
    defaults = cls()
    for name, value in values.items():
        expected = type(getattr(defaults, name))
        if expected is float and isinstance(value, int) and not isinstance(value, bool):
            values[name] = float(value)
        elif expected in (int, float, str, bool) and not isinstance(value, expected):
            raise ConfigError(
                f"{where}: {name}={value!r} should be {expected.__name__}, got {type(value).__name__}"
            )
    return dataclasses.replace(defaults, **values)
