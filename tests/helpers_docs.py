"""The command lines that README.md and docs/*.md show, read from the Markdown (tests/commands/
test_documented_commands.py runs each of them).

A command line is a line of a code block (indented by four spaces, or fenced without a language or as a shell
block) or an inline code span, whose program is one of the project's: `humanline`, `python -m humanline`,
`python PATH.py`, `accelerate launch`, `bash PATH.sh`, `torchrun`. Lines whose program is anything else
(`pip`, program output, a file name, prose) are not commands of the project: write a script as `bash PATH.sh`
or `python PATH.py`, so that it is found.

Reading a line: `# comments` are dropped, a trailing backslash and a synopsis line continued on the next
line (starting with `[` or `--`) are joined, `a && b` and `a · b` are two commands, leading `VAR=value`
assignments become the command's environment, and `nice -n N`, `time`, `/usr/bin/time -v` wrappers are
dropped. A synopsis (`[--flag X]` optional parts, `a|b` alternatives, `...` repetition) is expanded into the
concrete command lines it stands for: every optional part included, each alternative once.
"""

from __future__ import annotations

import itertools
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = ("README.md", "docs/*.md")  # the files whose command lines are run
SHELL_FENCES = ("", "bash", "sh", "shell", "console")
WRAPPERS = {"nice": 2, "time": 0, "/usr/bin/time": 0}  # program -> arguments of its own to skip (time: -v too)
ENV = re.compile(r"^[A-Z_][A-Z0-9_]*=")


@dataclass(frozen=True)
class DocCommand:
    where: str  # "docs/usage.md:12" (first place it is shown)
    text: str  # the command as shown, on one line
    env: tuple[tuple[str, str], ...]  # leading VAR=value assignments
    form: str  # the runner's key: "humanline", "accelerate", "python scripts/x.py", "bash scripts/x.sh", ...
    argv: tuple[str, ...]  # the arguments after the form (`humanline demo --quick`: ("demo", "--quick"))
    synopsis: bool  # expanded from a synopsis (optional parts, alternatives): a grammar, not a concrete call
    inline: bool  # shown in a sentence (an inline code span), not in a code block


def documented_commands(root: Path = ROOT, patterns: tuple[str, ...] = DOCUMENTS) -> list[DocCommand]:
    """Every command line of the documents, each distinct (env, form, argv) once, at its first place."""
    seen, out = set(), []
    for pattern in patterns:
        for path in sorted(root.glob(pattern)):
            for line, text, in_code in command_texts(path.read_text(encoding="utf-8")):
                for command in parse_command(text, f"{path.relative_to(root)}:{line}", in_code):
                    key = (command.env, command.form, command.argv)
                    if key not in seen:
                        seen.add(key)
                        out.append(command)
    return out


def command_texts(markdown: str) -> list[tuple[int, str, bool]]:
    """`(line, text, in a code block)` for every code-block line (continuations joined) and inline code span."""
    lines = markdown.splitlines()
    code: dict[int, str] = {}
    fence, previous_code = None, False
    for i, line in enumerate(lines):
        if line.lstrip().startswith("```"):
            fence = None if fence is not None else line.strip()[3:].strip().lower()
            previous_code = False
            continue
        indented = line.startswith("    ") and (previous_code or i == 0 or not lines[i - 1].strip())
        if fence is not None or indented:
            if fence is None or fence in SHELL_FENCES:
                code[i] = line
            previous_code = fence is None
        else:
            previous_code = previous_code and not line.strip() and False
    texts = []
    for i in sorted(code):
        stripped = code[i].strip()
        if i - 1 in code and (code[i - 1].rstrip().endswith("\\") or stripped.startswith(("[", "--"))):
            continue  # joined to the line it continues
        j, text = i, _strip_comment(stripped)
        while j + 1 in code and (code[j].rstrip().endswith("\\") or code[j + 1].strip().startswith(("[", "--"))):
            j += 1
            text = text.rstrip("\\").rstrip() + " " + _strip_comment(code[j].strip())
        texts.append((i + 1, text, True))
    prose = "\n".join("" if i in code else line for i, line in enumerate(lines))
    for match in re.finditer(r"(?<!`)`([^`]+)`(?!`)", prose):
        texts.append((prose.count("\n", 0, match.start()) + 1, " ".join(match.group(1).split()), False))
    return sorted(texts)


