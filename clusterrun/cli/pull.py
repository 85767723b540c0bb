"""`clusterrun pull` and `clusterrun forward`: a run's files back here, and its ports reached from here."""

from __future__ import annotations

import json
import queue
import re
from typing import TYPE_CHECKING, List, Optional, Sequence, Tuple

import click

from ..errors import EXIT_CONNECT, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, ConnectError, RunNotFound, UsageError
from .common import connect_for, forward_signals, store
from .runs import _complete_runs

if TYPE_CHECKING:
    from ..transport.forward import PortSpec

PORT_SPEC = re.compile(r"^\d{1,5}(:\d{1,5})?$")


def parse_spec(text: str) -> "PortSpec":
    """PORT (the same port here), PORT:LOCAL, or PORT:0 (a free port here)."""
    from ..transport.forward import PortSpec

    remote, _, local = text.partition(":")
    try:
        spec: Optional[PortSpec] = PortSpec(int(remote), int(local) if local else int(remote))
    except ValueError:
        spec = None
    if spec is None or not 1 <= spec.remote <= 65535 or not 0 <= spec.local <= 65535:
        raise UsageError(f"{text!r}: give PORT or PORT:LOCAL (ports 1-65535; LOCAL 0 picks a free one), "
                         "e.g. 6006 or 6006:16006")
    return spec


def split_run(registry, args: Sequence[str]) -> Tuple[str, List[str]]:
    """[RUN] [REST...]: the first argument is the run when the registry knows it (an id, a unique prefix,
    `latest`), or when it looks like one (digits first: a typo'd id is an error, not a path)."""
    if args:
        try:
            return registry.resolve(args[0]), list(args[1:])
        except RunNotFound:
            if args[0][:1].isdigit():
                raise
    return registry.resolve(None), list(args)


@click.command()
@click.argument("args", nargs=-1, shell_complete=_complete_runs)
@click.option("--host", default=None, help="From this host of the run (default: rank 0's).")
@click.option("--all-hosts", is_flag=True, help="From every host of the run, each into DIR/<host>/.")
@click.option("--to", "to", default=None, metavar="DIR", help="Into DIR (default: runs/RUN/outputs/ in the state folder).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable summary on stdout.")
def pull(args: Sequence[str], host: Optional[str], all_hosts: bool, to: Optional[str], as_json: bool) -> int:
    """Bring files of RUN's folder back here: clusterrun pull [RUN] [PATH...].

    PATH: a file, folder or glob in the run's job folder, or checkpoints/...; default job.outputs.
    Incremental by content, resumable, atomic per file. Exit 0; 1 when a host failed; 2 bad input
    (nothing written); 3 a host unreachable; 130 interrupted (pull again to continue).
    """
    from ..runs.pull import pull_run
    from ..ui.run_view import RunView
    from ..ui.tables import show_pull
    from ..events import Phase

    if host is not None and all_hosts:
        raise UsageError("give --host NAME or --all-hosts, not both")
    registry = store()
    run_id, paths = split_run(registry, args)
    record = registry.get(run_id)
    view = RunView()
    events: "queue.Queue" = queue.Queue()
    stop_flag: List[bool] = []

    def drain() -> None:
        while not events.empty():
            view.handle(events.get_nowait())

    view.handle(Phase("pull"))
    try:
        with forward_signals(lambda: stop_flag.append(True)):
            result = pull_run(registry, run_id, connect_for(record), paths=paths, host=host, all_hosts=all_hosts,
                              to=to, post=events.put, poll=drain, stop=lambda: bool(stop_flag))
        drain()
    finally:
        view.close()
    if as_json:
        click.echo(json.dumps(result.to_json(), indent=2))
    show_pull(result, view.err)
    if result.interrupted:
        return EXIT_INTERRUPTED
    if result.failed:
        return EXIT_CONNECT if all(isinstance(e, ConnectError) for e in result.failed.values()) else EXIT_FAILED
    return EXIT_OK


@click.command()
@click.argument("args", nargs=-1, required=True, shell_complete=_complete_runs)
@click.option("--host", default=None, help="A port on this host of the run (default: rank 0's).")
def forward(args: Sequence[str], host: Optional[str]) -> int:
    """Reach localhost:PORT on RUN's rank 0 host at 127.0.0.1:LOCAL here: clusterrun forward [RUN] PORT[:LOCAL]...

    As `ssh -L LOCAL:localhost:PORT`, over the connection clusterrun makes (ssh config, jumps, host
    keys). LOCAL defaults to PORT; 0 picks a free one. Ends on Ctrl-C or when the run ends.
    """
    from rich.text import Text

    from ..runs.forward import forward_run
    from ..ui.console import console
    from ..ui.ports import banner

    registry = store()
    if PORT_SPEC.match(args[0]):  # ports are 1-5 digits: a run id's prefix that short would be one too
        run_id, ports = registry.resolve(None), list(args)
    else:
        run_id, ports = registry.resolve(args[0]), list(args[1:])
    if not ports:
        raise UsageError("forward: give the PORT to reach (clusterrun forward [RUN] PORT[:LOCAL])")
    specs = [parse_spec(p) for p in ports]
    err = console(stderr=True)
    stop_flag: List[bool] = []

    def ready(name: str, bound) -> None:
        for spec in bound:
            click.echo(f"http://127.0.0.1:{spec.local}")  # stdout: what a script reads (the port, with :0)
            err.print(Text(banner(spec.remote, spec.local, name), style="bold"))
        err.print(Text(f"run {run_id}: forwarding until Ctrl-C or the run's end", style="dim"))

    with forward_signals(lambda: stop_flag.append(True)):
        name, why = forward_run(registry, run_id, connect_for(registry.get(run_id)), specs, host=host,
                                stop=lambda: bool(stop_flag), on_ready=ready,
                                on_note=lambda text: err.print(Text(text, style="yellow")))
    err.print(Text(f"forward to {name} closed: {why}", style="dim"))
    return EXIT_INTERRUPTED if stop_flag else EXIT_OK
