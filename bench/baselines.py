"""The ways people launch and copy today, as command lines: a serial ssh loop, pdsh, scp, rsync,
parallel ssh, and the paramiko programs of paramiko_tools.py (floor, default SFTP)."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

from .cluster import HOST_PYTHON, BenchCluster

TOOLS = Path(__file__).resolve().parent / "paramiko_tools.py"


def measured_env() -> Dict[str, str]:
    """This environment for a measured command, less PYTHONDONTWRITEBYTECODE: a user's Python keeps its
    bytecode caches (pip compiles what it installs), and a Python that compiled clusterrun's modules on every
    start would time the compiler, not the launcher (some shells here set it)."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def rank_command(cluster: BenchCluster, rank: str, script: str, args: Sequence[str], *, folder: str,
                 master_port: int, background: bool = True, log: str = "rank.log",
                 extra_env: Sequence[str] = ()) -> str:
    """The line a tutorial has you type on each host: env, then `python script --rank i --world-size n`.

    `rank` is a number or a shell expression (pdsh: the host works its rank out from its name)."""
    env = (f"RANK={rank} WORLD_SIZE={cluster.n} LOCAL_RANK=0 MASTER_ADDR={cluster.addresses[0]} "
           f"MASTER_PORT={master_port} OMP_NUM_THREADS=1" + "".join(" " + shlex.quote(e) for e in extra_env))
    cmd = f"{env} {HOST_PYTHON} {shlex.quote(script)} --rank {rank} --world-size {cluster.n} {shlex.join(args)}"
    if background:
        cmd = f"{env} nohup {HOST_PYTHON} {shlex.quote(script)} --rank {rank} --world-size {cluster.n} " \
              f"{shlex.join(args)} >{log} 2>&1 </dev/null &"
    # `cd x && cmd &` would background the whole list, whose shell keeps the session's output open
    # (ssh would wait for the rank to end): cd first, then background only the rank.
    return f"cd {folder} || exit 1; {cmd}"


def serial_ssh_script(cluster: BenchCluster, script: str, args: Sequence[str], folder: str,
                      master_port: int = 29510) -> str:
    """A bash loop, one `ssh host 'nohup python ... &'` after another (the tutorials' way)."""
    lines = ["#!/bin/bash", "set -e"]
    for i, addr in enumerate(cluster.addresses):
        remote = rank_command(cluster, str(i), script, args, folder=folder, master_port=master_port)
        lines.append(shlex.join(["ssh", *cluster.ssh_options(), "-l", cluster.user, addr, remote]))
    return "\n".join(lines) + "\n"


def pdsh(cluster: BenchCluster, script: str, args: Sequence[str], folder: str,
         master_port: int = 29510) -> Tuple[List[str], Dict[str, str]]:
    """One pdsh fan-out (the DeepSpeed launcher's way); each host takes its rank from its name (nodeK)."""
    remote = "r=$(hostname); r=${r#node}; " + rank_command(cluster, "$r", script, args, folder=folder,
                                                                 master_port=master_port)
    # pdsh's ssh module runs `ssh $PDSH_SSH_ARGS $PDSH_SSH_ARGS_APPEND`; the default args carry -l%u %h
    env = {"PDSH_SSH_ARGS_APPEND": shlex.join(cluster.ssh_options())}
    argv = ["pdsh", "-R", "ssh", "-l", cluster.user, "-f", str(max(32, cluster.n)),
            "-w", ",".join(cluster.addresses), remote]
    return argv, env


def pdsh_command(cluster: BenchCluster, command: str) -> Tuple[List[str], Dict[str, str]]:
    """pdsh running one command line on every host."""
    env = {"PDSH_SSH_ARGS_APPEND": shlex.join(cluster.ssh_options())}
    return ["pdsh", "-R", "ssh", "-l", cluster.user, "-f", str(max(32, cluster.n)),
            "-w", ",".join(cluster.addresses), command], env


def floor(cluster: BenchCluster, command: str = "true") -> List[str]:
    """paramiko: connect to every host at once and run one command (`true`: the least any SSH launcher can do)."""
    return [sys.executable, str(TOOLS), "floor", "--hosts", ",".join(cluster.addresses), "--user", cluster.user,
            "--key", cluster.key, "--known-hosts", cluster.known_hosts, "--command", command]


def floor_job(cluster: BenchCluster, script: str, args: Sequence[str], folder: str,
              master_port: int = 29510) -> List[str]:
    """The fair floor: the same paramiko fan-out, each host starting the job's Python (detached, its rank
    from its name as with pdsh), timed like clusterrun: to the last rank's first statement."""
    remote = "r=$(hostname); r=${r#node}; " + rank_command(cluster, "$r", script, args, folder=folder,
                                                                 master_port=master_port)
    return floor(cluster, remote)


def sftp(cluster: BenchCluster, src: Path, dest: str) -> List[str]:
    return [sys.executable, str(TOOLS), "sftp", "--hosts", ",".join(cluster.addresses), "--user", cluster.user,
            "--key", cluster.key, "--known-hosts", cluster.known_hosts, "--src", str(src), "--dest", dest]


def scp(cluster: BenchCluster, sources: Sequence[Path], dest: str) -> List[List[str]]:
    """`scp -r` to every host at once (OpenSSH 9's scp speaks SFTP underneath, as users get it)."""
    return [["scp", "-r", "-q", *cluster.ssh_options(), *map(str, sources), f"{cluster.user}@{addr}:{dest}"]
            for addr in cluster.addresses]


def rsync(cluster: BenchCluster, src: Path, dest: str) -> List[List[str]]:
    shell = shlex.join(["ssh", *cluster.ssh_options()])
    return [["rsync", "-a", "-e", shell, f"{src}/", f"{cluster.user}@{addr}:{dest}/"] for addr in cluster.addresses]


def ssh_each(cluster: BenchCluster, script: str, args_of, folder: str) -> List[List[str]]:
    """`ssh host python script` to every host at once, output through each ssh's stdout."""
    return [cluster.ssh_argv(i, f"cd {folder} && PYTHONUNBUFFERED=1 {HOST_PYTHON} {shlex.quote(script)} "
                                f"--rank {i} --world-size {cluster.n} {shlex.join(args_of(i))}")
            for i in range(cluster.n)]
