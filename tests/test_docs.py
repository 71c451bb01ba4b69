"""The README stays a front door (short, "Use it" near the top), and the file trees of README.md and
docs/design.md name files that exist; docs/design.md names every module of the package."""

from __future__ import annotations

import re

from helpers_train import ROOT

README = (ROOT / "README.md").read_text(encoding="utf-8")
DESIGN = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")


def _tree(text: str, heading: str) -> list[str]:
    """The paths of the indented file tree under `heading` (its first word per line; continuation lines skipped)."""
    section = text.split(heading, 1)[1].split("\n## ", 1)[0]
    return [line.split()[0].rstrip(",") for line in section.splitlines()
            if line.startswith("    ") and not line.startswith("     ") and line.strip()]


def test_the_readme_is_short_and_says_how_to_use_it_near_the_top():
    lines = README.splitlines()
    assert len(lines) <= 200
    assert any(line.startswith("## Use it") for line in lines[:60])
    for path in re.findall(r"\b(docs/[\w-]+\.md|BENCHMARKS\.md)\b", README):
        assert (ROOT / path).is_file(), path


def test_the_file_trees_name_files_that_exist():
    for text, heading in ((README, "## Files"), (DESIGN, "## Files")):
        paths = _tree(text, heading)
        assert len(paths) >= 20
        missing = [p for p in paths if "*" not in p and not (ROOT / p.rstrip(",")).exists()]
        assert missing == [], f"{heading} names paths that do not exist: {missing}"


def test_design_names_every_module_of_the_package():
    listed = set(_tree(DESIGN, "## Files"))
    folders = {p for p in listed if p.endswith("/")}
    modules = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "src" / "humanline").rglob("*.py")
                     if p.name != "__init__.py" or p.parent.name == "humanline")  # a subpackage's: its exports
    unlisted = [m for m in modules if m not in listed and not any(m.startswith(f) for f in folders)
                and not (m.startswith("src/humanline/integrations/_trl_") and
                         "src/humanline/integrations/_trl_*.py" in listed)]
    assert unlisted == [], f"docs/design.md's file tree lacks {unlisted}"
