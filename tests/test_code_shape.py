"""The shape the code keeps: no function in the library (src/) or the environments (envs/src/) is over 80 lines, so
each can be read at once (issue 32); the training step's phases stay under 60; no class is over 400 lines, and no
two of sdar's packages import each other (issue 39)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _functions(root: Path):
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield path.relative_to(ROOT), node.name, node.end_lineno - node.lineno + 1


def test_no_function_is_over_80_lines():
    long = [f"{path}: {name} ({n} lines)" for root in ("src", "envs/src") for path, name, n in _functions(ROOT / root)
            if n > 80]
    assert long == [], "split these:\n" + "\n".join(long)


def test_the_training_steps_phases_are_short():
    """The Trainer is the step (issue 39): its phases, each under 60 lines, and the class under 300; the update's
    parts and the step's metrics beside it are short too."""
    from sdar.train.trainer import Trainer
    from sdar.train.update import Updater

    phases = {"trainer.py": ("train_step", "rollout_phase", "score_phase", "update_phase"),
              "update.py": ("run", "_mini_batch", "_accumulate", "_apply", "_micro_loss"), "metrics.py": ("step_metrics",)}
    lengths = {(path.name, name): n for path, name, n in _functions(ROOT / "src" / "sdar" / "train")}
    assert all(hasattr(Trainer, p) for p in phases["trainer.py"]) and all(hasattr(Updater, p) for p in phases["update.py"])
    assert {(f, p): lengths[f, p] for f, names in phases.items() for p in names if lengths[f, p] > 60} == {}
    (trainer,) = [n for path, name, n in _classes(ROOT / "src" / "sdar" / "train") if name == "Trainer"]
    assert trainer <= 300, f"Trainer is {trainer} lines: move what is not the step beside it"


def _classes(root: Path):
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                yield path.relative_to(ROOT), node.name, node.end_lineno - node.lineno + 1


def test_no_class_is_over_400_lines():
    """A limit on functions alone moves code into methods, not into rooms: a class has a length too (issue 39)."""
    long = [f"{path}: {name} ({n} lines)" for root in ("src", "envs/src") for path, name, n in _classes(ROOT / root)
            if n > 400]
    assert long == [], "give these classes' other jobs rooms of their own:\n" + "\n".join(long)


# ---- the import graph between sdar's packages ----------------------------------------------------
SDAR = ROOT / "src" / "sdar"


def _unit(module: str) -> str:
    """The package (or top-level module) a dotted sdar module belongs to: sdar.train.trainer -> sdar.train."""
    return ".".join(module.split(".")[:2])


def _imported(node: ast.AST, module: str, is_package: bool, src: Path) -> list[str]:
    """The sdar modules an import statement (or an importlib.import_module call) names."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom):
        if node.level:  # relative: from the module's own package upwards
            base = module.split(".")[: len(module.split(".")) - (node.level - (1 if is_package else 0))]
            target = ".".join(base + ([node.module] if node.module else []))
        else:
            target = node.module or ""
        if target == "sdar":  # `from sdar import config`: a subpackage or module by name, else the root's own
            return [f"sdar.{a.name}" if (src / a.name).is_dir() or (src / f"{a.name}.py").is_file() else "sdar"
                    for a in node.names]
        return [target]
    if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module" \
            and node.args:
        arg = node.args[0]
        text = arg.value if isinstance(arg, ast.Constant) else (
            arg.values[0].value if isinstance(arg, ast.JoinedStr) and arg.values and
            isinstance(arg.values[0], ast.Constant) else "")
        return [text.rstrip(".")] if isinstance(text, str) and text.count(".") >= 2 else []
    return []


def package_imports(src: Path = SDAR) -> dict[tuple[str, str], list[str]]:
    """(importing package, imported package) -> the modules whose imports make that edge: every import in
    src/sdar, at module level and inside functions alike, collapsed to sdar.<package> (or sdar.<module> for a
    top-level module)."""
    edges: dict[tuple[str, str], list[str]] = {}
    for path in sorted(src.rglob("*.py")):
        parts = list(path.relative_to(src.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        module = ".".join(parts[:-1] if is_package else parts)
        for node in ast.walk(ast.parse(path.read_text())):
            for target in _imported(node, module, is_package, src):
                if (target == "sdar" or target.startswith("sdar.")) and _unit(target) != _unit(module):
                    edges.setdefault((_unit(module), _unit(target)), []).append(module)
    return edges


def package_cycles(edges) -> list[list[str]]:
    """The groups of packages that import one another, directly or through others (strongly connected
    components of more than one package)."""
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def test_no_import_cycle_between_packages():
    """The layers hold (STYLE.md: config -> pipeline -> component -> library): no two of sdar's packages import
    each other, directly or round a ring; each cycle is named with the modules that make its edges."""
    edges = package_imports()
    cycles = package_cycles(edges)
    shown = []
    for group in cycles:
        members = set(group)
        shown.append(" <-> ".join(group) + ":\n" + "\n".join(
            f"    {a} -> {b} ({', '.join(sorted(set(mods)))})" for (a, b), mods in sorted(edges.items())
            if a in members and b in members))
    assert cycles == [], "packages that import each other (move the shared part down a layer):\n" + "\n".join(shown)


def test_the_import_graph_sees_function_level_imports(tmp_path):
    pkg = tmp_path / "sdar"
    for name, text in {"__init__.py": "", "a/__init__.py": "from sdar.b.x import f\n",
                       "b/__init__.py": "", "b/x.py": "def f():\n    from sdar.a import g\n",
                       "c.py": "import importlib\nimportlib.import_module('sdar.a.y')\nfrom sdar import b\n"}.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(text)
    edges = package_imports(pkg)
    assert set(edges) == {("sdar.a", "sdar.b"), ("sdar.b", "sdar.a"), ("sdar.c", "sdar.a"), ("sdar.c", "sdar.b")}
    assert package_cycles(edges) == [["sdar.a", "sdar.b"]]
