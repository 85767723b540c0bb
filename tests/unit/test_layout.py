"""The layering rules of docs/architecture.md, checked on the source (ast, every import, lazy ones included).

- no import cycles between clusterrun's modules;
- the pure core (config/, plan, states, errors, events, outcome) imports nothing from the edges;
- only transport/ imports paramiko or fabric;
- only cli/ and ui/ print or exit (the host program in remote/ speaks on its own stdout: it is exempt);
- remote/host/ is stdlib only and imports nothing from the controller.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from typing import Dict, Iterator, Set, Tuple

PKG = Path(__file__).resolve().parents[2] / "clusterrun"
CORE = ("clusterrun.config", "clusterrun.plan", "clusterrun.states", "clusterrun.errors", "clusterrun.events",
        "clusterrun.outcome")
EDGES = ("clusterrun.launch", "clusterrun.hosts", "clusterrun.transport", "clusterrun.registry", "clusterrun.check",
         "clusterrun.sweep", "clusterrun.clean", "clusterrun.cli", "clusterrun.ui", "clusterrun.remote")
PRINTERS = ("clusterrun.cli", "clusterrun.ui")


def module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def modules() -> Dict[str, Tuple[Path, ast.Module]]:
    return {module_name(p): (p, ast.parse(p.read_text(), str(p))) for p in sorted(PKG.rglob("*.py"))}


def imports(name: str, path: Path, tree: ast.Module) -> Iterator[Tuple[str, int]]:
    """Every module imported anywhere in the file, absolute, with its line."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            yield target, node.lineno
            for alias in node.names:  # `from . import x` imports the module x
                yield f"{target}.{alias.name}", node.lineno


def under(name: str, prefixes) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def graph() -> Dict[str, Set[str]]:
    mods = modules()
    out: Dict[str, Set[str]] = {}
    for name, (path, tree) in mods.items():
        out[name] = {t for t, _ in imports(name, path, tree) if t in mods and t != name}
    return out


def test_no_import_cycles():
    g = graph()
    # a package's __init__ importing its own modules is the package, not a cycle
    edges = {m: {t for t in ts if not m.startswith(t + ".")} for m, ts in g.items()}
    state: Dict[str, int] = {}
    stack = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for t in sorted(edges[m]):
            if state.get(t) == 1:
                raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(t):] + [t]))
            if t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    sys.setrecursionlimit(10000)
    for m in sorted(edges):
        if m not in state:
            visit(m)


def test_pure_core_imports_no_edge():
    bad = []
    for name, (path, tree) in modules().items():
        if not under(name, CORE):
            continue
        for target, line in imports(name, path, tree):
            if under(target, EDGES) or target.split(".")[0] in ("paramiko", "fabric", "rich", "click", "sqlite3"):
                bad.append(f"{path.relative_to(PKG.parent)}:{line} imports {target}")
    assert not bad, "the pure core must not reach the edges:\n" + "\n".join(bad)


def test_only_transport_imports_paramiko_or_fabric():
    bad = [f"{path.relative_to(PKG.parent)}:{line} imports {target}"
           for name, (path, tree) in modules().items() if not under(name, ("clusterrun.transport",))
           for target, line in imports(name, path, tree) if target.split(".")[0] in ("paramiko", "fabric", "invoke")]
    assert not bad, "\n".join(bad)


def _prints_or_exits(tree: ast.Module) -> Iterator[Tuple[int, str]]:
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Name) and f.id in ("print", "exit", "quit"):
            yield node.lineno, f.id
        elif isinstance(f, ast.Attribute):
            owner = ast.unparse(f.value)
            if (owner, f.attr) in (("sys", "exit"), ("os", "_exit"), ("click", "echo"), ("click", "secho")) or \
                    (owner in ("sys.stdout", "sys.stderr", "sys.stdout.buffer", "sys.stderr.buffer")
                     and f.attr == "write") or f.attr == "Console":
                yield node.lineno, f"{owner}.{f.attr}"


def test_only_cli_and_ui_print_or_exit():
    bad = []
    for name, (path, tree) in modules().items():
        if under(name, PRINTERS + ("clusterrun.remote", "clusterrun.__main__")):
            continue
        bad += [f"{path.relative_to(PKG.parent)}:{line}: {what}" for line, what in _prints_or_exits(tree)]
    assert not bad, "only cli/ and ui/ print or exit:\n" + "\n".join(bad)


def test_cli_exits_in_one_place():
    exits = [f"{path.relative_to(PKG.parent)}:{line}" for name, (path, tree) in modules().items()
             if under(name, ("clusterrun.cli", "clusterrun.ui"))
             for line, what in _prints_or_exits(tree) if what in ("sys.exit", "exit", "quit", "os._exit")]
    assert exits == ["clusterrun/cli/__init__.py:" + exits[0].rsplit(":", 1)[1]] and len(exits) == 1, exits


def test_host_program_is_stdlib_only_and_stands_alone():
    stdlib = set(sys.stdlib_module_names)
    bad = []
    for name, (path, tree) in modules().items():
        if not under(name, ("clusterrun.remote.host",)):
            continue
        for target, line in imports(name, path, tree):
            top = target.split(".")[0]
            if top == "clusterrun":
                if not under(target, ("clusterrun.remote.host",)):
                    bad.append(f"{path.relative_to(PKG.parent)}:{line} imports {target}")
            elif top not in stdlib:
                bad.append(f"{path.relative_to(PKG.parent)}:{line} imports {target} (not stdlib)")
    assert not bad, "\n".join(bad)


def test_folder_list_shows_the_design():
    top = sorted(p.stem for p in PKG.glob("*.py"))
    assert top == ["__init__", "__main__", "errors", "events", "outcome", "plan", "states"], top
    packages = sorted(p.name for p in PKG.iterdir() if (p / "__init__.py").exists())
    assert packages == ["check", "clean", "cli", "config", "hosts", "launch", "registry", "remote", "sweep", "transport",
                        "ui"], packages
