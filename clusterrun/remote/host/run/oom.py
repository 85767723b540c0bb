"""Was a rank that died of SIGKILL killed by the kernel's OOM killer? Its supervisor asks at the rank's
end, and the answer goes into the exit record's "error" ("killed by the OOM killer (host memory)"), which
the root cause shows.

Two witnesses; either may be unreadable (a container without /dev/kmsg, dmesg_restrict, no cgroup v2),
and then nothing is said (never a guess that blames memory):
  /dev/kmsg       the kernel's log: "Out of memory: Killed process PID (NAME)" (the host ran out), or
                  "Memory cgroup out of memory: Killed process PID" (a cgroup's limit: a container's, a
                  systemd slice's), for the rank's pid, or any such record since the supervisor started
                  when the pid is not known (torchrun's workers are the shim's children)
  memory.events   of this process's cgroup (v2; v1: memory.oom_control): its oom_kill count rose since
                  the supervisor started (the kernel counts kills of any kind there)
"""

import errno
import os
import time

KILLED = r"(Memory cgroup out of memory|Out of memory)[^:]*: Killed process (\d+)"  # compiled when a rank was killed
HOST = "killed by the OOM killer (host memory)"
CGROUP = "killed by the OOM killer (its cgroup's memory limit)"
MAX_RECORDS = 50000


def cgroup_oom_kills(proc_cgroup="/proc/self/cgroup", root="/sys/fs/cgroup"):
    """This process's cgroup's oom_kill count (None when it cannot be read)."""
    try:
        with open(proc_cgroup) as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2: memory.events of the unified hierarchy
            found = _count(os.path.join(root, path.lstrip("/"), "memory.events"))
        elif "memory" in controllers.split(","):  # v1
            found = _count(os.path.join(root, "memory", path.lstrip("/"), "memory.oom_control"))
        else:
            continue
        if found is not None:
            return found
    return None


def _count(path):
    try:
        with open(path) as fh:
            for line in fh:
                name, _, value = line.partition(" ")
                if name == "oom_kill":
                    return int(value)
    except (OSError, ValueError):
        return None
    return None


def kernel_records(path="/dev/kmsg"):
    """(monotonic seconds, message) of the kernel's log records that name an OOM kill; [] if unreadable."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return []
    out = []
    try:
        for _ in range(MAX_RECORDS):
            try:
                record = os.read(fd, 8192).decode("utf-8", "replace")
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # overwritten while we read: go on with the next
                    continue
                break  # EAGAIN: the end
            if not record:
                break
            head, _, message = record.partition(";")
            if "Killed process" in message:
                try:
                    out.append((int(head.split(",")[2]) / 1e6, message.strip()))
                except (IndexError, ValueError):
                    continue
    finally:
        os.close(fd)
    return out


def judge(records, pid, since):
    """HOST, CGROUP or "" from the kernel's records: one naming pid, else (pid unknown) one since `since`."""
    import re  # only here: a supervisor's start never loads it (stdlib.py)

    killed = re.compile(KILLED)
    for at, message in reversed(records):
        m = killed.search(message)
        if m and ((pid is not None and int(m.group(2)) == pid) or (pid is None and at >= since)):
            return CGROUP if m.group(1).startswith("Memory cgroup") else HOST
    return ""


class OomWatch:
    """Made when the supervisor starts (the cgroup's count then); `cause` at a SIGKILLed rank's end."""

    def __init__(self):
        self.since = time.monotonic()
        self.before = cgroup_oom_kills()

    def cause(self, pid=None):
        said = judge(kernel_records(), pid, self.since)
        if said:
            return said
        now = cgroup_oom_kills()
        if self.before is not None and now is not None and now > self.before:
            self.before = now
            return "killed by the OOM killer (memory of this host or of its cgroup)"
        return ""
