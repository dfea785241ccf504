"""Where every stage of a profile reads and writes, named once.

Outputs live in ignored folders at the project root (`data/`, `artifacts/`,
`reports/`, the MLflow store); only `results/` is tracked: the tables that
`mara report` generates for the front door.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
PROFILE_DIR = PROJECT_ROOT / "experiments" / "profiles"
EPISODE_DIR = PROJECT_ROOT / "data" / "episodes"
SCHEDULER_RUNS = PROJECT_ROOT / "artifacts" / "scheduler"
RESULTS_DIR = PROJECT_ROOT / "results"
README = PROJECT_ROOT / "README.md"


@dataclass(frozen=True)
class ProjectPaths:
    """The default files of one profile (`name` is the profile's stem). Stage one's files
    (bank, predictor) are those of profile `stage_one` when it is set."""

    name: str
    stage_one: str | None = None

    @property
    def stage_one_name(self) -> str:
        return self.stage_one or self.name

    @property
    def bank(self) -> Path:
        return PROJECT_ROOT / "data" / "banks" / f"{self.stage_one_name}.parquet"

    @property
    def wide_bank(self) -> Path:
        """Runs of the wide families (mara_fm/wide_families.py): predictor training and selection only."""
        return PROJECT_ROOT / "data" / "banks" / f"{self.stage_one_name}-wide.parquet"

    @property
    def history_bank(self) -> Path:
        """Fresh runs of the main bank's families: the history predictor's finished runs."""
        return PROJECT_ROOT / "data" / "banks" / f"{self.stage_one_name}-history.parquet"

    @property
    def predictor_run(self) -> Path:
        """`train-predictor`'s folder: checkpoints, the MLflow run id, the export."""
        return PROJECT_ROOT / "artifacts" / "predictor" / self.stage_one_name

    @property
    def predictor(self) -> Path:
        """The exported FM predictor (what `fm:<path>` names)."""
        return self.predictor_run / "predictor"

    @property
    def predictor_report(self) -> Path:
        return PROJECT_ROOT / "reports" / "predictor" / self.stage_one_name

    @property
    def predictor_eval(self) -> Path:
        return self.predictor_report / "predictor_eval.json"

    @property
    def report(self) -> Path:
        return PROJECT_ROOT / "reports" / self.name

    @property
    def evaluation(self) -> Path:
        return self.report / "eval"

    @property
    def results(self) -> Path:
        """The tracked copy of the report's tables."""
        return RESULTS_DIR / self.name


def normal_path(path: str | Path) -> str:
    """The one form in which a path is stored and compared: absolute, resolved."""
    return str(Path(path).expanduser().resolve())


def write_text_atomic(path: str | Path, text: str) -> Path:
    """`text` written to a temporary file beside `path`, then renamed over it: a stop mid-write
    leaves the previous file whole."""
    path = Path(path)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)
    return path
