"""The rules of docs/architecture.md, checked on the source (ast, every import, lazy ones included). The
"may import" column of its folder table is read from the page itself: the page is the data.

1. no import cycles between clusterrun's modules;
2. every import between folders is one the table allows (the pure core reaches no edge);
3. only transport/ imports paramiko or fabric;
4. only cli/ and ui/ print or exit (the host program in remote/ speaks on its own stdout: it is exempt);
5. remote/host/ is stdlib only, imports nothing from the controller, and within it every import goes down
   its layers (the page's layers table);
6. host work fans out through hosts.group (no other thread pools or threads);
7. a run's end is decided in outcome.py only.
"""

from __future__ import annotations

import ast
import functools
import sys
from pathlib import Path
from typing import Dict, Iterator, Set, Tuple

PKG = Path(__file__).resolve().parents[2] / "clusterrun"
ARCHITECTURE = PKG.parent / "docs" / "architecture.md"
CORE = ("clusterrun.config", "clusterrun.plan", "clusterrun.states", "clusterrun.errors", "clusterrun.events",
        "clusterrun.stacks", "clusterrun.outcome")
EDGES = ("clusterrun.launch", "clusterrun.hosts", "clusterrun.transport", "clusterrun.registry", "clusterrun.runs",
         "clusterrun.check", "clusterrun.sweep", "clusterrun.clean", "clusterrun.cli", "clusterrun.ui", "clusterrun.remote")
PRINTERS = ("clusterrun.cli", "clusterrun.ui")


def module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


@functools.lru_cache(maxsize=None)  # the source does not change during a session: parse it once, not per test
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


SHARED_WITH_HOSTS = ("clusterrun.remote.host.words",)  # pure, stdlib only: the one text of a run's end


def test_pure_core_imports_no_edge():
    bad = []
    for name, (path, tree) in modules().items():
        if not under(name, CORE):
            continue
        for target, line in imports(name, path, tree):
            if under(target, SHARED_WITH_HOSTS):
                continue
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
    assert top == ["__init__", "__main__", "errors", "events", "outcome", "plan", "stacks", "states"], top
    packages = sorted(p.name for p in PKG.iterdir() if (p / "__init__.py").exists())
    assert packages == ["check", "clean", "cli", "config", "hosts", "launch", "registry", "remote", "runs", "sweep",
                        "transport", "ui"], packages


# -------------------------------------------------------------- rule 2: the table's "may import" column


def folder_of(name: str) -> str:
    """The table's row a module belongs to: `clusterrun.launch.runner` → `launch`, `clusterrun.plan` → `plan`."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else ""


def may_import_table(text: str) -> Dict[str, Set[str]]:
    """folder → what it may import (folder names, or dotted module paths), from the page's folder table."""
    core = {"config", "plan", "states", "errors", "events", "stacks", "outcome"}
    rows: Dict[str, Set[str]] = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`") or cells[0].startswith("`--"):
            continue
        folder = cells[0].strip("`").rstrip("/").removesuffix(".py")
        allowed: Set[str] = set()
        for item in cells[2].split(","):
            word = item.strip().split(" ")[0].strip("`")
            if word in ("nothing", "stdlib"):
                continue
            if word == "core" or item.strip() == "the core":
                allowed |= core
            elif word == "anything":
                allowed.add("*below" if "below" in item else "*")
            else:
                allowed.add(word)
        rows[folder] = allowed
    return rows


def allowed_import(source: str, target: str, rows: Dict[str, Set[str]]) -> bool:
    mine, theirs = folder_of(source), folder_of(target)
    if target == "clusterrun" or mine == theirs:  # `from .. import outcome` names the package; outcome is checked
        return True
    allowed = rows[mine]
    if "*" in allowed or ("*below" in allowed and theirs not in ("cli", "__main__")):
        return True
    dotted = ["clusterrun." + a for a in allowed if "." in a]
    return theirs in allowed or any(target == a or target.startswith(a + ".") for a in dotted)


def test_the_architecture_page_lists_every_folder():
    rows = may_import_table(ARCHITECTURE.read_text())
    folders = {folder_of(name) for name in modules()} - {""}
    assert folders <= set(rows), f"folders missing from docs/architecture.md: {sorted(folders - set(rows))}"
    assert not set(rows) - folders, f"the page lists folders that do not exist: {sorted(set(rows) - folders)}"


