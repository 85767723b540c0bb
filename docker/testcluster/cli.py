"""`python docker/testcluster COMMAND`: up, down, status, ssh, build, clean (see the package docstring)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from typing import Sequence

from . import __doc__ as __package_doc__
from .cluster import Cluster
from .common import DEFAULT_HOSTS, DEFAULT_NAME, DEFAULT_SUBNET, ClusterError, commands
from .image import build_image, remove_images


def _cmd_up(a) -> int:
    c = Cluster(a.name, a.hosts, a.subnet, quiet=a.quiet, second_subnet=a.second_subnet)
    t0 = time.monotonic()
    c.up(timeout=a.timeout)
    t = c.timings
    print(f"cluster {c.name!r}: {len(c.hosts)} hosts ready in {time.monotonic() - t0:.1f} s (image "
          f"{t['image']:.1f} s, containers {t['compose']:.1f} s, first SSH logins {t['ssh']:.1f} s)",
          file=sys.stderr)
    for h in c.hosts:
        print(f"  {h.name}  {h.address}" + (f"  {h.address2}" if h.address2 else ""), file=sys.stderr)
    cmd = commands()
    name = "" if c.name == DEFAULT_NAME else f" --name {c.name}"
    print(f"inventory: {c.inventory_path}", file=sys.stderr)
    print(f"check:     {cmd['clusterrun']} check {c.inventory_path}", file=sys.stderr)
    print(f"launch:    {cmd['clusterrun']} launch {c.inventory_path}", file=sys.stderr)
    print(f"ssh:       ssh -F {c.ssh_config_path} node0", file=sys.stderr)
    print(f"down:      {cmd['testcluster']} down{name}", file=sys.stderr)
    print(c.inventory_path)  # stdout: just the path, for scripts
    return 0


def _cmd_down(a) -> int:
    Cluster(a.name).down()
    print(f"cluster {a.name!r} removed", file=sys.stderr)
    return 0


def _cmd_status(a) -> int:
    c = Cluster(a.name)
    rows = c.status()
    if a.json:
        print(json.dumps({"name": c.name, "subnet": str(c.subnet), "inventory": str(c.inventory_path),
                          "hosts": rows}, indent=2))
        return 0 if all(r["ssh"] for r in rows) else 1
    if not c.state_path.exists() and all(r["state"] == "missing" for r in rows):
        print(f"cluster {c.name!r} is not up", file=sys.stderr)
        return 1
    print(f"cluster {c.name!r} ({c.subnet}), inventory {c.inventory_path}")
    for r in rows:
        print(f"  {r['name']:<7} {r['address']:<15} {r['state']:<8} "
              f"{'net' if r['network'] else 'NO-NET'}  ssh {'ok' if r['ssh'] else 'FAILED'}")
    return 0 if all(r["ssh"] for r in rows) else 1


def _cmd_ssh(a) -> int:
    c = Cluster(a.name)
    argv = c.ssh_argv(a.host, " ".join(a.command))  # as ssh itself does: the remote shell splits it
    os.execvp(argv[0], argv)
    return 127


def _cmd_build(a) -> int:
    print(build_image(force=a.force, quiet=a.quiet))
    return 0


def _cmd_clean(a) -> int:
    for ref in remove_images(include_base=a.all):
        print(f"removed {ref}", file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="testcluster", description=(__package_doc__ or "").split("\n\n")[0])
    p.add_argument("-v", "--verbose", action="store_true", help="log every docker command")
    sub = p.add_subparsers(dest="cmd", required=True)

    def named(sp):
        sp.add_argument("--name", default=DEFAULT_NAME, help=f"cluster name (default {DEFAULT_NAME})")
        return sp

    up = named(sub.add_parser("up", help="build (cached), start, wait for SSH, write the inventory"))
    up.add_argument("--hosts", type=int, default=DEFAULT_HOSTS, help=f"number of hosts (default {DEFAULT_HOSTS})")
    up.add_argument("--subnet", default=None, help=f"IPv4 /24 or larger (default {DEFAULT_SUBNET}, "
                                                    "or the cluster's current one)")
    up.add_argument("--second-subnet", default=None, help="give every host a second interface, on a second "
                                                           "network with this subnet (eth1)")
    up.add_argument("--timeout", type=float, default=120, help="seconds to wait for SSH logins")
    up.add_argument("-q", "--quiet", action="store_true", help="no build output")
    up.set_defaults(func=_cmd_up)
    named(sub.add_parser("down", help="remove containers, network and .cluster/NAME")).set_defaults(func=_cmd_down)
    st = named(sub.add_parser("status", help="state and SSH login of each host"))
    st.add_argument("--json", action="store_true")
    st.set_defaults(func=_cmd_status)
    ssh = named(sub.add_parser("ssh", help="log in to a host (or run a command) as cr"))
    ssh.add_argument("host")
    ssh.add_argument("command", nargs=argparse.REMAINDER)
    ssh.set_defaults(func=_cmd_ssh)
    b = sub.add_parser("build", help="build the image if its inputs changed; print its tag")
    b.add_argument("--force", action="store_true")
    b.add_argument("-q", "--quiet", action="store_true")
    b.set_defaults(func=_cmd_build)
    cl = sub.add_parser("clean", help="remove clusterrun/host images")
    cl.add_argument("--all", action="store_true", help="the debootstrap base image too")
    cl.set_defaults(func=_cmd_clean)

    a = p.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if a.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(message)s")
    try:
        return a.func(a)
    except ClusterError as exc:
        print(f"testcluster: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
