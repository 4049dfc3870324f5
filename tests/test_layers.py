"""The import rules of docs/architecture.md ("Layers and imports"), read from the source with `ast`.

Every import of a project module counts, wherever it is written (at the top, inside a function, or under
`if TYPE_CHECKING:`), so an import moved into a function cannot hide a cycle. A deliberately added cycle fails
`test_no_module_imports_itself_through_others`: with `from hpo.engine.study import Study` added to
`hpo/experiment/arms.py` it reports `hpo.experiment.arms -> hpo.engine.study -> hpo.experiment.arms`;
`test_a_cycle_is_found` shows the same on a two-module package.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("trainer", "search_spaces", "hpo", "server")

# module prefix -> project modules (prefixes) it must never import, and why
FORBIDDEN = {
    "trainer": (("hpo", "search_spaces", "server"), "the trainer is the production program; it needs nothing else"),
    "search_spaces": (("trainer", "hpo", "server"), "the search-space model stands alone"),
    "hpo": (("server",), "the server is above the control plane"),
}
# The command line is the top of everything: `hpo serve` starts the server.
EXEMPT = {"hpo.cli.serve": ("server",)}

# The layers of `hpo`, bottom first, as docs/architecture.md draws them: a module imports only its own layer
# and the layers before it. A module is in the layer of its longest matching prefix, so a package (its
# `__init__`) sits where its top modules do and a low module of it (`hpo.trial.launch`) can sit below.
HPO_LAYERS = (
    ("hpo.errors", "hpo.limits", "hpo.files", "hpo.interpreter", "hpo.trials", "hpo.objective"),
    (
        "hpo.storage",
        "hpo.engine.liveness",
        "hpo.runners.resources",
        "hpo.trial.launch",
        "hpo.trial.exit",
        "hpo.simulation",
    ),
    ("hpo.experiment.schema",),
    ("hpo.experiment.arms",),
    ("hpo.nni.config",),
    ("hpo.experiment",),
    ("hpo.controllers", "hpo.nni.tuners", "hpo.nni.seeded"),
    ("hpo.runners", "hpo.trial", "hpo.export", "hpo.mlperf"),
    ("hpo.evidence", "hpo.engine", "hpo.report"),
    ("hpo.engine.local", "hpo.plan", "hpo.nni", "hpo.cli", "hpo.__main__"),
)


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache
def parse(source: str, filename: str) -> ast.Module:
    """A module's syntax tree, parsed once for every test that reads the module (by its text: a file written anew
    is parsed anew). The trees are only read."""
    return ast.parse(source, filename)


@functools.cache
def import_nodes(source: str, filename: str, when_imported: bool) -> tuple[ast.Import | ast.ImportFrom, ...]:
    """The import statements of a module, anywhere in its file, or (`when_imported`) those that run when it is
    imported."""
    tree = parse(source, filename)
    nodes = _run_on_import(tree) if when_imported else ast.walk(tree)
    return tuple(node for node in nodes if isinstance(node, (ast.Import, ast.ImportFrom)))


def import_graph(root: Path, packages: tuple[str, ...], when_imported: bool = False) -> dict[str, set[str]]:
    """Project module -> the project modules it imports (anywhere in its file). `when_imported`: only what runs
    when the module is imported (not the imports inside its functions), and the packages that importing those runs
    first (see `with_packages`)."""
    modules = {module_name(p, root): p for pkg in packages for p in (root / pkg).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets: set[str] = set()
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in import_nodes(path.read_text(), str(path), when_imported):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: resolve against this module's package
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                targets.add(base)
                targets.update(f"{base}.{alias.name}" for alias in node.names)  # `from pkg import module`
        graph[name] = {t for t in targets if t in modules and t != name}
    return with_packages(graph) if when_imported else graph


def _run_on_import(tree: ast.AST):
    """The nodes of a module that run when it is imported: all but the bodies of its functions."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        todo.extend(c for c in ast.iter_child_nodes(node) if not isinstance(c, (ast.FunctionDef, ast.AsyncFunctionDef)))


