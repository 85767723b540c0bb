"""Another user of the same host, for the tests of what one user can do to another's runs (docs/security.md):
this machine's `nobody` (uid 65534, in every passwd), reached from a root test process by a child that
drops to it (subprocess's user=/group=), running the system's Python on the host program's stdlib-only
code. Nothing is added to the machine's users. Tests that use it skip where the lane does not run as root;
conftest.py's shared_tmp is a folder both users reach."""

import os
import shutil
import subprocess

import pytest

OTHER = 65534
PYTHON = shutil.which("python3", path="/usr/bin:/bin") or "/usr/bin/python3"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

needs_root = pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists(PYTHON),
                                reason="a second unix user needs root (and a system python3 it may run)")


def as_other(code, *args, timeout=30.0, background=False):
    """code run by the other user (the host program importable as clusterrun.remote.host...): its
    CompletedProcess, or with background the Popen (stdout piped: it may print when it is ready)."""
    argv = [PYTHON, "-c", code, *[str(a) for a in args]]
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": ROOT, "HOME": "/nonexistent", "LANG": "C.UTF-8"}
    kwargs = dict(user=OTHER, group=OTHER, extra_groups=[], env=env, cwd="/", stdin=subprocess.DEVNULL)
    if background:
        return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=True, **kwargs)