def _strip_comment(text: str) -> str:
    return re.split(r"(?:^|\s)#(?:\s|$)", text, maxsplit=1)[0].rstrip()


def parse_command(text: str, where: str, in_code: bool = True) -> list[DocCommand]:
    """The project's commands in one shown line (none when it is output or prose)."""
    out = []
    for part in re.split(r"\s+(?:&&|·)\s+", text):
        try:
            words = shlex.split(part)
        except ValueError:
            continue  # unbalanced quotes: prose, not a command
        env = []
        while words and ENV.match(words[0]):
            name, _, value = words.pop(0).partition("=")
            env.append((name, value))
        while words and words[0] in WRAPPERS:
            skip = WRAPPERS[words[0]] or (1 if len(words) > 1 and words[1].startswith("-") else 0)
            words = words[1 + skip:]
        form, argv = command_form(words)
        if form is None or (not in_code and not argv and form == "humanline" and len(words) == 1):
            continue
        for expanded, synopsis in expand_synopsis(argv):
            out.append(DocCommand(where, part, tuple(env), form, tuple(expanded), synopsis, not in_code))
    return out


def command_form(words: list[str]) -> tuple[str | None, list[str]]:
    """`(form, arguments)`: the program and its target, or None when the words are not a project command."""
    if not words:
        return None, []
    program, rest = words[0], words[1:]
    name = program.rsplit("/", 1)[-1]
    if name == "humanline":
        return ("humanline", rest) if rest or program == "humanline" else (None, [])
    if name in ("python", "python3"):
        if rest[:2] == ["-m", "humanline"]:
            return "humanline", rest[2:] if len(rest) > 2 else ["--help"]
        if rest and rest[0] == "-m":
            return f"python -m {rest[1] if len(rest) > 1 else ''}", rest[2:]
        if rest and rest[0].endswith(".py"):
            return f"python {rest[0]}", rest[1:]
        return None, []
    if name in ("bash", "sh"):
        return (f"bash {rest[0]}", rest[1:]) if rest and rest[0].endswith(".sh") else (None, [])
    if name == "accelerate":
        return ("accelerate", rest[1:]) if rest[:1] == ["launch"] else (None, [])
    if name == "torchrun":
        return "torchrun", rest
    return None, []


def expand_synopsis(argv: list[str]) -> list[tuple[list[str], bool]]:
    """A synopsis as the concrete argument lists it stands for: `[x]` kept (brackets dropped), `...` dropped, and
    `a|b` once per alternative. `(argv, False)` for a line that is no synopsis."""
    words = [w for w in argv if w not in ("...", "[...]")]
    synopsis = any(w.startswith("[") or w.endswith(("]", "]...")) or ("|" in w and not w.startswith("--") and
                   "=" not in w) for w in words) or len(words) != len(argv)
    if not synopsis:
        return [(list(argv), False)]
    words = [w.removesuffix("...").strip("[]") for w in words]
    choices = [w.split("|") if "|" in w and not w.startswith("--") and "=" not in w else [w] for w in words if w]
    longest = max(len(c) for c in choices)
    variants = [[c[min(i, len(c) - 1)] for c in choices] for i in range(longest)]
    return [(v, True) for v, _ in itertools.groupby(variants)]


FRAGMENT = "# a fragment"  # the first line of a Python block that is part of the reader's own program (not run)


def python_blocks(markdown: str) -> list[tuple[int, str]]:
    """`(line, code)` of every ```python block of `markdown` that is a whole program (a block whose first line
    starts with `FRAGMENT` is shown, not run: it names objects of the reader's own program)."""
    out, lines, start = [], markdown.splitlines(), None
    for i, line in enumerate(lines):
        fence = line.strip()
        if start is None and fence == "```python":
            start = i + 1
        elif start is not None and fence == "```":
            code = "\n".join(lines[start:i])
            if not code.lstrip().startswith(FRAGMENT):
                out.append((start + 1, code))
            start = None
    return out
