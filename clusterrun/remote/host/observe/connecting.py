"""The rendezvous watchdog's eyes: which of a run's processes are stuck connecting (a TCP socket in
SYN-SENT: the other end's packets are dropped, typically by a firewall) and to which address; which of
them listen on a port; which keep retrying a connection that is refused (a TCP socket they hold that is in
no table: connect() failed on it, and torch's store client tries again on a fresh one while it holds the
last); and who listens on a port at all (run/rendezvous.py).

Read from /proc (Linux): /proc/net/tcp{,6} gives the sockets by inode, state and addresses,
/proc/PID/fd which of them a process holds (and a socket's getxattr system.sockprotoname whether it is
TCP). Elsewhere it finds nothing, which costs nothing.
"""

import os
import struct

from ..stdlib import socket

SYN_SENT = "02"
LISTEN = "0A"


def _address(hexaddr):
    host, port = hexaddr.split(":")
    raw = bytes.fromhex(host)
    if len(raw) == 4:
        ip = socket.inet_ntop(socket.AF_INET, struct.pack("<I", struct.unpack(">I", raw)[0]))
        return "%s:%d" % (ip, int(port, 16))
    words = struct.unpack("<4I", raw)  # four little-endian 32-bit words
    ip = socket.inet_ntop(socket.AF_INET6, struct.pack(">4I", *words))
    if ip.startswith("::ffff:"):
        ip = ip[7:]
    return "[%s]:%d" % (ip, int(port, 16)) if ":" in ip else "%s:%d" % (ip, int(port, 16))


def _rows():
    """(state, local hex address, remote hex address, inode) of every TCP socket of this namespace."""
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(path) as fh:
                lines = fh.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if len(parts) > 9:
                yield parts[3], parts[1], parts[2], parts[9]


def syn_sent():
    """socket inode → remote address, for every socket of this network namespace in SYN-SENT."""
    found = {}
    for state, _, remote, inode in _rows():
        if state == SYN_SENT:
            try:
                found[inode] = _address(remote)
            except (ValueError, OSError, struct.error):
                continue
    return found


def table():
    """Every TCP socket of this namespace as (state, local, remote, inode), read once for several looks."""
    return list(_rows())


def listeners(port, rows=None):
    """The inodes of the sockets that listen on this TCP port, on any address of this host."""
    out = set()
    for state, local, _, inode in _rows() if rows is None else rows:
        if state == LISTEN and local.rsplit(":", 1)[-1] == "%04X" % port:
            out.add(inode)
    return out


def tree(pids):
    """These processes and all their descendants."""
    seen, todo = set(), list(pids)
    while todo:
        pid = todo.pop()
        if pid and pid not in seen:
            seen.add(pid)
            todo += _children(pid)
    return seen


def sockets(pids):
    """The socket inodes these processes (not their children) hold."""
    out = set()
    for pid in pids:
        out |= _inodes(pid)
    return out


def retrying(pids, rows=None):
    """Whether these processes hold a TCP socket that is in no table: one whose connect() failed (refused),
    which a client that tries again (torch's store client) holds between its tries."""
    tabled = {inode for _, _, _, inode in (_rows() if rows is None else rows)}
    for pid in pids:
        for inode, fd in _socket_fds(pid):
            if inode not in tabled and _is_tcp(pid, fd):
                return True
    return False


def _socket_fds(pid):
    try:
        fds = os.listdir("/proc/%d/fd" % pid)
    except OSError:
        return []
    out = []
    for fd in fds:
        try:
            target = os.readlink("/proc/%d/fd/%s" % (pid, fd))
        except OSError:
            continue
        if target.startswith("socket:["):
            out.append((target[8:-1], fd))
    return out


def _is_tcp(pid, fd):
    try:
        return os.getxattr("/proc/%d/fd/%s" % (pid, fd), "system.sockprotoname").startswith(b"TCP")
    except (OSError, AttributeError):  # no such xattr (an old kernel), or not Linux
        return False


def _children(pid):
    kids = []
    try:
        for task in os.listdir("/proc/%d/task" % pid):
            with open("/proc/%d/task/%s/children" % (pid, task)) as fh:
                kids += [int(k) for k in fh.read().split()]
    except (OSError, ValueError):
        pass
    return kids


def _inodes(pid):
    return {inode for inode, _ in _socket_fds(pid)}


def connecting(pids):
    """The remote addresses these processes (and their children) are stuck connecting to."""
    pending = syn_sent()
    if not pending:
        return set()
    seen, todo, remotes = set(), list(pids), set()
    while todo:
        pid = todo.pop()
        if not pid or pid in seen:
            continue
        seen.add(pid)
        remotes.update(pending[i] for i in _inodes(pid) if i in pending)
        todo += _children(pid)
    return remotes
