"""The Python blocks of README.md and docs/usage.md run as shown, each on its own, from a fresh folder that has
the repository's recipes/ (README's commands run from the repository root)."""

from __future__ import annotations

import pytest

from helpers_docs import ROOT, python_blocks

DOCUMENTS = ("README.md", "docs/usage.md")
BLOCKS = [(doc, line, code) for doc in DOCUMENTS for line, code in python_blocks((ROOT / doc).read_text("utf-8"))]


def test_the_documents_have_python_to_run_and_say_which_blocks_are_fragments():
    assert {doc for doc, _, _ in BLOCKS} == set(DOCUMENTS)
    readme = (ROOT / "README.md").read_text("utf-8")
    assert readme.count("```python") == len([b for b in BLOCKS if b[0] == "README.md"]) + 1  # the TRL call


def test_python_blocks_find_whole_programs_and_skip_fragments():
    text = "a\n```python\nx = 1\n```\n```python\n# a fragment of yours\ntrainer.train()\n```\n```yaml\nk: v\n```\n"
    assert python_blocks(text) == [(3, "x = 1")]


@pytest.mark.parametrize(("doc", "line", "code"), BLOCKS, ids=[f"{d}:{n}" for d, n, _ in BLOCKS])
def test_python_block_runs_as_shown(doc, line, code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "recipes").symlink_to(ROOT / "recipes")
    exec(compile(code, f"{doc}:{line}", "exec"), {"__name__": "__main__"})
