"""What the launch's preflight needs to know of this host, found while the push goes on and sent in its
first answer (receive.py: no extra round trip): the Python, the interface the ranks will use
(net/ifaces.py), whether rank 0's fixed master port is free (who holds it: net/holder.py; a run
starting here that will listen there: net/claimed.py), and, for a launch without job.environment, the
plain python's stack fingerprint (env/fingerprint.py, cached here), which the launch compares across its
hosts before any rank starts."""

import errno
import os
import sys

from ..stdlib import socket
from ..net.ifaces import find as find_interface


def host_facts(port, master_addr, workdir="", env_base=None, fingerprint=False):
    """What launch's preflight needs to know, found while the push goes on (no extra round trip).
    env_base: job.environment's base interpreter, described (or its absence said: env/base.py);
    fingerprint: this python's stack fingerprint is wanted (a launch without job.environment)."""
    facts = {"python": sys.version.split()[0], "executable": sys.executable}  # as platform.python_version()
    if env_base:  # imported here, as the holder and the claimed port below: a launch needs them seldom
        from ..env.base import describe_base, describe_cached

        facts["env_base"] = describe_cached(workdir, env_base) if workdir else describe_base(env_base)
    if fingerprint:
        from ..env.fingerprint import of_interpreter

        facts["fingerprint"] = of_interpreter(workdir)
    facts["net"] = find_interface(master_addr)  # network: {ifname: auto} (net/ifaces.py)
    if port:  # rank 0's fixed master port must be free, bound the way torch's store binds it
        family = socket.AF_INET6 if ":" in master_addr else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("::" if family == socket.AF_INET6 else "", port))
            facts["port"] = {"free": True, "port": port}
        except OSError as exc:
            facts["port"] = {"free": False, "port": port, "error": "%s (%s)" % (
                os.strerror(exc.errno) if exc.errno else exc, errno.errorcode.get(exc.errno, "?"))}
            if exc.errno == errno.EADDRINUSE:
                from ..net.holder import port_holder

                facts["port"]["holder"] = port_holder(port)
        finally:
            sock.close()
        _claimed(facts, port, workdir)
    return facts


def _claimed(facts, port, workdir):
    """A port that is free for now is not free when a run started here will listen there in a moment."""
    from ..net.claimed import run_on_port

    claim = run_on_port(workdir, port) if workdir and facts["port"]["free"] else None
    if claim is not None:
        facts["port"] = {"free": False, "port": port, "holder": claim,
                         "error": "claimed by a run that is starting (EADDRINUSE once it listens)"}
