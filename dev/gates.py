"""Code gates CI holds (.ci/run): every function at most 15 by radon's cyclomatic complexity (boolean
operators and conditional expressions count, unlike ruff's mccabe) and at most 60 lines long, in
clusterrun/, train_job/ and docker/testcluster/.

    .venv/bin/python dev/gates.py          list every function over a limit; exit 1 if there is one
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from radon.complexity import cc_visit

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("clusterrun", "train_job", "docker/testcluster")
MAX_COMPLEXITY = 15
MAX_LINES = 60


def functions(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def problems(path: Path) -> list:
    text = path.read_text()
    rel = path.relative_to(ROOT)
    out = []
    seen = set()
    for block in cc_visit(text):
        for b in [block] + list(getattr(block, "methods", []) or []):  # a class's methods come twice
            if type(b).__name__ != "Function" or (b.lineno, b.name) in seen:
                continue
            seen.add((b.lineno, b.name))
            if b.complexity > MAX_COMPLEXITY:
                name = f"{b.classname}.{b.name}" if getattr(b, "classname", None) else b.name
                out.append(f"{rel}:{b.lineno}: {name}: complexity {b.complexity} (at most {MAX_COMPLEXITY})")
    for fn in functions(ast.parse(text, str(path))):
        length = fn.end_lineno - fn.lineno + 1
        if length > MAX_LINES:
            out.append(f"{rel}:{fn.lineno}: {fn.name}: {length} lines (at most {MAX_LINES})")
    return out


def main() -> int:
    found = [p for folder in FOLDERS for path in sorted((ROOT / folder).rglob("*.py")) for p in problems(path)]
    for line in found:
        print(line)
    print(f"gates: {len(found)} function(s) over the limits" if found else
          f"gates: every function at most complexity {MAX_COMPLEXITY} and {MAX_LINES} lines")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
