"""The import graph of `src/humanline`: no cycles, no import pointing up the layers, and an import inside a
function only where it defers a heavy optional dependency (and says so in a comment).

The graph is read from the source with `ast`: every `import` and `from ... import` of a humanline module,
at the top of a file or inside a function, except those under `if TYPE_CHECKING:` (annotations only, never
run). `from humanline.data import convert` is an edge to the module `humanline.data.convert`.
"""

from __future__ import annotations

import ast
from pathlib import Path

from helpers_train import ROOT

SRC = ROOT / "src"

# Lowest first; a module may import its own layer or lower ones (docs/design.md).
LAYERS = [
    ["humanline.errors", "humanline.yaml_io", "humanline.version", "humanline.core", "humanline.tiny"],
    ["humanline.objectives"],
    ["humanline.data", "humanline.model_call", "humanline.prefix", "humanline.forward", "humanline.decode",
     "humanline.rollout", "humanline.rewards", "humanline.reward_scoring",
     "humanline.oom", "humanline.distributed", "humanline.fsdp", "humanline.zero"],
    ["humanline.objective_specs"],
    ["humanline.config_checks"],
    ["humanline.config"],
    ["humanline.models", "humanline.reference", "humanline.online", "humanline.schedule", "humanline.checkpoint",
     "humanline.training_eval", "humanline.evaluation", "humanline.metrics_log", "humanline.run_dir",
     "humanline.run_info", "humanline.report", "humanline.diagnostics", "humanline.faults",
     "humanline.counters"],
    ["humanline.run_builder"],
    ["humanline.train"],
    ["humanline.integrations", "humanline.demo", "humanline.reproduce"],
    ["humanline.commands"],
    ["humanline.cli", "humanline.__main__", "humanline"],
]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted((SRC / "humanline").rglob("*.py"))}


def layer(module: str) -> int:
    best = max((prefix for group in LAYERS for prefix in group
                if module == prefix or module.startswith(prefix + ".")), key=len)
    return next(i for i, group in enumerate(LAYERS) if best in group)


def _type_checking_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", "")) == "TYPE_CHECKING":
            for child in node.body:
                lines.update(range(child.lineno, child.end_lineno + 1))
    return lines


def imports(module: str) -> list[tuple[str, int, bool]]:
    """`(imported humanline module, line, inside a function)` for each import of `module`."""
    tree = ast.parse(MODULES[module].read_text())
    skip = _type_checking_lines(tree)
    in_function = {n.lineno for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                   for n in ast.walk(f) if isinstance(n, (ast.Import, ast.ImportFrom))}
    out = []
    for node in ast.walk(tree):
        if node.lineno in skip if hasattr(node, "lineno") else True:
            continue
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in MODULES else node.module
                     for a in node.names]
        else:
            continue
        out += [(name, node.lineno, node.lineno in in_function) for name in names if name in MODULES]
    return out


GRAPH = {m: {name for name, _, _ in imports(m) if name != m} for m in MODULES}


def find_cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, out, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    return out


def test_every_module_has_a_layer():
    assert all(isinstance(layer(m), int) for m in MODULES)


def test_the_package_imports_form_no_cycle():
    assert find_cycles() == []


def test_no_import_points_up_the_layers():
    upward = [f"{m} -> {name} (line {line})" for m in MODULES for name, line, _ in imports(m)
              if layer(name) > layer(m) and not name.startswith(m + ".")]
    assert upward == []


def test_no_humanline_import_hides_inside_a_function():
    """Imports of humanline modules belong at the top of the file: inside a function they hide cycles."""
    hidden = [f"{m} -> {name} (line {line})" for m in MODULES for name, line, inside in imports(m)
              if inside]
    assert hidden == []
