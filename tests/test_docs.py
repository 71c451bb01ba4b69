"""The README stays a front door (at most 150 lines, "Use it" near the top, no file tree: docs/design.md has it),
and docs/design.md's file tree names files that exist and every module of the package; every link, image and
repository path that README.md, BENCHMARKS.md, docs/*.md and lab/*.md point to exists (a moved file breaks no
page)."""

from __future__ import annotations

import re
from pathlib import Path

from helpers_train import ROOT

README = (ROOT / "README.md").read_text(encoding="utf-8")
DESIGN = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
PAGES = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").glob("*.md")),
         *sorted((ROOT / "lab").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(\s*([^)\s]+)[^)]*\)")  # [text](target) and ![alt](target), across lines
# A repository path named in prose or code (`tests/train/test_memory.py`, docs/method.md); templates such as
# `tests/objectives/test_objectives_<name>.py` or `runs/*` are not paths, and src/ means this package's.
REPO_PATH = re.compile(r"(?<![\w/.<-])((?:docs|tests|src/humanline|scripts|recipes|benchmarks|lab|\.ci)"
                       r"(?:/[\w.<>*{}-]+)+)")


def _tree(text: str, heading: str) -> list[str]:
    """The paths of the indented file tree under `heading` (its first word per line; continuation lines skipped)."""
    section = text.split(heading, 1)[1].split("\n## ", 1)[0]
    return [line.split()[0].rstrip(",") for line in section.splitlines()
            if line.startswith("    ") and not line.startswith("     ") and line.strip()]


def test_the_readme_is_short_and_says_how_to_use_it_near_the_top():
    lines = README.splitlines()
    assert len(lines) <= 150
    assert any(line.startswith("## Use it") for line in lines[:60])
    assert "## Files" not in README and "## Design" not in README  # docs/design.md holds them, once
    for path in re.findall(r"\b(docs/[\w-]+\.md|BENCHMARKS\.md)\b", README):
        assert (ROOT / path).is_file(), path


def test_the_file_tree_names_files_that_exist():
    paths = _tree(DESIGN, "## Files")
    assert len(paths) >= 20
    missing = [p for p in paths if "*" not in p and not (ROOT / p.rstrip(",")).exists()]
    assert missing == [], f"docs/design.md's file tree names paths that do not exist: {missing}"


def test_design_names_every_module_of_the_package():
    listed = set(_tree(DESIGN, "## Files"))
    folders = {p for p in listed if p.endswith("/")}
    modules = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "src" / "humanline").rglob("*.py")
                     if p.name != "__init__.py" or p.parent.name == "humanline")  # a subpackage's: its exports
    unlisted = [m for m in modules if m not in listed and not any(m.startswith(f) for f in folders)
                and not (m.startswith("src/humanline/integrations/_trl_") and
                         "src/humanline/integrations/_trl_*.py" in listed)]
    assert unlisted == [], f"docs/design.md's file tree lacks {unlisted}"


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces as hyphens."""
    headings = re.findall(r"^#+\s+(.+?)\s*$", page.read_text(encoding="utf-8"), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


def test_every_relative_link_and_image_resolves():
    broken = []
    for page in PAGES:
        for target in LINK.findall(page.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto: are not files of the repository
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists() or (anchor and file.suffix == ".md" and anchor not in _anchors(file)):
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert broken == [], f"links that resolve to nothing: {broken}"


def test_every_repository_path_the_pages_name_exists():
    missing = []
    for page in PAGES:
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            for path in REPO_PATH.findall(line):
                path = path.rstrip(".")
                if not any(c in path for c in "<>*{}") and not (ROOT / path).exists():
                    missing.append(f"{page.relative_to(ROOT)}:{number}: {path}")
    assert missing == [], f"paths that do not exist: {missing}"


def test_the_link_check_sees_a_broken_link_and_an_anchor(tmp_path):
    """The checks above are only as good as their patterns: a link split over two lines is found, and a
    heading's anchor is the one GitHub makes."""
    page = tmp_path / "page.md"
    page.write_text("# Speed and memory, CPU\n\nSee ![a plot\nof it](images/none.png).\n", encoding="utf-8")
    assert LINK.findall(page.read_text(encoding="utf-8")) == ["images/none.png"]
    assert _anchors(page) == {"speed-and-memory-cpu"}
    assert REPO_PATH.findall("see tests/train/test_memory.py::test_x, or src/open_r1/grpo.py") == [
        "tests/train/test_memory.py"]
