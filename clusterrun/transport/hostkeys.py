"""Host-key checking with OpenSSH's meanings: `strict` rejects unknown keys, `accept-new` records them,
and a changed key is fatal under every policy. Never paramiko's auto-add policy."""

from __future__ import annotations

import base64
import fcntl
import hashlib
import os
import threading
from typing import Dict, List, Optional

import paramiko

from ..errors import HostKeyChanged, HostKeyUnknown

_file_locks: Dict[str, threading.Lock] = {}
_file_locks_guard = threading.Lock()

# What a key recorded under one name may be negotiated as (RSA keys sign with SHA-2 since OpenSSH 8.8).
_NEGOTIATE = {"ssh-rsa": ("rsa-sha2-512", "rsa-sha2-256", "ssh-rsa")}


def fingerprint(key: paramiko.PKey) -> str:
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def known_name(hostname: str, port: int) -> str:
    return hostname if port == 22 else f"[{hostname}]:{port}"


def _lock_for(path: str) -> threading.Lock:
    with _file_locks_guard:
        return _file_locks.setdefault(path, threading.Lock())


class KnownHosts:
    """One known_hosts file, read once per run and shared by every connection to it."""

    def __init__(self, path: str):
        self.path = os.path.expanduser(path)
        self._keys = paramiko.HostKeys()
        if os.path.exists(self.path):
            self._keys.load(self.path)
        self._queue: List[_Pending] = []  # keys to record, waiting for the next write
        self._queue_lock = threading.Lock()
        self.writes = 0  # the file written (read, appended) this many times

    def negotiable_types(self, hostname: str, port: int) -> List[str]:
        """Key types to offer in key exchange: the ones on record for this host, so a known host is not
        mistaken for an unknown one because the server prefers a type we have no record of."""
        entry = self._keys.lookup(known_name(hostname, port))
        if not entry:
            return []
        out: List[str] = []
        for name in entry.keys():
            out.extend(_NEGOTIATE.get(name, (name,)))
        return out

    def verify(self, label: str, hostname: str, port: int, key: paramiko.PKey, policy: str) -> None:
        name = known_name(hostname, port)
        entry = self._keys.lookup(name)
        fp = fingerprint(key)
        if entry is not None and key.get_name() in entry:
            if entry[key.get_name()] == key:
                return
            raise HostKeyChanged(
                label, f"the {key.get_name()} key of {name} is not the one recorded in {self.path}; "
                       f"it now presents {fp}. Someone may be intercepting the connection, or the host was "
                       "reinstalled",
                fingerprint=fp,
                hint=f"verify {fp} with the host's administrator, then remove the old key with "
                     f"`ssh-keygen -R '{name}' -f {self.path}` and connect again")
        if entry is not None and policy == "strict":
            raise HostKeyUnknown(
                label, f"{name} presented a {key.get_name()} key ({fp}), but {self.path} holds only "
                       f"{', '.join(entry.keys())} for it", fingerprint=fp,
                hint="verify the fingerprint, then add the key or set host_key_policy: accept-new")
        if policy != "accept-new":
            raise HostKeyUnknown(
                label, f"{name} is not in {self.path} (policy strict); it presents {key.get_name()} {fp}",
                fingerprint=fp,
                hint=f"verify {fp} with the host's administrator, then add it: "
                     f"`ssh-keyscan -p {port} -t {key.get_name()} {hostname} >> {self.path}`; or set "
                     "host_key_policy: accept-new in the inventory to trust hosts on first use")
        self._record(name, key)

    def _record(self, name: str, key: paramiko.PKey) -> None:
        """Append the new key (OpenSSH's accept-new) before the connection goes on. Hosts met at once share
        one write (a group commit): the first to come writes every key queued meanwhile, under a thread
        lock and a file lock, reading the file once; each caller learns its own key's fate."""
        entry = _Pending(name, key)
        with self._queue_lock:
            self._queue.append(entry)
        with _lock_for(self.path):
            with self._queue_lock:
                batch, self._queue = self._queue, []
            if batch:
                self._write(batch)
        entry.done.wait()
        if entry.error is not None:
            raise entry.error

    def _write(self, batch: List["_Pending"]) -> None:
        """One flock, one read, one append for every key of the batch."""
        try:
            os.makedirs(os.path.dirname(self.path) or ".", mode=0o700, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
            with os.fdopen(fd, "r+") as fh:
                fcntl.flock(fh, fcntl.LOCK_EX)
                fresh = paramiko.HostKeys()
                fresh.load(self.path)
                self.writes += 1
                lines = []
                for entry in batch:
                    current = fresh.lookup(entry.name)
                    if current is not None and entry.key.get_name() in current:
                        if current[entry.key.get_name()] != entry.key:
                            entry.error = HostKeyChanged(entry.name, "another process recorded a different key "
                                                         "just now", fingerprint=fingerprint(entry.key),
                                                         hint="connect again")
                        continue
                    lines.append(f"{entry.name} {entry.key.get_name()} {entry.key.get_base64()}\n")
                    fresh.add(entry.name, entry.key.get_name(), entry.key)
                if lines:
                    fh.seek(0, os.SEEK_END)
                    fh.write("".join(lines))
            for entry in batch:
                if entry.error is None:
                    self._keys.add(entry.name, entry.key.get_name(), entry.key)
        except Exception as exc:  # noqa: BLE001 -- every waiter learns it (a file paramiko cannot read too)
            for entry in batch:
                entry.error = entry.error or exc
        finally:
            for entry in batch:
                entry.done.set()


class _Pending:
    """A key waiting to be recorded, and what became of it."""

    def __init__(self, name: str, key: paramiko.PKey):
        self.name, self.key = name, key
        self.error: Optional[Exception] = None
        self.done = threading.Event()
