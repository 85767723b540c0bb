"""Byte sizes as people write and read them: `20G`, `500M`, `1.5T`, `4096` (decimal units, as `df -H`)."""

from __future__ import annotations

import re
from typing import Optional

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT]?)[bB]?\s*$")
_UNITS = {"": 1, "k": 10 ** 3, "m": 10 ** 6, "g": 10 ** 9, "t": 10 ** 12}


def parse_size(text: str) -> Optional[int]:
    """Bytes in `20G`, `20GB`, `500M`, `4096`; None when it is not a size."""
    m = _SIZE.match(str(text))
    if not m:
        return None
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def size_text(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")
