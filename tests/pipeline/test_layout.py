"""The pipeline's layout (issue 32): every KFP component is a thin shell over the library (at most 60 lines a
file), the library (src/) never edits sys.path nor imports the DAG's package pipelines/, and it reaches the
DAG through the entry point pyproject.toml registers."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_every_component_file_is_a_thin_shell():
    files = sorted((ROOT / "components").glob("*.py"))
    assert len(files) >= 10
    long = {f.name: n for f in files if (n := len(f.read_text().splitlines())) > 60}
    assert long == {}, "a component parses its inputs, calls one sdar.pipeline function and writes its outputs"


def _bound_by_imports(nodes) -> set[str]:
    return {alias.asname or alias.name.split(".")[0] for node in nodes if isinstance(node, (ast.Import, ast.ImportFrom))
            for alias in node.names}


def test_components_import_inside_their_function_and_call_the_library():
    """KFP runs a lightweight component's function source alone in a fresh process: what its body uses, the body
    imports (the module's imports serve the signature and the decorator only), and the work is sdar.pipeline's."""
    import components

    for comp in components.ALL:
        module = ast.parse(Path(inspect.getsourcefile(comp.python_func)).read_text())
        (func,) = [n for n in module.body if isinstance(n, ast.FunctionDef)]
        inner = list(ast.walk(ast.Module(body=func.body, type_ignores=[])))
        used = {n.id for n in inner if isinstance(n, ast.Name)}
        assert not used & _bound_by_imports(module.body) - _bound_by_imports(inner), func.name
        libraries = {n.module for n in inner if isinstance(n, ast.ImportFrom)}
        assert libraries & {"sdar.pipeline.steps", "sdar.pipeline.evaluation", "sdar.pipeline.services"}, func.name


def _library_modules():
    for path in sorted((ROOT / "src").rglob("*.py")):
        yield path.relative_to(ROOT), ast.parse(path.read_text())


def test_the_library_never_edits_sys_path_nor_imports_pipelines():
    bad = []
    for path, tree in _library_modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name) \
                    and node.value.id == "sys":
                bad.append(f"{path}:{node.lineno}: sys.path")
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
                    "import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant):
                names.append(str(node.args[0].value))
            bad += [f"{path}:{node.lineno}: imports {n}" for n in names if n.split(".")[0] == "pipelines"]
    assert bad == [], "\n".join(bad)


def test_the_entry_point_resolves_to_the_dag():
    from pipelines.sdar_comparison import build_pipeline
    from sdar.pipeline.runner import PipelineNotFound, load_pipeline, pipelines
    from sdar.pipeline.settings import PIPELINE_NAME

    assert PIPELINE_NAME in pipelines()
    assert load_pipeline() is build_pipeline
    assert load_pipeline(PIPELINE_NAME)("local").name == PIPELINE_NAME
    with pytest.raises(PipelineNotFound, match="no pipeline 'nope'.*pip install -e"):
        load_pipeline("nope")


def test_the_dag_module_holds_only_the_dag():
    import pipelines.sdar_comparison as dag

    defined = {n for n, v in vars(dag).items() if callable(v) and getattr(v, "__module__", "") == dag.__name__}
    assert defined == {"build_pipeline"}
