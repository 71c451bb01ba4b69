"""`humanline report RUN_DIR`: write curves.png and report.md, print the report."""

from __future__ import annotations

import argparse

from humanline.evaluation.run_report import report


def add_parser(sub) -> None:
    p = sub.add_parser("report", help="plots and a markdown summary of a run",
                       description="Write RUN_DIR/curves.png and RUN_DIR/report.md from RUN_DIR/metrics.jsonl, with "
                                   "the numbers of RUN_DIR/eval.json (humanline eval) when there is one.")
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run folder (it holds metrics.jsonl)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an earlier report.md and curves.png (a report.md edited by hand is lost)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    print(report(args.run_dir, overwrite=args.overwrite).read_text())
    return 0
