"""The package's layers import one way only, bottom up (README "Package map")."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import ROOT

PACKAGE = ROOT / "src/headlab"
# Lower number = lower layer; a module may import its own layer and the layers below.
LAYERS = {"errors": 0, "files": 0, "requirements": 0, "core": 1, "tasks": 2, "reporting": 3, "training": 4,
          "analysis": 5, "study": 6, "cli": 7}


def layer_of(module: str) -> int:
    return LAYERS[module.split(".")[1]]


def headlab_imports(path: Path) -> set[str]:
    """Every headlab module ``path`` imports, at the top or inside functions."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("headlab."):
            found |= {submodule if is_module(submodule := f"{node.module}.{alias.name}") else node.module
                      for alias in node.names}  # from a package import its modules: those modules
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("headlab.")}
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("headlab."):
            found.add(node.value.split(":")[0])  # lazy "module:function" references (MODES)
    return {name for name in found if name.split(".")[1] in LAYERS}


def is_module(name: str) -> bool:
    path = PACKAGE.joinpath(*name.split(".")[1:])
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def test_every_module_belongs_to_a_layer():
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        assert parts == ("__init__",) or parts[0] in LAYERS, f"{path} is in no layer of {list(LAYERS)}"


def test_imports_run_bottom_up():
    upward = []
    for path in PACKAGE.rglob("*.py"):
        module = ".".join(("headlab", *path.relative_to(PACKAGE).with_suffix("").parts))
        if module == "headlab.__init__":
            continue  # the public API re-exports (lazily) from every layer
        upward += [f"{module} -> {name}" for name in headlab_imports(path) if layer_of(name) > layer_of(module)]
    assert not upward, "imports that go up a layer: " + ", ".join(upward)


def module_name(path: Path) -> str:
    return ".".join(("headlab", *path.relative_to(PACKAGE).with_suffix("").parts)).removesuffix(".__init__")


def test_no_circle_of_imports():
    """No module reaches itself through the modules it imports (lazy imports inside functions count)."""
    graph = {module_name(path): headlab_imports(path) for path in PACKAGE.rglob("*.py")}
    circles = []

    def visit(module: str, path: list[str], done: set[str]) -> None:
        for name in sorted(graph.get(module, ())):
            if name in path:
                circles.append(" -> ".join([*path[path.index(name):], name]))
            elif name not in done:
                visit(name, [*path, name], done)
        done.add(module)

    done: set[str] = set()
    for module in sorted(graph):
        visit(module, [module], done)
    assert not circles, "circles of imports: " + "; ".join(circles)


def test_folders_and_modules_stay_small():
    """A folder holds at most about 15 modules (one sub-package per question past that), a module at most ~400
    lines (README "Layout")."""
    for folder in {path.parent for path in PACKAGE.rglob("*.py")}:
        modules = [path.name for path in folder.glob("*.py") if path.name != "__init__.py"]
        assert len(modules) <= 15, f"{folder}: {len(modules)} modules"
    long = {str(path): n for path in PACKAGE.rglob("*.py") if (n := len(path.read_text().splitlines())) > 400}
    assert not long, long


def test_import_headlab_is_light():
    """The command line checks configs before torch loads: ``import headlab`` must not pull it in."""
    import subprocess
    import sys

    code = "import sys, headlab, headlab.cli.train, headlab.cli.ablate; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_every_mode_has_a_light_check_and_a_run():
    """ablate.py's modes share one interface: check(cfg), in a module that imports neither torch nor transformers
    nor Lightning (a bad config answers before they load), and run(cfg, output_dir)."""
    import inspect
    import subprocess
    import sys

    from headlab.analysis.modes import ANALYSIS_MODES, function_at

    for mode, where in ANALYSIS_MODES.items():
        assert list(inspect.signature(function_at(where.check)).parameters) == ["cfg"], mode
        assert list(inspect.signature(function_at(where.run)).parameters)[:2] == ["cfg", "output_dir"], mode
    checks = sorted({where.check.split(":")[0] for where in ANALYSIS_MODES.values()})
    code = (f"import sys; [__import__(name) for name in {checks!r}]; "
            "print(sorted(name for name in ('torch', 'transformers', 'lightning') if name in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]", result.stdout
