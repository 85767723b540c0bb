"""Paramiko baselines, run as their own process so interpreter start-up counts as it does for clusterrun.

  floor  connect to every host (a thread each, TCP_NODELAY, key loaded once, strict host keys) and run
         `true` (or --command, "{rank}" replaced by the host's place in --hosts), waiting for its exit:
         the least any SSH launcher can do; with the job as the command, the whole-process floor of a
         launch (a fresh Python that imports paramiko, connects in threads, runs the job and waits).
  sftp   paramiko's SFTP with default settings: SSHClient.connect, open_sftp, put every file
         (a thread per host), as a user of paramiko would write it.

Prints one JSON line: {"inner_s": seconds from after the imports to the end, ...}.
Stdlib + paramiko only; no import of the bench package.
"""

import argparse
import json
import os
import socket
import sys
import threading
import time

import paramiko



def on_every_host(hosts: str, one) -> None:
    """one(host) for every host of a comma-separated list, a thread each, all at once."""
    on_every_rank(hosts, lambda host, _: one(host))


def on_every_rank(hosts: str, one) -> None:
    """one(host, i) for the i-th host of a comma-separated list, a thread each, all at once."""
    threads = [threading.Thread(target=one, args=(h, i)) for i, h in enumerate(hosts.split(","))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

def _client(known_hosts):
    client = paramiko.SSHClient()
    client.load_host_keys(known_hosts)
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    return client


def floor(a):
    t0 = time.monotonic()
    key = paramiko.Ed25519Key.from_private_key_file(a.key)
    errors = {}

    def one(host, rank):
        try:
            sock = socket.create_connection((host, 22), timeout=10)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            client = _client(a.known_hosts)
            client.connect(host, username=a.user, pkey=key, sock=sock, look_for_keys=False, allow_agent=False,
                           timeout=10, banner_timeout=10, auth_timeout=10)
            _, out, _ = client.exec_command(a.command.replace("{rank}", str(rank)))
            code = out.channel.recv_exit_status()
            if code:
                errors[host] = f"exit {code}"
            sock.shutdown(socket.SHUT_RDWR)  # else close() lingers ~80 ms
            client.close()
        except Exception as exc:
            errors[host] = repr(exc)

    on_every_rank(a.hosts, one)
    print(json.dumps({"inner_s": time.monotonic() - t0, "errors": errors}))
    return 1 if errors else 0


def sftp(a):
    t0 = time.monotonic()
    errors = {}
    sent = [0]
    lock = threading.Lock()

    def one(host):
        try:
            client = _client(a.known_hosts)
            client.connect(host, username=a.user, key_filename=a.key, look_for_keys=False, allow_agent=False)
            sf = client.open_sftp()
            n = 0
            for top, dirs, files in os.walk(a.src):
                rel = os.path.relpath(top, a.src)
                remote = a.dest if rel == "." else f"{a.dest}/{rel}"
                for d in dirs:
                    sf.mkdir(f"{remote}/{d}")
                for f in files:
                    local = os.path.join(top, f)
                    sf.put(local, f"{remote}/{f}")
                    n += os.path.getsize(local)
            sf.close()
            client.close()
            with lock:
                sent[0] += n
        except Exception as exc:
            errors[host] = repr(exc)

    on_every_host(a.hosts, one)
    print(json.dumps({"inner_s": time.monotonic() - t0, "bytes": sent[0], "errors": errors}))
    return 1 if errors else 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=("floor", "sftp"))
    p.add_argument("--hosts", required=True, help="comma-separated addresses")
    p.add_argument("--user", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--known-hosts", required=True)
    p.add_argument("--command", default="true", help='floor: what each host runs ("{rank}": its place in --hosts)')
    p.add_argument("--src", help="sftp: local folder")
    p.add_argument("--dest", help="sftp: remote folder (exists), relative to the login's home")
    a = p.parse_args(argv)
    return floor(a) if a.mode == "floor" else sftp(a)


if __name__ == "__main__":
    sys.exit(main())
