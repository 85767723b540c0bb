"""The user's login shell, as ssh runs a command with it: job.setup's commands (push/job_setup.py) and
notify's (run/notify.py) run with `SHELL -c COMMAND`."""

import os
import pwd


def login_shell():
    try:
        shell = pwd.getpwuid(os.getuid()).pw_shell
    except KeyError:
        shell = ""
    return shell if shell and os.access(shell, os.X_OK) and not shell.endswith(("nologin", "false")) else "/bin/sh"


def which(name, path=None):
    """The executable `name` on PATH, as the shell finds it, or None: shutil.which without shutil (whose
    import loads bz2, lzma and fnmatch: milliseconds a launch on every host, for one PATH walk)."""
    for folder in (path if path is not None else os.environ.get("PATH", os.defpath)).split(os.pathsep):
        candidate = os.path.join(folder or ".", name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None
