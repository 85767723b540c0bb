"""The base interpreter of job.environment as this host has it: found on PATH (python3.11) or at its path,
described by running it once (version, implementation, platform tag: what the venv's key holds and what
`pip download --platform` needs for wheels: controller). Sent in the push's facts, so a host that lacks
it is named before anything is built on the others. Kept under WORKDIR/fingerprints/bases/ (describe_cached), so a
relaunch starts no interpreter to learn it again."""

import json
import os
import sys

DESCRIBE = r"""
import json, platform, sys, sysconfig
impl = {"cpython": "cp", "pypy": "pp"}.get(sys.implementation.name, sys.implementation.name)
plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
libc = "%s%s" % platform.libc_ver() if platform.libc_ver()[0] else ""
print(json.dumps({"executable": sys.executable, "version": platform.python_version(), "implementation": impl,
                  "python_tag": "%s%d%d" % (impl, sys.version_info[0], sys.version_info[1]), "platform": plat,
                  "libc": libc, "tag": "-".join(t for t in ("%s%d%d" % (impl, sys.version_info[0],
                                                                        sys.version_info[1]), plat, libc) if t)}))
"""


def index_reachable(host, port, timeout=2.0):
    """Whether a TCP connection to the package index opens from here (wheels: auto decides by it)."""
    import socket

    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
        return True
    except (OSError, ValueError):
        return False


def describe_cached(workdir, command):
    """describe_base, kept in WORKDIR/fingerprints/bases/ by the interpreter's real path and its file's identity
    (size, mtime, inode): a relaunch starts no interpreter to learn what it knew (an upgrade changes the
    file, so it is described anew). A missing interpreter is never cached."""
    import hashlib
    import shutil

    path = command if os.sep in command else shutil.which(command)
    try:
        real = os.path.realpath(path) if path else None
        st = os.stat(real) if real else None
    except OSError:
        st = None
    if st is None:
        return describe_base(command)
    ident = json.dumps([command, path, real, st.st_size, st.st_mtime_ns, st.st_ino])
    cache = os.path.join(workdir, "fingerprints", "bases", hashlib.sha256(ident.encode()).hexdigest()[:16] + ".json")
    try:
        with open(cache) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        pass
    found = describe_base(command)
    if "error" not in found:
        try:
            os.makedirs(os.path.dirname(cache), 0o700, exist_ok=True)
            tmp = "%s.tmp-%d" % (cache, os.getpid())
            with open(tmp, "w") as fh:
                json.dump(found, fh)
            os.replace(tmp, cache)
        except OSError:
            pass
    return found


def describe_base(command, timeout=30.0):
    """{executable, version, implementation, platform, libc, tag} of the interpreter `command` names, or
    {error} saying what is missing: a command looked up on PATH as ssh's shell would, a path as it is."""
    import shutil
    import subprocess

    path = command if os.sep in command else shutil.which(command)
    if path is None or not os.path.exists(path):
        where = "on PATH (%s)" % os.environ.get("PATH", "") if os.sep not in command else "at that path"
        return {"error": "%s: no such interpreter %s" % (command, where), "command": command}
    try:
        done = subprocess.run([path, "-c", DESCRIBE], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"error": "%s: cannot run it (%s)" % (command, exc), "command": command}
    if done.returncode != 0:
        tail = done.stderr.decode("utf-8", "replace").strip().splitlines()[-3:]
        return {"error": "%s exited %d: %s" % (command, done.returncode, " | ".join(tail)), "command": command}
    try:
        found = json.loads(done.stdout.decode().strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": "%s printed no description of itself" % command, "command": command}
    found["command"] = command
    return found


if __name__ == "__main__":  # wheels: controller or auto, before the push (hosts/client.py: describe_base)
    found = describe_base(sys.argv[1])
    if len(sys.argv) > 3:
        found["index_reachable"] = index_reachable(sys.argv[2], sys.argv[3])
    print(json.dumps(found))
