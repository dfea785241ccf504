"""References to the docs by an entry's title (`docs/decisions.md, "Title"`) name an entry that exists."""

from __future__ import annotations

import re
from pathlib import Path

from mara_common.paths import PROJECT_ROOT

DOCS = PROJECT_ROOT / "docs"
# A document, an optional section sign, and a quoted title; it may wrap over lines of prose or comments.
REFERENCE = re.compile(r'(?:docs/)?(\w+)\.md,?\s*(?:§[\d.]+,\s*)?"([^"]{3,100})"')
# Where an entry starts: a heading, a bold run at the start of a line, or a bullet.
ENTRY = re.compile(r"(?m)^(?:#+\s*(?:[\d.]+\s+)?|\*\*|-\s+\*\*|-\s+)(.+)$")


def normal(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().lower()


def sources() -> list[Path]:
    """The project's prose, code and profiles (this file excepted: its examples are not references)."""
    paths = [PROJECT_ROOT / "README.md", *DOCS.glob("*.md"), *(PROJECT_ROOT / "experiments").rglob("*.toml")]
    for folder in ("mara_common", "mara_fm", "mara_env", "mara_live", "mara_rl", "experiments", "tests"):
        paths += (PROJECT_ROOT / folder).rglob("*.py")
    return [path for path in paths if path != Path(__file__)]


def broken_references(paths: list[Path]) -> tuple[int, list[str]]:
    """How many titled references `paths` hold, and those whose title starts no entry of its document."""
    entries = {path.stem: {normal(m) for m in ENTRY.findall(path.read_text())} for path in DOCS.glob("*.md")}
    count, broken = 0, []
    for path in paths:
        flat = re.sub(r"\n\s*#?\s*", " ", path.read_text())
        for doc, title in REFERENCE.findall(flat):
            if doc not in entries:
                continue
            count += 1
            if not any(entry.startswith(normal(title.rstrip("…."))) for entry in entries[doc]):
                broken.append(f'{path.name}: {doc}.md, "{title}"')
    return count, broken


def test_every_titled_reference_names_an_entry_of_its_document():
    count, broken = broken_references(sources())
    assert count > 30  # the pattern still finds the project's references
    assert not broken, "references to no entry:\n" + "\n".join(broken)


def test_a_reference_to_a_missing_entry_is_reported(tmp_path):
    code = tmp_path / "module.py"
    code.write_text('# as measured (docs/decisions.md, "Predictor"; docs/experiments.md, "A rule\n'
                    '# hint"), not (docs/decisions.md, "An entry never\n# written").\n')
    assert broken_references([code]) == (3, ['module.py: decisions.md, "An entry never written"'])