def test_every_import_is_one_the_architecture_page_allows():
    rows = may_import_table(ARCHITECTURE.read_text())
    mods = modules()
    bad = [f"{path.relative_to(PKG.parent)}:{line} imports {target} ({folder_of(name)} may import: "
           f"{', '.join(sorted(rows[folder_of(name)])) or 'nothing'})"
           for name, (path, tree) in mods.items() if folder_of(name) and not under(name, ("clusterrun.remote",))
           for target, line in imports(name, path, tree)
           if target in mods and not allowed_import(name, target, rows)]
    assert not bad, "imports docs/architecture.md does not allow:\n" + "\n".join(bad)


def test_the_table_check_catches_a_forbidden_import():
    """The check above would fail on an import the page does not allow (one of those it caught once)."""
    rows = may_import_table(ARCHITECTURE.read_text())
    assert not allowed_import("clusterrun.check.probe", "clusterrun.transport.ssh", rows)
    assert not allowed_import("clusterrun.sweep.grid", "clusterrun.registry.store", rows)
    assert not allowed_import("clusterrun.registry.store", "clusterrun.remote.host.run.stop", rows)
    assert allowed_import("clusterrun.registry.store", "clusterrun.remote.host.procs", rows)
    assert not allowed_import("clusterrun.registry.store", "clusterrun.hosts.client", rows)  # storage reaches no host
    assert not allowed_import("clusterrun.registry.store", "clusterrun.runs.reconcile", rows)  # nor the commands on it
    assert not allowed_import("clusterrun.runs.top", "clusterrun.ui.observe", rows)
    assert not allowed_import("clusterrun.outcome", "clusterrun.launch.runner", rows)


# -------------------------------------------------------------- rule 6: one fan-out


def test_only_hosts_group_fans_out():
    bad = []
    for name, (path, tree) in modules().items():
        if name in ("clusterrun.hosts.group",) or under(name, ("clusterrun.remote",)):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and node.id in ("ThreadPoolExecutor", "ProcessPoolExecutor"):
                bad.append(f"{path.relative_to(PKG.parent)}:{node.lineno}: {node.id}")
            if isinstance(node, ast.Call) and ast.unparse(node.func) in ("threading.Thread", "Thread"):
                bad.append(f"{path.relative_to(PKG.parent)}:{node.lineno}: a thread started by hand")
    assert not bad, "host work fans out through hosts.group:\n" + "\n".join(bad)


# -------------------------------------------------------------- rule 7: one outcome

FINAL_STATES = {"SUCCEEDED", "FAILED", "STOPPED", "TIMED_OUT", "INTERRUPTED"}


