"""benchmarks/corrections_overhead.py times every stale-sample correction the library has: a rule added to the
table and not to the benchmark would have no measured cost in BENCHMARKS.md."""

from __future__ import annotations

import ast

from helpers_train import ROOT
from humanline.objectives.corrections import CORRECTIONS


def test_the_benchmark_times_every_correction_of_the_table():
    tree = ast.parse((ROOT / "benchmarks" / "corrections_overhead.py").read_text())
    timed = next(ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
                 and any(getattr(t, "id", None) == "CORRECTIONS" for t in node.targets))
    assert timed == CORRECTIONS
