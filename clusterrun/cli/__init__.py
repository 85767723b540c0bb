"""The command line: the click group, its commands (one module per family), and the one exit.

Commands return an exit code or raise; `main` maps every ClusterrunError to its documented exit code
(errors.py) and is the only place that exits. Only cli/ and ui/ print.
"""

from __future__ import annotations

import sys
from typing import Optional, Sequence

import click

from .. import __version__
from ..errors import EXIT_INTERRUPTED, EXIT_USAGE, ClusterrunError


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="clusterrun")
def group() -> None:
    """Launch PyTorch distributed training on the hosts of an inventory, over SSH.

    Exit codes: 0 success, 1 job failed or a rank was lost, 2 usage or inventory error,
    3 connection/auth/host-key failure, 4 time limit, 5 hosts busy (other runs hold their slots or
    GPUs; nothing was pushed or started), 6 a GPU failed the GPU preflight (nothing was started),
    130 interrupted.
    """


def _register() -> None:
    from .check import check
    from .clean import clean
    from .execute import execute
    from .launch import launch
    from .observe import stacks, top
    from .pull import forward, pull
    from .runs import logs, ps, stop
    from .sweep import sweep

    for command in (launch, ps, logs, stop, stacks, top, pull, forward, check, execute, sweep, clean):
        group.add_command(command)


_register()


def run(argv: Optional[Sequence[str]] = None) -> int:
    """Run the command line and return its exit code (what `main` exits with)."""
    try:
        code = group.main(args=list(argv) if argv is not None else None, prog_name="clusterrun",
                          standalone_mode=False)
    except click.exceptions.Abort:
        return EXIT_INTERRUPTED
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code if exc.exit_code else EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except ClusterrunError as exc:
        from rich.text import Text

        from ..ui.console import console

        console(stderr=True).print(Text(f"clusterrun: {exc}", style="bold red"))
        return exc.exit_code
    return code if isinstance(code, int) else 0


def main(argv: Optional[Sequence[str]] = None) -> None:
    """The console script's entry point: the only exit in clusterrun.

    Once the command has returned, everything it must leave behind is already on disk (the registry's
    SQLite commits, log copies written through unbuffered fds, pulled files renamed into place): what
    is left is the interpreter tearing down every module's objects (paramiko, cryptography, rich), 30 to
    40 ms after the run's end for nothing. So: wait for any non-daemon thread as sys.exit would, run the
    atexit handlers, flush stdout and stderr, and end the process."""
    code = run(argv)
    import atexit
    import os
    import threading

    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (`clusterrun ps | head`): nothing more to say there
            pass
    os._exit(code)
