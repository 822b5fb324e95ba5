"""The layers import downward only ("Layers" in docs/runtime.md): the base package `teraio`
(formats, walk, units, errors, settings, launch) imports no stage, the stages import no app,
and of the stages only the ones named below may see each other. A stage that reaches into the
app, or a base module that imports a stage, makes `import teraio_plan` drag in the runtime (or
torch) and ties the three steps together beyond their files."""

import ast
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "teraio" / "app"

# What each layer must not import (a name or any module below it).
FORBIDDEN = {
    "teraio": ("teraio_profile", "teraio_plan", "teraio_run", "teraio.app"),
    "teraio_plan": ("teraio_profile", "teraio_run", "teraio.app"),
    "teraio_profile": ("teraio_run", "teraio.app"),
    "teraio_run": ("teraio_profile", "teraio.app"),
}


def layer_files(layer: str) -> list[Path]:
    files = sorted((ROOT / layer).rglob("*.py"))
    if layer == "teraio":  # __main__.py is `python -m teraio`, the app's entry: nothing imports it
        files = [f for f in files if APP not in f.parents and f.name != "__main__.py"]
    return files


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """Every module a file imports, lazily inside functions too; `from a import b` names both
    a and a.b (b may be a module)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def violations(layer: str) -> list[str]:
    bad = []
    for path in layer_files(layer):
        for line, module in imported_modules(path):
            for forbidden in FORBIDDEN[layer]:
                if module == forbidden or module.startswith(forbidden + "."):
                    bad.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    return bad


def test_the_base_layer_imports_no_stage_and_no_app():
    assert len(layer_files("teraio")) > 10  # the walk, formats, settings... are all seen
    assert violations("teraio") == []


def test_the_stages_import_no_app_and_only_the_stages_they_may():
    for stage in ("teraio_profile", "teraio_plan", "teraio_run"):
        assert layer_files(stage), stage
        assert violations(stage) == [], stage


def test_jobs_get_the_apps_bootstrap_and_an_install_carries_it():
    # a wrong folder here and every `teraio run` trains without its agent
    from teraio.launch import child_env
    from teraio.settings import Settings

    first = Path(child_env(Settings(mode="run"))["PYTHONPATH"].split(os.pathsep)[0])
    assert first == APP / "bootstrap" / "pythonpath"
    assert "from teraio.app.bootstrap import arm" in (first / "sitecustomize.py").read_text()
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'teraio = "teraio.app.cli:main"' in pyproject
    assert '"app/bootstrap/pythonpath/*.py"' in pyproject
