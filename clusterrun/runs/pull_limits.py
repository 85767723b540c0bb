"""What a host's pull listing may make this machine do (runs/pull.py). The host's word is not trusted:
its job (or the host itself) may lie, and the files land wherever `--to` points, owned by this user.

- Modes: a pulled file gets the host's permission bits without setuid, setgid and sticky (07000: a job
  that set `u+s` on an output must not hand this user a setuid program), and group or other write only
  where this process's umask allows it (a world-writable output stays this user's alone under umask 022).
- Sizes: no file may claim more than MAX_FILE, and what the listing says must be fetched must fit on the
  disk it goes to, with RESERVE left free, for every host of the pull together on each disk: checked
  before the first byte is fetched. A host that then sends more bytes for a file than it listed is cut
  off at that file (runs/pull.py's _PartFile).
"""

from __future__ import annotations

import functools
import os
import shutil
from typing import Dict, Mapping, Tuple

from ..errors import PullTooLarge

MAX_FILE = 1 << 40  # 1 TiB: more than any checkpoint one file of a run holds
RESERVE = 64 << 20  # what a pull leaves free on the disk it writes to


@functools.lru_cache(maxsize=1)
def umask() -> int:
    """This process's umask, read without setting it (the pull's threads share it): /proc on Linux, else
    the set-and-restore, once."""
    try:
        with open("/proc/self/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    old = os.umask(0o022)
    os.umask(old)
    return old


def local_mode(mode: int) -> int:
    """The mode a pulled file gets here (see the top of this file)."""
    return mode & 0o777 & ~(umask() & 0o022)


def file_problem(rel: str, size: int) -> str:
    """What is wrong with one file of a listing ("" when nothing)."""
    if size < 0 or size > MAX_FILE:
        return f"{rel}: the host lists it at {size} bytes, more than one pulled file may be ({MAX_FILE} bytes)"
    return ""


def disk_of(folder: str) -> Tuple[int, str]:
    """(device, the nearest folder that exists) of where a pull's files go (made later, if missing)."""
    path = os.path.abspath(folder)
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return os.stat(path).st_dev, path


def check_room(needs: Mapping[str, Tuple[str, int]]) -> None:
    """needs: host → (its folder here, the bytes it will fetch). PullTooLarge, naming the disk and the hosts,
    when the bytes bound for one disk do not fit there with RESERVE left."""
    disks: Dict[int, Tuple[str, int, list]] = {}
    for host, (folder, need) in needs.items():
        dev, where = disk_of(folder)
        seen = disks.setdefault(dev, (where, 0, []))
        disks[dev] = (seen[0], seen[1] + need, seen[2] + [host])
    for where, need, hosts in disks.values():
        free = shutil.disk_usage(where).free
        if need + RESERVE > free:
            raise PullTooLarge(", ".join(hosts), f"the listing asks for {_size(need)} but {where} has "
                             f"{_size(free)} free ({_size(RESERVE)} kept free): nothing was fetched",
                             hint="pull fewer PATHs, or --to a folder on a larger disk")


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def over_listed(rel: str, listed: int, offset: int, written: int) -> str:
    """"" while a file's bytes stay within what the listing said; else why it is cut off."""
    if offset + written > listed:
        return f"{rel}: the host sent more than the {listed} bytes it listed: the file is dropped"
    return ""
