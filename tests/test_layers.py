"""The layers DESIGN.md promises, checked on the source: every import of every project file
(module level and inside functions) is mapped to the project module it loads.

radix_cache/ imports only itself and the standard library; kernels/ imports nothing of the
runtime or the DSL; runtime/ imports no DSL module; no two project modules import each other,
directly or around a loop. Imports under `if TYPE_CHECKING:` never run, so they make no cycle.
No module imports another package's `_private` names (a package is a module's folder), and
runtime/server_args.py loads no feature package: only the leaves in SERVER_ARGS_LEAVES.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Source folder -> the package it is installed as (pyproject's package-dir).
PACKAGES = {"lang": "radixflow", "runtime": "radixflow.runtime",
            "radix_cache": "radixflow.radix_cache", "kernels": "radixflow.kernels",
            "bench": "bench"}
SUBSYSTEMS = ("radixflow.runtime", "radixflow.radix_cache", "radixflow.kernels")


def module_name(path: Path) -> str:
    folder, *rest = path.relative_to(ROOT).with_suffix("").parts
    if rest[-1] == "__init__":
        rest = rest[:-1]
    return ".".join([PACKAGES[folder], *rest])


@cache
def project_modules() -> dict[str, Path]:
    return {module_name(path): path
            for folder in PACKAGES for path in sorted((ROOT / folder).rglob("*.py"))}


def is_dsl(module: str) -> bool:
    return module.startswith("radixflow") and not module.startswith(SUBSYSTEMS)


def in_package(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST, *, type_checking: bool = False):
    """(import node, whether it sits under `if TYPE_CHECKING:`) for every import in `tree`."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, type_checking
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                yield from _imports(ast.Module([child], []), type_checking=True)
            for child in node.orelse:
                yield from _imports(ast.Module([child], []), type_checking=type_checking)
        else:
            yield from _imports(node, type_checking=type_checking)


def package_of(module: str) -> str:
    """The package a project module belongs to: its folder (a package's own __init__ too)."""
    path = project_modules()[module]
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def _from_base(module: str, node: ast.ImportFrom) -> str:
    """The absolute name of what `from ... import` reads from, in `module`."""
    base = node.module or ""
    if node.level:
        anchor = package_of(module).split(".")
        anchor = anchor[:len(anchor) - (node.level - 1)]
        base = ".".join(anchor + ([base] if base else []))
    return base


@cache
def _parsed_imports(module: str) -> tuple[tuple[ast.Import | ast.ImportFrom, bool], ...]:
    path = project_modules()[module]
    return tuple(_imports(ast.parse(path.read_text(), str(path))))


@cache
def imports_of(module: str) -> tuple[tuple[str, bool, int], ...]:
    """(imported module name, under TYPE_CHECKING, line) for each module `module` imports.

    `from pkg import name` names pkg.name where that is a project module, else pkg.
    """
    found = []
    for node, type_checking in _parsed_imports(module):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = _from_base(module, node)
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in project_modules()
                       else base for alias in node.names]
        found += [(target, type_checking, node.lineno) for target in targets]
    return tuple(found)


def project_imports(module: str, *, runtime_only: bool = False) -> set[str]:
    """The project modules `module` imports (runtime_only: leaving out TYPE_CHECKING ones)."""
    return {target for target, type_checking, _ in imports_of(module)
            if target in project_modules() and not (runtime_only and type_checking)}


def violations(package: str, allowed) -> list[str]:
    return sorted({f"{project_modules()[module].relative_to(ROOT)}:{line} imports {target}"
                   for module in project_modules() if in_package(module, package)
                   for target, _, line in imports_of(module) if not allowed(target)})


def test_every_project_file_is_seen():
    modules = project_modules()
    assert {"radixflow", "radixflow.runtime.scheduler.scheduler", "radixflow.radix_cache",
            "radixflow.kernels.cpu"} <= set(modules)
    assert "radixflow.radix_cache.radix_tree" in project_imports("radixflow.radix_cache")


def test_radix_cache_imports_only_itself_and_the_standard_library():
    def allowed(target: str) -> bool:
        top = target.split(".")[0]
        return in_package(target, "radixflow.radix_cache") or (
            top in sys.stdlib_module_names and top != "radixflow")

    assert violations("radixflow.radix_cache", allowed) == []


def test_kernels_import_nothing_of_the_runtime_or_the_dsl():
    def allowed(target: str) -> bool:
        return not in_package(target, "radixflow.runtime") and not is_dsl(target)

    assert violations("radixflow.kernels", allowed) == []


def test_runtime_imports_no_dsl_module():
    assert violations("radixflow.runtime", lambda target: not is_dsl(target)) == []


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iteratively: the components of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return components


def test_the_cycle_finder_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert _strongly_connected(graph) == [["a", "b", "c"]]


def test_no_import_cycles_between_project_modules():
    graph = {module: project_imports(module, runtime_only=True) - {module}
             for module in project_modules()}
    assert _strongly_connected(graph) == []


@pytest.mark.parametrize("module", ["radixflow.runtime.scheduler.scheduler",
                                    "radixflow.runtime.server.http_server"])
