"""`humanline config [--list] [SECTION ...]`: every config field with its default and meaning."""

from __future__ import annotations

import argparse
import dataclasses

from humanline.errors import UserError
from humanline.settings.config import Config
from humanline.settings.field_docs import listing

SECTIONS = [f.name for f in dataclasses.fields(Config)]


def add_parser(sub) -> None:
    p = sub.add_parser("config", help="list every recipe field with its default and meaning",
                       description="Print every recipe field with its default and what it means, as a YAML recipe of "
                                   "the defaults (read from the settings' source: src/humanline/settings/config.py "
                                   "and, for humanline:, src/humanline/core/humanline.py).")
    p.add_argument("sections", nargs="*", metavar="SECTION", help=f"only these sections ({', '.join(SECTIONS)})")
    p.add_argument("--list", action="store_true", help="list the fields (the default; accepted for clarity)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    unknown = [s for s in args.sections if s not in SECTIONS]
    if unknown:
        raise UserError(f"config: unknown section '{unknown[0]}' (expected one of {', '.join(SECTIONS)})")
    print(listing(args.sections or None))
    return 0
