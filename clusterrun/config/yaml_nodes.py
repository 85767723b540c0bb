"""Typed reading of YAML nodes that keeps file:line:col and the key path of every value.

The inventory is validated on the composed node tree rather than on loaded Python objects, so every
problem can point at its place in the file, duplicate keys can be seen at all, and a YAML boolean
(`yes`, `off`) can be told apart from the string the user meant.
"""

from __future__ import annotations

import difflib
import re
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import yaml

from ..errors import InventoryError, Problem

STR = "tag:yaml.org,2002:str"
INT = "tag:yaml.org,2002:int"
FLOAT = "tag:yaml.org,2002:float"
BOOL = "tag:yaml.org,2002:bool"
# a scalar the resolver already typed (INT, BOOL) constructed as yaml.safe_load would, without a loader each time
SCALARS = yaml.constructor.SafeConstructor()
NULL = "tag:yaml.org,2002:null"
MAP = "tag:yaml.org,2002:map"
SEQ = "tag:yaml.org,2002:seq"

_TYPE_NAMES = {STR: "a string", INT: "an integer", FLOAT: "a number", BOOL: "a YAML boolean",
               NULL: "nothing (null)", MAP: "a mapping", SEQ: "a list"}

_DURATION = re.compile(r"^(?:(\d+(?:\.\d+)?)d)?(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?$")


