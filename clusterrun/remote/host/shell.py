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
