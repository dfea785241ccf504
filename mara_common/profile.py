"""Run profiles (smoke, default, paper): one TOML file, parsed once, passed down.

A profile is a TOML file in `experiments/profiles/` (or any path to one).
`Profile.load` reads it at the entry point and rejects unknown sections;
each stage then asks it for its typed config with `Profile.section`, which
rejects unknown keys, wrong types and values out of bounds, naming the file
and the key.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from mara_common.config import ConfigError, make_config
from mara_common.paths import PROFILE_DIR, ProjectPaths

T = TypeVar("T")
# Every section a profile may have; each is read by one stage's config class.
SECTIONS = ("bank", "wide_bank", "history_bank", "predictor", "env", "evaluation", "scheduler", "report", "live")
STAGE_ONE = ("bank", "wide_bank", "history_bank", "predictor")
# A top-level key: `extends = "default"` makes a profile that profile with changes. It shares its
# banks and predictor (files and sections: no stage one of its own), and takes every other section
# from it key by key (tables merged), so it writes down only what differs.
EXTENDS = "extends"
# A top-level key of a profile that extends another: `unset = ["scheduler.arrival_prob_max"]` drops
# inherited keys ("section.key", or "section.table.key"), so those fields take their dataclass
# defaults. TOML has no null, and without it a child could not turn off what its base turns on.
UNSET = "unset"


def merged(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """`base` with `changes` applied key by key; a table changed in part keeps its other keys."""
    out = dict(base)
    for key, value in changes.items():
        both_tables = isinstance(value, dict) and isinstance(base.get(key), dict)
        out[key] = merged(base[key], value) if both_tables else value
    return out


def without(sections: dict[str, Any], dotted: str, where: str) -> dict[str, Any]:
    """`sections` less the key that `dotted` ("section.key", "section.table.key") names."""
    *tables, key = dotted.split(".")
    if not tables or tables[0] in STAGE_ONE:
        raise ConfigError(f"{where}: name an inherited key as \"section.key\" outside "
                          f"{list(STAGE_ONE)}")
    out = dict(sections)
    body = out
    for name in tables:
        if not isinstance(body.get(name), dict):
            raise ConfigError(f"{where}: the base profile has no [{'.'.join(tables)}] to drop it from")
        body[name] = dict(body[name])
        body = body[name]
    if key not in body:
        raise ConfigError(f"{where}: the base profile does not set it, so there is nothing to unset")
    del body[key]
    return out


def profile_path(profile: str | Path) -> Path:
    """`profile` is a name in `experiments/profiles/` or a path to a TOML file."""
    path = Path(profile)
    if path.suffix != ".toml":
        path = PROFILE_DIR / f"{profile}.toml"
    if not path.exists():
        names = sorted(p.stem for p in PROFILE_DIR.glob("*.toml"))
        raise ConfigError(f"profile {str(profile)!r} not found (known: {names}, or pass a .toml path)")
    return path


@dataclass(frozen=True)
class Profile:
    """A parsed profile: its name (the file's stem), file and sections."""

    name: str
    path: Path
    sections: dict[str, dict[str, Any]] = field(repr=False)
    stage_one: Profile | None = None  # the profile it extends, whose banks and predictor it shares

    @classmethod
    def load(cls, profile: str | Path | Profile, _extended_by: tuple[Path, ...] = ()) -> Profile:
        if isinstance(profile, Profile):
            return profile
        path = profile_path(profile)
        if path.resolve() in _extended_by:
            raise ConfigError(f"{_extended_by[0]}: profiles extend each other in a loop")
        try:
            with path.open("rb") as fh:
                sections = tomllib.load(fh)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: not valid TOML ({exc})") from None
        base = sections.pop(EXTENDS, None)
        if base is not None and not isinstance(base, str):
            raise ConfigError(f"{path}: {EXTENDS} should name a profile, got {base!r}")
        unset = sections.pop(UNSET, [])
        if unset and base is None:
            raise ConfigError(f"{path}: {UNSET} drops keys a base profile sets; add {EXTENDS} = \"...\"")
        if not isinstance(unset, list) or not all(isinstance(k, str) for k in unset):
            raise ConfigError(f"{path}: {UNSET} should list \"section.key\" names, got {unset!r}")
        if base is not None and set(STAGE_ONE) & set(sections):
            raise ConfigError(f"{path}: a profile that {EXTENDS} another takes [bank] and [predictor] from "
                              f"{base!r}; remove its own {sorted(set(STAGE_ONE) & set(sections))}")
        unknown = sorted(set(sections) - set(SECTIONS))
        if unknown:
            raise ConfigError(f"{path}: unknown section(s) {unknown}; known: {list(SECTIONS)}")
        bad = [name for name, body in sections.items() if not isinstance(body, dict)]
        if bad:
            raise ConfigError(f"{path}: {bad} should be [sections], not plain keys")
        if base is None:
            return cls(path.stem, path, sections)
        parent = cls.load(base, (*_extended_by, path.resolve()))
        if parent.stage_one is not None:  # one level, as the Makefile reads it
            raise ConfigError(f"{path}: {EXTENDS} {base!r}, which itself {EXTENDS} "
                              f"{parent.stage_one.name!r}; extend a profile with a stage one of its own")
        inherited = {name: body for name, body in parent.sections.items() if name not in STAGE_ONE}
        for dotted in unset:
            inherited = without(inherited, dotted, f"{path}: {UNSET} {dotted!r}")
        return cls(path.stem, path, merged(inherited, sections), parent)

    @property
    def paths(self) -> ProjectPaths:
        return ProjectPaths(self.name, self.stage_one.paths.stage_one_name if self.stage_one else None)

    def values(self, section: str) -> dict[str, Any]:
        if section not in SECTIONS:
            raise ConfigError(f"no profile section [{section}]; known: {list(SECTIONS)}")
        if self.stage_one is not None and section in STAGE_ONE:
            return self.stage_one.values(section)
        return dict(self.sections.get(section, {}))

    def section(self, cls: type[T], section: str, **overrides: Any) -> T:
        """Dataclass `cls` from this profile's `[section]` plus keyword overrides (None = keep)."""
        values = self.values(section)
        given = {k: v for k, v in overrides.items() if v is not None}
        values.update(given)
        where = f"{self.path} [{section}]" + (f" with {sorted(given)} given" if given else "")
        return make_config(cls, values, where=where)
