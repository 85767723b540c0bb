"""The rendezvous watchdog's eyes: which of a run's processes are stuck connecting (a TCP socket in
SYN-SENT: the other end's packets are dropped, typically by a firewall) and to which address.

Read from /proc (Linux): /proc/net/tcp{,6} gives the sockets in SYN-SENT by inode and remote address,
/proc/PID/fd which of them a process holds. Elsewhere it finds nothing, which costs nothing.
"""

import os
import socket
import struct

SYN_SENT = "02"


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


def syn_sent():
    """socket inode → remote address, for every socket of this network namespace in SYN-SENT."""
    found = {}
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(path) as fh:
                lines = fh.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if len(parts) > 9 and parts[3] == SYN_SENT:
                try:
                    found[parts[9]] = _address(parts[2])
                except (ValueError, OSError, struct.error):
                    continue
    return found


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
    out = set()
    try:
        fds = os.listdir("/proc/%d/fd" % pid)
    except OSError:
        return out
    for fd in fds:
        try:
            target = os.readlink("/proc/%d/fd/%s" % (pid, fd))
        except OSError:
            continue
        if target.startswith("socket:["):
            out.add(target[8:-1])
    return out


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