def test_importing_the_runtime_loads_no_dsl_module(module):
    code = (f"import sys, {module}; "
            "print(sorted(m for m in sys.modules if m.startswith('radixflow') and "
            f"not m.startswith({SUBSYSTEMS!r}) and m != 'radixflow'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


def is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_reach(module: str, source: str | None = None) -> list[str]:
    """The `_private` names `module` (or `source` read as that module) imports from a package
    other than its own: `from x import _y` (a name or a module of x), or `import a._b`."""
    nodes = (_parsed_imports(module) if source is None
             else tuple(_imports(ast.parse(source))))
    found = []
    for node, _ in nodes:
        if isinstance(node, ast.ImportFrom):
            base = _from_base(module, node)
            owner = package_of(base) if base in project_modules() else None
            found += [f"{base}.{alias.name}" for alias in node.names
                      if owner is not None and is_private(alias.name)
                      and owner != package_of(module)]
        else:
            for alias in node.names:
                parts = alias.name.split(".")
                found += [alias.name for i, part in enumerate(parts)
                          if i and is_private(part) and alias.name in project_modules()
                          and ".".join(parts[:i]) != package_of(module)]
    return found


def test_the_private_reach_finder_finds_one():
    source = ("from ..processes import _hidden, fast_exit\n"
              "from .state import _mine\n"  # the module's own folder: fine
              "from radixflow.runtime.server import __doc__\n")
    assert private_reach("radixflow.runtime.server.launch", source) == [
        "radixflow.runtime.processes._hidden"]


def test_no_module_imports_another_packages_private_names():
    reach = sorted(f"{project_modules()[module].relative_to(ROOT)} imports {name}"
                   for module in project_modules() for name in private_reach(module))
    assert reach == []


# runtime/server_args.py is read by every process and every package, so it sits at the bottom
# of the import graph: from the project it loads only these leaves (each imports nothing of
# the project outside this set: the closure below), and the layers under the runtime
# (kernels/, radix_cache/), which import nothing of it. No feature package (server,
# scheduler, constrained, distributed, router, ...) and nothing that imports one.
SERVER_ARGS_LEAVES = frozenset({
    "radixflow.runtime.errors", "radixflow.runtime.version",
    "radixflow.runtime.chat_template",  # --chat-template
    "radixflow.runtime.parallel_flags",  # --tp-size, --nnodes, --dist-init-addr, --dp-size
    "radixflow.runtime.reasoning",  # --reasoning-parser's names
    "radixflow.runtime.tool_call_formats",  # --tool-call-parser's names
    "radixflow.runtime.server_flags",  # the CLI generated from the fields
    "radixflow.runtime.balance", "radixflow.runtime.balance.config",  # the routing flags
    "radixflow.runtime.speculative", "radixflow.runtime.speculative.config",  # --speculative-*
})
LOWER_LAYERS = ("radixflow.kernels", "radixflow.radix_cache")


def loaded_by(module: str) -> set[str]:
    """The project modules importing `module` runs, at import or in its functions: its
    imports, theirs, and the __init__ of each one's packages (bar the root packages)."""
    roots = {"radixflow", "radixflow.runtime"}
    seen: set[str] = set()
    todo = [module]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        parents = [".".join(current.split(".")[:i]) for i in range(1, current.count(".") + 1)]
        todo += [m for m in project_imports(current, runtime_only=True) | set(parents)
                 if m in project_modules() and m not in roots]
    return seen - {module}


def test_server_args_loads_no_feature_package():
    features = sorted(m for m in loaded_by("radixflow.runtime.server_args")
                      if m not in SERVER_ARGS_LEAVES
                      and not any(in_package(m, layer) for layer in LOWER_LAYERS))
    assert features == []


# Test folders that are not a source folder: shared helpers and data files.
TEST_SUPPORT = {"helpers", "data"}


def test_tests_mirror_the_source_tree():
    """Each folder of tests/ names a source folder (tests/runtime/scheduler tests
    runtime/scheduler, tests/bench tests bench/), so a module's tests are found by its path."""
    tests = ROOT / "tests"
    strays = []
    for folder in sorted(p for p in tests.rglob("*") if p.is_dir()):
        rel = folder.relative_to(tests)
        if rel.parts[0] in TEST_SUPPORT or "__pycache__" in rel.parts:
            continue
        if not (ROOT / rel).is_dir() or rel.parts[0] not in PACKAGES:
            strays.append(str(rel))
    assert strays == [], f"test folders with no source folder of that path: {strays}"
    assert sorted(p.name for p in tests.glob("test_*.py")) == ["test_layers.py"]


def test_every_source_folder_is_an_installed_package():
    """pyproject lists its packages by name: a new folder missing there works in an editable
    install (and so in CI) but is absent from a wheel."""
    tomllib = pytest.importorskip("tomllib")
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
                 ["packages"])
    folders = {module_name(init) for folder in PACKAGES if folder != "bench"
               for init in (ROOT / folder).rglob("__init__.py")}
    assert sorted(folders - listed) == []


def test_the_checkout_root_hides_no_installed_package():
    """`python -m ...` from the checkout puts its root first on sys.path; importing radixflow
    moves it last, so its kernels/ folder does not hide PyPI's `kernels` (transformers 5's)."""
    probe = ("import importlib.util, radixflow; spec = importlib.util.find_spec('kernels'); "
             "print(spec.origin if spec else '')")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout.strip()
    assert Path(out or "/nowhere").resolve() != (ROOT / "kernels" / "__init__.py")
