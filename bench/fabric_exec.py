"""fabric's ThreadingGroup running one command on every host, set up as clusterrun connects: the given
key only, host keys checked strictly against the cluster's known_hosts (fabric's Connection installs
AutoAddPolicy; it is replaced here). The baseline `clusterrun exec` is measured against (bench/sections/exec.py).

    python bench/fabric_exec.py --hosts A,B --user cr --key KEY --known-hosts FILE -- hostname
"""

import argparse
import sys

import paramiko
from fabric import ThreadingGroup
from fabric.exceptions import GroupException


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--hosts", required=True)
    p.add_argument("--user", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--known-hosts", required=True)
    p.add_argument("command", nargs=argparse.REMAINDER)
    a = p.parse_args(argv)
    command = a.command[1:] if a.command[:1] == ["--"] else a.command
    group = ThreadingGroup(*a.hosts.split(","), user=a.user, connect_timeout=10,
                           connect_kwargs={"key_filename": a.key, "look_for_keys": False, "allow_agent": False})
    for c in group:
        c.client.load_host_keys(a.known_hosts)
        c.client.set_missing_host_key_policy(paramiko.RejectPolicy())
    try:
        results = group.run(" ".join(command), hide=True, warn=True)
    except GroupException as exc:
        results = exc.result
    for conn, result in results.items():
        text = result.stdout if hasattr(result, "stdout") else str(result)
        sys.stdout.write(f"[{conn.host}] {text}")
    group.close()
    return 0 if all(getattr(r, "exited", 1) == 0 for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
