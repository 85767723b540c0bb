"""Who holds a TCP port on this host, as far as this user may see: the listener's uid (/proc/net/tcp*),
and for this user's own processes its pid and command line, and the clusterrun run it belongs to (a
rank's environment names it: CLUSTERRUN_RUN_ID, RANK). Used by the push's preflight facts and, as
source in front of remote/probe.py, by `clusterrun check` (so kept to Python 3.6 and %-formatting)."""

import os


def port_holder(port):
    """{"uid", "user"?, "pid"?, "command"?, "run_id"?, "rank"?} of the listener on port; None if none."""
    inodes = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as fh:
                rows = fh.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if len(cols) > 9 and cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                inodes[cols[9]] = int(cols[7])
    if not inodes:
        return None
    inode, uid = next(iter(inodes.items()))
    holder = {"uid": uid}
    try:
        import pwd
        holder["user"] = pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        pass
    pid = _pid_of_socket("socket:[%s]" % inode)
    if pid is not None:
        holder.update(_process(pid))
    return holder


def _pid_of_socket(target):
    """The pid of a process of ours with this socket open (None: not ours, or gone)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fds = os.listdir("/proc/%s/fd" % pid)
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink("/proc/%s/fd/%s" % (pid, fd)) == target:
                    return int(pid)
            except OSError:
                continue
    return None


def _as_run(argv):
    """A rank's command as the user wrote it: without the bootstrap every rank starts through
    (`python .../run/bootstrap.py STACKS TRACER ENTRY...`, run/bootstrap.py)."""
    if len(argv) > 4 and argv[1].endswith(b"/run/bootstrap.py"):
        return argv[:1] + argv[4:]
    return argv


def _process(pid):
    """pid, command line and, for a rank (or torchrun) of a clusterrun run, its run id and rank."""
    found = {"pid": pid}
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as fh:
            argv = fh.read().split(b"\0")
        found["command"] = b" ".join(_as_run(argv)).decode("utf-8", "replace").strip()[:200]
        with open("/proc/%d/environ" % pid, "rb") as fh:
            env = dict(item.split(b"=", 1) for item in fh.read().split(b"\0") if b"=" in item)
    except OSError:
        return found
    if env.get(b"CLUSTERRUN_RUN_ID"):
        found["run_id"] = env[b"CLUSTERRUN_RUN_ID"].decode("utf-8", "replace")
        if env.get(b"RANK", b"").isdigit():
            found["rank"] = int(env[b"RANK"])
    return found
