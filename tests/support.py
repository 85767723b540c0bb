"""What the tests of every lane share: waiting for a condition, a free local port, whether a process is
alive, a folder of files, an inventory's text.

Importable as `support` from every lane: tests/conftest.py lies beside it, and pytest (rootdir-based,
`prepend` import mode) puts the folder of each conftest.py it loads on sys.path, as it does for
tests/unit's hostkit and tests/integration's clusterkit and faultkit.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Callable, Dict, Mapping, Optional, TypeVar, Union

T = TypeVar("T")


def poll(cond: Callable[[], T], timeout: float, every: float = 0.05) -> T:
    """cond()'s first true value within timeout seconds, else its last (false) one: for a wait whose
    outcome the test judges itself afterwards."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(every)


def wait_for(cond: Callable[[], T], timeout: float = 60.0, every: float = 0.2, what: str = "condition") -> T:
    """cond()'s first true value within timeout seconds; AssertionError naming `what` when there is none."""
    value = poll(cond, timeout, every)
    if not value:
        raise AssertionError(f"timed out after {timeout} s waiting for {what}")
    return value


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listened on a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(port: int) -> bool:
    """Whether something accepts connections on 127.0.0.1:port (loopback: refused or accepted at once)."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def alive(pid: int) -> bool:
    """Whether process pid is running (a zombie, ended but not yet reaped, is not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().split(") ")[1][0] != "Z"


def write_tree(root: Path, files: Mapping[str, Union[str, bytes]]) -> Path:
    """root with every file of files (a path relative to root → its text or bytes), folders made as needed."""
    root.mkdir(parents=True, exist_ok=True)
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    return root


def inventory_text(hosts: list, job: Dict, defaults: Optional[Dict] = None, **top) -> str:
    """An inventory: version 1, defaults, one line per host, then the other top-level keys and job, each
    value a flow mapping (JSON, which YAML reads as such), so a test may append lines of its own."""
    lines = ["version: 1"]
    if defaults is not None:
        lines.append(f"defaults: {json.dumps(defaults)}")
    lines += ["hosts:"] + [f"  - {json.dumps(h)}" for h in hosts]
    lines += [f"{key}: {json.dumps(value)}" for key, value in {**top, "job": job}.items()]
    return "\n".join(lines) + "\n"


def write_wheel(folder: Path, name: str, version: str, body: str = "", requires: tuple = ()) -> Path:
    """A pure-Python wheel written by hand (GUIDE §7: no build tools, no index): NAME/__init__.py with
    __version__ (and body), its METADATA (Requires-Dist for each of requires), WHEEL and RECORD."""
    import base64
    import hashlib
    import zipfile

    dist = f"{name}-{version}.dist-info"
    files = {f"{name}/__init__.py": f"__version__ = {version!r}\n{body}",
             f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                                 + "".join(f"Requires-Dist: {r}\n" for r in requires),
             f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-{version}-py3-none-any.whl"
    record = []
    with zipfile.ZipFile(path, "w") as z:
        for member, text in files.items():
            data = text.encode()
            z.writestr(member, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{member},sha256={digest},{len(data)}")
        record.append(f"{dist}/RECORD,,")
        z.writestr(f"{dist}/RECORD", "\n".join(record) + "\n")
    return path