def describe(node: yaml.Node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    return _TYPE_NAMES.get(node.tag, f"a value tagged {node.tag}")


def parse_duration(text: str) -> Optional[float]:
    """Seconds in `90`, `90s`, `30m`, `2h`, `1h30m`, `7d`; None if it is not a duration."""
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    m = _DURATION.match(text)
    if not m or not any(m.groups()):
        return None
    d, h, mi, s = (float(g) if g else 0.0 for g in m.groups())
    return d * 86400 + h * 3600 + mi * 60 + s


def _unknown_key(name: str, path: str, allowed: Sequence[str], homes: Mapping[str, str]) -> str:
    """Why a key cannot stand here: a did-you-mean among the keys allowed here, or the place it belongs
    (a job key given at the top level: job.shared_dir)."""
    home = homes.get(name) or next((homes[c] for c in difflib.get_close_matches(name, list(homes), n=1)
                                    if not difflib.get_close_matches(name, allowed, n=1)), None)
    if home and home != path:
        where = f"it goes under {home.rsplit('.', 1)[0]}:" if "." in home else \
            f"a top-level key, not one under {path.rsplit('.', 1)[0]}:"
        return f"unknown key '{name}' here; did you mean {home}? ({where})"
    close = difflib.get_close_matches(name, allowed, n=1)
    return f"unknown key '{name}'" + (f"; did you mean '{close[0]}'?" if close else f"; allowed: {', '.join(allowed)}")


def _key_problem(knode: yaml.Node, key: str, allowed: Sequence[str], seen: Dict[str, Tuple[yaml.Node, yaml.Node]],
                 homes: Mapping[str, str] = {}) -> Optional[Tuple[str, str]]:
    """(key path, message) for a mapping key that cannot stand; None for one to keep."""
    if not isinstance(knode, yaml.ScalarNode) or knode.tag != STR:
        where = f"{key}.{knode.value}" if key else str(knode.value)
        return where, f"keys must be plain words, got {describe(knode)}"
    name = knode.value
    path = f"{key}.{name}" if key else name
    if name == "<<":
        return path, "YAML merge keys are not supported; put shared values under defaults:"
    if name in seen:
        first = seen[name][0].start_mark.line + 1
        return path, f"duplicate key (first given on line {first})"
    if name not in allowed:
        return path, _unknown_key(name, path, allowed, homes)
    return None


class NodeReader:
    """Collects problems while reading typed values out of a composed YAML document."""

    def __init__(self, file: str):
        self.file = file
        self.problems: List[Problem] = []
        self.context = ""  # what a caller learnt earlier and a later check needs (the job's launcher)
        self.homes: Dict[str, str] = {}  # key name -> the path where it belongs, for a key given in the wrong place

    def error(self, node: Optional[yaml.Node], key: str, message: str) -> None:
        line, col = (node.start_mark.line + 1, node.start_mark.column + 1) if node is not None else (1, 1)
        self.problems.append(Problem(self.file, line, col, key, message))

    def mapping(self, node: yaml.Node, key: str, allowed: Sequence[str],
                required: Sequence[str] = ()) -> Dict[str, Tuple[yaml.Node, yaml.Node]]:
        """Entries of a mapping node by key; reports duplicate, unknown and missing keys."""
        if not isinstance(node, yaml.MappingNode):
            self.error(node, key, f"expected a mapping, got {describe(node)}")
            return {}
        out: Dict[str, Tuple[yaml.Node, yaml.Node]] = {}
        for knode, vnode in node.value:
            problem = _key_problem(knode, key, allowed, out, self.homes)
            if problem is not None:
                self.error(knode, *problem)
                continue
            out[knode.value] = (knode, vnode)
        self._report_missing(node, key, required, out)
        return out

    def _report_missing(self, node: yaml.Node, key: str, required: Sequence[str],
                        found: Dict[str, Tuple[yaml.Node, yaml.Node]]) -> None:
        """Each required key not found, unless a problem was already reported at or under its path."""
        for name in required:
            if name not in found and not any(p.key.startswith(f"{key}.{name}" if key else name) for p in self.problems):
                self.error(node, key or "(document)", f"missing required key '{name}'")

    def string(self, node: yaml.Node, key: str, *, numbers_ok: bool = False,
               pattern: Optional[re.Pattern] = None, what: str = "") -> Optional[str]:
        """A string value. Numbers are accepted as their literal text only where `numbers_ok`."""
        if isinstance(node, yaml.ScalarNode):
            if node.tag == STR or (numbers_ok and node.tag in (INT, FLOAT)):
                value = node.value
                if "\x00" in value:
                    self.error(node, key, "NUL characters are not allowed")
                    return None
                if pattern is not None and not pattern.match(value):
                    self.error(node, key, f"{value!r} is not a valid {what}")
                    return None
                return value
            if node.tag == BOOL:
                self.error(node, key, f"expected a string, got the YAML boolean {node.value!r}; quote it "
                                      f"('{node.value}') if you mean the text")
                return None
        self.error(node, key, f"expected a string, got {describe(node)}")
        return None

    def integer(self, node: yaml.Node, key: str, lo: int, hi: int) -> Optional[int]:
        if isinstance(node, yaml.ScalarNode) and node.tag == INT:
            try:
                value = int(SCALARS.construct_yaml_int(node))
            except (ValueError, TypeError, yaml.YAMLError):
                value = None
            if value is not None and lo <= value <= hi:
                return value
            self.error(node, key, f"must be an integer from {lo} to {hi}, got {node.value}")
            return None
        self.error(node, key, f"expected an integer, got {describe(node)}")
        return None

    def duration(self, node: yaml.Node, key: str, zero: bool = False) -> Optional[float]:
        if isinstance(node, yaml.ScalarNode) and node.tag in (STR, INT, FLOAT):
            seconds = parse_duration(node.value)
            if seconds is not None and (seconds > 0 or zero and seconds == 0):
                return seconds
        self.error(node, key, f"expected a {'' if zero else 'positive '}duration such as "
                              f"{'0, ' if zero else ''}90s, 30m, 2h or 1h30m"
                              f", got {node.value if isinstance(node, yaml.ScalarNode) else describe(node)}")
        return None

    def choice(self, node: yaml.Node, key: str, choices: Sequence[str]) -> Optional[str]:
        value = self.string(node, key)
        if value is not None and value not in choices:
            self.error(node, key, f"must be one of {', '.join(choices)}; got {value!r}")
            return None
        return value

    def boolean(self, node: yaml.Node, key: str) -> Optional[bool]:
        if isinstance(node, yaml.ScalarNode) and node.tag == BOOL:
            return bool(SCALARS.construct_yaml_bool(node))
        if isinstance(node, yaml.ScalarNode) and node.value.lower() in ("true", "false", "yes", "no", "on", "off"):
            self.error(node, key, f"expected true or false, got the string {node.value!r} (write it without quotes)")
        else:
            self.error(node, key, f"expected true or false, got "
                                  f"{node.value if isinstance(node, yaml.ScalarNode) else describe(node)}")
        return None

    def string_list(self, node: yaml.Node, key: str, *, numbers_ok: bool = False,
                    pattern: Optional[re.Pattern] = None, what: str = "", nonempty: bool = False,
                    check: Optional[Callable[[str], Optional[str]]] = None) -> List[str]:
        """A list of strings; `check` says what is wrong with a value (None: nothing)."""
        if not isinstance(node, yaml.SequenceNode):
            self.error(node, key, f"expected a list, got {describe(node)}")
            return []
        out = []
        for i, item in enumerate(node.value):
            value = self.string(item, f"{key}[{i}]", numbers_ok=numbers_ok, pattern=pattern, what=what)
            if value is not None and nonempty and not value.strip():
                self.error(item, f"{key}[{i}]", "must not be empty")
                continue
            problem = check(value) if check is not None and value is not None else None
            if problem:
                self.error(item, f"{key}[{i}]", problem)
            elif value is not None:
                out.append(value)
        return out

    def string_map(self, node: yaml.Node, key: str, *, key_pattern: re.Pattern, key_what: str,
                   check: Optional[Callable[[str], Optional[str]]] = None) -> Dict[str, str]:
        """A mapping of names to strings (numbers accepted as their literal text), such as env:."""
        if not isinstance(node, yaml.MappingNode):
            self.error(node, key, f"expected a mapping, got {describe(node)}")
            return {}
        out: Dict[str, str] = {}
        for knode, vnode in node.value:
            name = knode.value if isinstance(knode, yaml.ScalarNode) else None
            path = f"{key}.{name}"
            if name is None or knode.tag != STR or not key_pattern.match(name):
                self.error(knode, path, f"{name!r} is not a valid {key_what}")
                continue
            if name in out:
                self.error(knode, path, "duplicate key")
                continue
            value = self.string(vnode, path, numbers_ok=True)
            problem = check(value) if check is not None and value is not None else None
            if problem:
                self.error(vnode, path, problem)
            elif value is not None:
                out[name] = value
        return out


# PyYAML's words for the mistakes people make → what to fix ({context}: the line where the block began)
_SYNTAX = (
    ("expected <block end>", "the indentation is off: this line does not line up with the keys (or the `- ` "
                             "items) of the block that began on line {context}; keys of one mapping, and items "
                             "of one list, start in the same column"),
    ("mapping values are not allowed here", "a `key: value` where none can start: the line is indented more "
                                            "than the key before it, or a value holds ': ' (quote it: 'a: b')"),
    ("could not find expected ':'", "a line that is not `key: value`: a ':' is missing after a key (at or after "
                                    "line {context}), or a line is indented as if it went on the one before"),
    ("expected ',' or ']'", "a [ ... ] list that began on line {context} is not closed (or lacks a comma)"),
    ("expected ',' or '}'", "a { ... } mapping that began on line {context} is not closed (or lacks a comma)"),
    ("found unexpected end of stream", "a quote opened on line {context} is never closed"),
    ("cannot start any token", "a character that cannot begin a YAML value"),
)


def syntax_message(exc: yaml.MarkedYAMLError, lines: Sequence[str]) -> str:
    """A YAML syntax error in plain words, with the line it was found on; PyYAML's own text where it says
    something rarer."""
    mark = exc.problem_mark or exc.context_mark
    context = exc.context_mark.line + 1 if exc.context_mark else (mark.line + 1 if mark else 1)
    problem = exc.problem or str(exc)
    detail = next((text.replace("{context}", str(context)) for words, text in _SYNTAX if words in problem), problem)
    line = mark.line + 1 if mark else 0
    if 0 < line <= len(lines):
        if "\t" in lines[line - 1]:
            detail += " (tabs are not allowed for indentation in YAML; use spaces)"
        if lines[line - 1].strip():
            detail += f": {lines[line - 1].rstrip()!r}"
        before = _dedented_before(lines, line) if "indent" in detail else None
        if before is not None:  # PyYAML notices a dedented line only at the next one
            detail += (f"; or line {before} before it is indented less than its neighbours: "
                       f"{lines[before - 1].rstrip()!r}")
    return detail


def _indent(text: str) -> int:
    return len(text) - len(text.lstrip(" "))


def _content_lines(lines: Sequence[str], below: int) -> List[int]:
    """The 1-based numbers of the lines above line `below` that hold something, nearest first."""
    return [n for n in range(below - 1, 0, -1) if lines[n - 1].strip() and not lines[n - 1].lstrip().startswith("#")]


def _dedented_before(lines: Sequence[str], line: int) -> Optional[int]:
    """The line just before `line` when it, not `line`, is the likely mistake: indented less than both its
    neighbours, or not indented under a key that opens a block (`env:`) with `line` indented deeper."""
    above = _content_lines(lines, line)
    if len(above) < 2:
        return None
    prev, prior = above[0], above[1]
    here, mid, top = _indent(lines[line - 1]), _indent(lines[prev - 1]), _indent(lines[prior - 1])
    opens = lines[prior - 1].split("#")[0].rstrip().endswith(":")
    if mid < here and (mid < top or (opens and mid <= top)):
        return prev
    return None


def compose(text: str, file: str) -> yaml.Node:
    """Compose a YAML document into nodes, turning YAML syntax errors into one located Problem. libyaml's
    parser where PyYAML has it (the same nodes, tags and marks, ~13x faster: 12 ms for a 32-host inventory
    in pure Python); its messages read otherwise, so a document it refuses is composed again by the pure
    parser, whose error is the one reported."""
    try:
        try:
            node = yaml.compose(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        except yaml.YAMLError:
            node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        detail = syntax_message(exc, text.splitlines())
        raise InventoryError([Problem(file, line, col, "", f"YAML syntax error: {detail}")]) from None
    except yaml.YAMLError as exc:
        raise InventoryError([Problem(file, 1, 1, "", f"YAML error: {exc}")]) from None
    if node is None:
        raise InventoryError([Problem(file, 1, 1, "", "the inventory is empty")])
    return node