def final_state_uses(tree: ast.Module) -> Iterator[Tuple[int, str]]:
    """`RunState.<final>` anywhere but as one side of a comparison; and RunOutcome(...) calls."""
    compared = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            for side in [node.left] + node.comparators:
                compared |= {id(n) for n in ast.walk(side)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in FINAL_STATES and ast.unparse(node.value) == "RunState" \
                and id(node) not in compared:
            yield node.lineno, f"RunState.{node.attr}"
        if isinstance(node, ast.Call) and ast.unparse(node.func).split(".")[-1] == "RunOutcome":
            yield node.lineno, "RunOutcome(...)"


def test_a_runs_end_is_decided_in_outcome_only():
    bad = [f"{path.relative_to(PKG.parent)}:{line}: {what}" for name, (path, tree) in modules().items()
           if name not in ("clusterrun.outcome", "clusterrun.states")
           for line, what in final_state_uses(tree)]
    assert not bad, "only outcome.py decides how a run ends:\n" + "\n".join(bad)


def test_the_outcome_rule_catches_a_verdict_made_elsewhere():
    made = ast.parse("store.update_run(r, state=RunState.FAILED)\nx = RunOutcome(r, RunState.STOPPED, 1)\n")
    assert sorted(w for _, w in final_state_uses(made)) == ["RunOutcome(...)", "RunState.FAILED", "RunState.STOPPED"]
    read = ast.parse("if outcome.state is RunState.SUCCEEDED: pass\n")
    assert list(final_state_uses(read)) == []


def test_the_registry_writes_a_final_state_only_from_an_outcome(tmp_path):
    import pytest

    from clusterrun.outcome import interrupted
    from clusterrun.registry.store import RunStore
    from clusterrun.states import RunState

    store = RunStore(str(tmp_path))
    store.create("20261201-000000-0001", "inv.yaml", {}, {"nodes": []}, {}, [], [])
    with pytest.raises(ValueError, match="conclude"):
        store.update_run("20261201-000000-0001", state=RunState.FAILED)
    store.conclude(interrupted("20261201-000000-0001"))
    assert store.get("20261201-000000-0001").state is RunState.INTERRUPTED


# -------------------------------------------------------------- rule 5: the host program's layers

HOST = "clusterrun.remote.host"


def host_layers(text: str) -> Dict[str, int]:
    """Each member of the host program's layers table (a module or a subpackage, dotted under HOST) → its
    layer, from the page's section "The host program's layers"."""
    section = text.split("## The host program's layers", 1)[1].split("\n## ", 1)[0]
    out: Dict[str, int] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].isdigit():
            continue
        for word in cells[1].split(","):
            name = word.strip().strip("`").rstrip("/").removesuffix(".py")
            out[f"{HOST}.{name}"] = int(cells[0])
    return out


def host_layer_of(name: str, layers: Dict[str, int]) -> int:
    """The layer of a module of the host program (its own entry, or its subpackage's); KeyError if none."""
    parts = name.split(".")
    for n in range(len(parts), 3, -1):
        if ".".join(parts[:n]) in layers:
            return layers[".".join(parts[:n])]
    raise KeyError(name)


def host_import_allowed(source: str, target: str, layers: Dict[str, int]) -> bool:
    if target == HOST:  # `from .. import x` names the package; x is checked on its own
        return True
    return host_layer_of(target, layers) <= host_layer_of(source, layers)


def test_every_module_of_the_host_program_has_a_layer():
    layers = host_layers(ARCHITECTURE.read_text())
    missing = []
    for name in modules():
        if under(name, (HOST,)) and name != HOST:
            try:
                host_layer_of(name, layers)
            except KeyError:
                missing.append(name)
    assert not missing, f"modules of remote/host/ missing from docs/architecture.md's layers: {missing}"
    mods = modules()
    assert not [m for m in layers if m not in mods], "the layers table names modules that do not exist"


def test_the_host_programs_imports_go_down_its_layers():
    layers = host_layers(ARCHITECTURE.read_text())
    mods = modules()
    bad = [f"{path.relative_to(PKG.parent)}:{line} imports {target} (layer {host_layer_of(target, layers)} above "
           f"its own, {host_layer_of(name, layers)})"
           for name, (path, tree) in mods.items() if under(name, (HOST,)) and name != HOST
           for target, line in imports(name, path, tree)
           if target in mods and under(target, (HOST,)) and not host_import_allowed(name, target, layers)]
    assert not bad, "imports against the host program's layers (docs/architecture.md):\n" + "\n".join(bad)


def test_the_layer_check_catches_an_import_up_the_layers():
    """The check above would fail on the tangles it was written for (issue 31, finding 6)."""
    layers = host_layers(ARCHITECTURE.read_text())
    assert not host_import_allowed(f"{HOST}.share.waiter", f"{HOST}.run.peers", layers)
    assert not host_import_allowed(f"{HOST}.disk.clean", f"{HOST}.push.receive", layers)
    assert not host_import_allowed(f"{HOST}.observe.samples", f"{HOST}.main", layers)
    assert not host_import_allowed(f"{HOST}.run.notify", f"{HOST}.push.job_setup", layers)
    assert not host_import_allowed(f"{HOST}.wire", f"{HOST}.channel.lines", layers)
    assert host_import_allowed(f"{HOST}.push.receive", f"{HOST}.run.start", layers)
    assert host_import_allowed(f"{HOST}.channel.gate", f"{HOST}.channel.lines", layers)
    assert host_import_allowed(f"{HOST}.paths", f"{HOST}.wire", layers)