def with_packages(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Importing a.b.c runs the packages a and a.b first (their __init__), unless they are the importing module's
    own (those are being imported already when it runs): a package whose __init__ imports modules of the project is
    a step of the path too."""
    for name, imported in graph.items():
        own = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
        parents = {".".join(t.split(".")[:i]) for t in imported for i in range(1, t.count(".") + 1)}
        imported |= {p for p in parents - own if graph.get(p) and p != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path `a, b, ..., a`, or None (depth-first search, deterministic order)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def test_no_module_imports_itself_through_others():
    cycle = find_cycle(import_graph(ROOT, PACKAGES))
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_every_module_imports_first_without_a_cycle_through_a_package():
    """What runs when a module is imported, packages' __init__ included: a cycle there fails the import of the
    module that starts it (`import hpo.nni.config` failed on hpo.nni.config -> hpo.experiment, the package, whose
    checks import hpo.nni.config; only the order in which other modules imported them hid it)."""
    cycle = find_cycle(import_graph(ROOT, PACKAGES, when_imported=True))
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_packages_import_only_downward():
    graph = import_graph(ROOT, PACKAGES)
    broken = [
        f"{module} imports {target} ({why})"
        for module, targets in sorted(graph.items())
        for prefix, (banned, why) in FORBIDDEN.items()
        if _within(module, prefix)
        for target in sorted(targets)
        if any(_within(target, b) for b in banned) and not any(_within(target, e) for e in EXEMPT.get(module, ()))
    ]
    assert broken == []


def hpo_layer(module: str) -> int | None:
    """The index in HPO_LAYERS of `module` (its longest matching prefix); None for the `hpo` package itself."""
    matches = [(len(p), i) for i, layer in enumerate(HPO_LAYERS) for p in layer if _within(module, p)]
    return max(matches)[1] if matches else None


def test_every_hpo_module_has_a_layer():
    graph = import_graph(ROOT, PACKAGES)
    assert [m for m in sorted(graph) if _within(m, "hpo") and m != "hpo" and hpo_layer(m) is None] == []


def test_hpo_layers_import_only_downward():
    graph = import_graph(ROOT, PACKAGES)
    upward = [
        f"{module} (layer {hpo_layer(module)}) imports {target} (layer {hpo_layer(target)})"
        for module, targets in sorted(graph.items())
        if _within(module, "hpo") and hpo_layer(module) is not None
        for target in sorted(targets)
        if hpo_layer(target) is not None and hpo_layer(target) > hpo_layer(module)
    ]
    assert upward == []


def test_a_cycle_is_found(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "a.py").write_text("def f():\n    from pkg.b import g  # hidden in a function\n")
    (tmp_path / "pkg" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import a\n"
    )
    graph = import_graph(tmp_path, ("pkg",))
    assert graph == {"pkg": set(), "pkg.a": {"pkg.b"}, "pkg.b": {"pkg", "pkg.a"}}
    assert find_cycle(graph) == ["pkg.a", "pkg.b", "pkg.a"]
    (tmp_path / "pkg" / "b.py").write_text("import os\n")
    assert find_cycle(import_graph(tmp_path, ("pkg",))) is None


# third-party package -> the project modules (prefixes) that alone may import it, and why
THIRD_PARTY = {
    "smac": (("hpo.controllers.smac",), "the SMAC3 adapter; NNI's SMAC tuner goes through it"),
    "ConfigSpace": (("hpo.controllers.smac", "search_spaces.configspace"), "SMAC3's adapter and the converter"),
    "nni": (("hpo.nni",), "the NNI engine"),
}


def third_party_importers(root: Path, packages: tuple[str, ...], package: str) -> set[str]:
    """The project modules that import third-party `package` (or a module of it), anywhere in their file."""
    found = set()
    for path in (p for pkg in packages for p in (root / pkg).rglob("*.py")):
        for node in import_nodes(path.read_text(), str(path), False):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:  # a relative import is the project's own
                names = [node.module or ""]
            else:
                continue
            if any(_within(name, package) for name in names):
                found.add(module_name(path, root))
    return found


def test_smac_configspace_and_nni_are_imported_only_by_their_adapters():
    for package, (allowed, why) in THIRD_PARTY.items():
        strays = {m for m in third_party_importers(ROOT, PACKAGES, package) if not any(_within(m, a) for a in allowed)}
        assert not strays, f"{package} is imported by {sorted(strays)}; only {', '.join(allowed)} may ({why})"


def test_a_stray_third_party_import_is_found(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "a.py").write_text("def f():\n    from smac.facade import HPOFacade  # hidden in a function\n")
    (tmp_path / "pkg" / "b.py").write_text("import smacker\nfrom . import a\n")  # another package; a relative one
    assert third_party_importers(tmp_path, ("pkg",), "smac") == {"pkg.a"}
