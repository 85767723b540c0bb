"""A host's running `bandwidth` (remote/host/net/bandwidth.py, protocol at its top), the controller's side:
one pair's job at a time handed over, its answer back; what check --net (check/bandwidth.py) measures
with. HostClient.bandwidth starts it."""

from __future__ import annotations

from typing import Optional

from ..transport import Stream, StreamClosed
from .wire import pack_msg, read_msg


class BenchStream:
    """A host's running `bandwidth`: one pair's job at a time (serve or connect), its answer back."""

    def __init__(self, label: str, stream: Stream, ready: dict):
        self.label = label
        self.ready = ready  # {"port", "bound", "ifname", "why", "mtu"}
        self._stream = stream

    def start(self, kind: str, job: dict, timeout: float) -> Optional[str]:
        """Hand it a serve or connect job (the pair's other host gets its own at the same time); why it
        could not be handed over (None: it was)."""
        try:
            self._stream.write(pack_msg({kind: job}), timeout)
            return None
        except (TimeoutError, StreamClosed) as exc:
            return f"{self.label}: connection lost: {exc}"

    def result(self, pair: str, timeout: float) -> dict:
        """The started job's answer ({"error"} when the pair failed)."""
        try:
            return read_msg(self._stream, timeout)["done"]
        except TimeoutError:
            return {"pair": pair, "error": f"{self.label} gave no answer within {timeout:g} s"}
        except StreamClosed as exc:
            return {"pair": pair, "error": f"{self.label}: connection lost: {exc}"}

    def close(self) -> None:
        try:
            self._stream.write(pack_msg({"end": True}), 2.0)
        except (TimeoutError, StreamClosed):
            pass
        self._stream.close()
