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
# A top-level key: `stage_one_from = "default"` makes a profile share that profile's bank and
# predictor (their files and their sections), so a scheduler setting needs no stage one of its own.
SHARED_STAGE_ONE = "stage_one_from"


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
    stage_one: Profile | None = None  # the profile whose bank and predictor this one shares

    @classmethod
    def load(cls, profile: str | Path | Profile) -> Profile:
        if isinstance(profile, Profile):
            return profile
        path = profile_path(profile)
        try:
            with path.open("rb") as fh:
                sections = tomllib.load(fh)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: not valid TOML ({exc})") from None
        shared = sections.pop(SHARED_STAGE_ONE, None)
        if shared is not None and not isinstance(shared, str):
            raise ConfigError(f"{path}: {SHARED_STAGE_ONE} should name a profile, got {shared!r}")
        if shared is not None and set(STAGE_ONE) & set(sections):
            raise ConfigError(f"{path}: a profile with {SHARED_STAGE_ONE} takes [bank] and [predictor] from "
                              f"{shared!r}; remove its own {sorted(set(STAGE_ONE) & set(sections))}")
        unknown = sorted(set(sections) - set(SECTIONS))
        if unknown:
            raise ConfigError(f"{path}: unknown section(s) {unknown}; known: {list(SECTIONS)}")
        bad = [name for name, body in sections.items() if not isinstance(body, dict)]
        if bad:
            raise ConfigError(f"{path}: {bad} should be [sections], not plain keys")
        return cls(path.stem, path, sections, cls.load(shared) if shared else None)

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
