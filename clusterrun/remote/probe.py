"""clusterrun's preflight probe: one stdlib-only file the controller feeds to a host's Python on stdin.

Usage (by the controller, never by hand): python - COMMAND [TAG] < (OPTIONS line + probe.py)

  facts   everything `clusterrun check` wants to know about this host (torch in a child process; the
          GPU preflight where the run uses GPUs)
  reach   a TCP connection to MASTER_ADDR:MASTER_PORT, and the token file in the shared folder
  listen  (rank 0's host) bind the master port, accept the other hosts' test connections, print each

The controller puts `OPTIONS = '<json>'` in front of this source, so options (the host's env among
them) never show on a command line and no login shell can mangle them. TAG only names a listener for
the controller that stops it. Every answer is one JSON object per line on stdout. It is never installed on the host: nothing stays
behind but what `listen` removes at exit. Kept to Python 3.6 so it can still say that a Python is old.
"""

import errno
import json
import os
import platform
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
import types

LOOKUP_TIMEOUT = 3.0  # a name lookup gives up here (a dead DNS): check itself stays bounded

# TORCH_SNIPPET (remote/torch_probe.py, run in a child), STACK_SNIPPET (the stack fingerprint), IFACES_SOURCE (remote/host/net/ifaces.py: the
# interface launch picks, picked the same way here) and HOLDER_SOURCE (remote/host/net/holder.py: who
# listens on a port, named as the launch's preflight names it) and GPU_SOURCE (remote/host/share/gpu_health.py:
# the GPU preflight, as a launch runs it) are put in front of this source with OPTIONS.


def say(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def error_text(exc):
    code = errno.errorcode.get(getattr(exc, "errno", None) or 0, "")
    return ("%s %s" % (code, exc.strerror or exc)).strip() if isinstance(exc, OSError) else str(exc)


# ------------------------------------------------------------------ facts


def python_facts():
    return {"python": platform.python_version(), "executable": sys.executable,
            "implementation": platform.python_implementation(), "hostname": socket.gethostname(),
            "uid": os.getuid() if hasattr(os, "getuid") else None}


def stack_facts():
    """The stack fingerprint, read as a launch reads it (STACK_SNIPPET: remote/host/env/fingerprint.py's
    PROBE, no torch import), and the NVIDIA driver's version where there is one."""
    space = {}
    try:
        exec(compile(globals()["STACK_SNIPPET"], "<fingerprint>", "exec"), space)
        found = space["found"]
    except Exception as exc:
        return {"error": "%s: %s" % (type(exc).__name__, exc)}
    found["driver"] = None
    try:
        with open("/proc/driver/nvidia/version") as fh:
            m = re.search(r"Kernel Module\s+(\d+(?:\.\d+)+)", fh.read())
            found["driver"] = m.group(1) if m else None
    except OSError:
        pass
    return found


def disk_facts(workdir):
    """Free space where the workdir is or would be created (its nearest existing parent)."""
    path = os.path.expanduser(workdir)
    where = path
    while not os.path.isdir(where):
        parent = os.path.dirname(where)
        if parent == where:
            break
        where = parent
    try:
        usage = shutil.disk_usage(where)
    except OSError as exc:
        return {"path": path, "error": error_text(exc)}
    return {"path": path, "exists": os.path.isdir(path), "checked": where, "free": usage.free,
            "total": usage.total, "writable": os.access(where, os.W_OK | os.X_OK), "usage": workdir_usage(path)}


def workdir_usage(path):
    """Run folders (their number; bytes of files only they link: logs, outputs) and the content cache."""
    runs, out = os.path.join(path, "runs"), {"runs": 0, "runs_bytes": 0, "cache_bytes": 0}
    out["runs"] = sum(1 for n in os.listdir(runs) if not n.startswith(".")) if os.path.isdir(runs) else 0
    for key, folder in (("runs_bytes", runs), ("cache_bytes", os.path.join(path, "cache", "objects"))):
        for root, _dirs, files in os.walk(folder):
            for st in (_lstat(os.path.join(root, name)) for name in files):
                out[key] += st.st_size if st and (key == "cache_bytes" or st.st_nlink == 1) else 0
    return out


def _lstat(path):
    try:
        return os.lstat(path)
    except OSError:
        return None


def ib_facts(root="/sys/class/infiniband"):
    """InfiniBand/RoCE devices and their ports: [{"device", "ports": [{"port", "state", "link_layer",
    "rate"}]}] ([] where there are none)."""
    out = []
    try:
        devices = sorted(os.listdir(root))
    except OSError:
        return out
    for device in devices:
        ports = []
        try:
            names = sorted(os.listdir(os.path.join(root, device, "ports")))
        except OSError:
            names = []
        for port in names:
            folder = os.path.join(root, device, "ports", port)
            ports.append(dict((key, _first_line(os.path.join(folder, key))) for key in ("state", "link_layer", "rate")))
            ports[-1]["port"] = port
        out.append({"device": device, "ports": ports})
    return out


def _first_line(path):
    try:
        with open(path) as fh:
            return fh.readline().strip()
    except OSError:
        return ""


def ifaces_module():
    """remote/host/net/ifaces.py, from its source in front of this one."""
    return source_module("ifaces", "IFACES_SOURCE")


def source_module(name, variable):
    """A module of the host program (remote/host/net/NAME.py), from its source put in front of this one."""
    module = types.ModuleType(name)
    exec(compile(globals()[variable], name + ".py", "exec"), module.__dict__)
    return module


def resolve(name, timeout=LOOKUP_TIMEOUT):
    """(family, address) of a name, the lookup given up after timeout (a dead DNS): OSError otherwise."""
    ifaces = ifaces_module()
    addrs, _, error = ifaces.lookup(name, timeout)
    addr = ifaces.pick_address(addrs)
    if addr is None:
        raise OSError(error)
    return (socket.AF_INET6 if ":" in addr else socket.AF_INET), addr


def timed_lookups(ifaces, hostname, master, own_addr, timeout):
    """{name: (addresses, seconds, error)} of the names a run looks up here (its own name; rank 0's addr and
    this host's when they are names), all at once; and the same as records for the report."""
    names = [(hostname, "own name")]
    for name, what in ((master, "rank 0's addr"), (own_addr, "own addr")):
        if name and not ifaces.is_ip(name) and name not in [n for n, _ in names]:
            names.append((name, what))
    found = ifaces.lookup_many([n for n, _ in names], timeout)
    return found, [{"name": n, "what": w, "addrs": found[n][0], "seconds": found[n][1], "error": found[n][2]}
                   for n, w in names]


def network_facts(opts):
    """How this host reaches MASTER_ADDR: the interface launch would pick (ifaces.find), the resolved
    address, the kernel's source address and interface; the name lookups that takes, timed (a dead DNS),
    all at once and each given up after lookup_timeout."""
    ifaces = ifaces_module()
    master, own_addr = opts["master_addr"], opts.get("own_addr") or ""
    out = {"hostname": socket.gethostname()}
    found, out["lookups"] = timed_lookups(ifaces, out["hostname"], master, own_addr,
                                          opts.get("lookup_timeout", LOOKUP_TIMEOUT))
    own = found[out["hostname"]]
    if own[0]:
        out["hostname_addrs"] = own[0]  # what gloo binds to by default
    else:
        out["hostname_error"] = own[2]
    out["choice"] = ifaces.find(master, resolve=found.get)
    out["interfaces"] = [{"name": i["name"], "addr": a, "up": i["up"]} for i in out["choice"].get("interfaces", [])
                         for a in i["addrs"] if ":" not in a]
    mine = found.get(own_addr) or ([own_addr] if own_addr else [], 0, "")
    out["own"] = {"addr": own_addr, "ips": mine[0], "error": mine[2]}
    addr = ifaces.pick_address(found[master][0]) if master in found else master
    if addr is None:
        out["resolve_error"] = found[master][2]
        return out
    out["master_ip"] = addr
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    udp = socket.socket(family, socket.SOCK_DGRAM)
    try:
        udp.connect((addr, opts.get("port") or 9))  # a UDP connect only picks the route: no packet leaves
        out["source"] = udp.getsockname()[0]
    except OSError as exc:
        out["route_error"] = error_text(exc)
    finally:
        udp.close()
    return out


def connect_test(family, addr, port, timeout, name):
    t0 = time.time()
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect((addr, port))
        sock.sendall((name + "\n").encode())
        return {"status": "ok", "ms": round((time.time() - t0) * 1000, 2), "local": sock.getsockname()[0]}
    except socket.timeout:
        return {"status": "timeout", "seconds": timeout}
    except ConnectionRefusedError:
        return {"status": "refused"}
    except OSError as exc:
        unreachable = (errno.ENETUNREACH, errno.EHOSTUNREACH, errno.EINVAL, errno.EADDRNOTAVAIL)
        return {"status": "unreachable" if exc.errno in unreachable else "error", "error": error_text(exc)}
    finally:
        sock.close()


def shared_facts(opts):
    """Read the token file rank 0's host wrote: the same bytes here mean the folder is really shared."""
    folder = os.path.dirname(opts["shared_file"])
    out = {"dir_exists": os.path.isdir(folder), "writable": os.access(folder, os.W_OK | os.X_OK)}
    try:
        with open(opts["shared_file"]) as fh:
            out["status"] = "ok" if fh.read() == opts["token"] else "different"
    except FileNotFoundError:
        out["status"] = "missing"
    except OSError as exc:
        out["status"], out["error"] = "error", error_text(exc)
    return out


def start_torch(env):
    child_env = dict(os.environ)
    child_env.update(env or {})
    return subprocess.Popen([sys.executable, "-c", globals()["TORCH_SNIPPET"]], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_env)


def finish_torch(proc, timeout):
    t0 = time.time()
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()  # our own child
        proc.communicate()
        return {"error": "import torch did not finish within %g s" % timeout}
    result = {"seconds": round(time.time() - t0, 3)}
    lines = [line for line in out.decode("utf-8", "replace").splitlines() if line.startswith("{")]
    for line in lines:
        result.update(json.loads(line))
    if not lines:
        tail = err.decode("utf-8", "replace").strip().splitlines()[-3:]
        result["error"] = "the torch probe died (exit %s): %s" % (proc.returncode, " / ".join(tail))
    return result


def cmd_facts(opts):
    say({"time": time.time()})  # first: the controller times this line's arrival for the clock check
    torch_proc = start_torch(opts.get("env")) if opts.get("torch") else None
    facts = python_facts()
    facts["disk"] = disk_facts(opts["workdir"])
    facts["stack"] = stack_facts()
    facts["net"] = network_facts(opts)
    facts["ib"] = ib_facts(opts.get("ib_dir") or "/sys/class/infiniband")
    if opts.get("gpu"):  # while torch imports in its child
        facts["gpu"] = source_module("gpu_health", "GPU_SOURCE").check(opts["gpu"])
    if torch_proc is not None:
        facts["torch"] = finish_torch(torch_proc, opts.get("torch_timeout", 30.0))
    say({"facts": facts})
    return 0


def cmd_reach(opts):
    """Run while rank 0's host listens (and its token file exists): apart from facts, so that no host's
    torch import waits for rank 0's host, nor the other way round."""
    out = {}
    if opts.get("shared_file"):  # before connecting: the listener leaves (removing the file) once all connected
        out["shared"] = shared_facts(opts)
    if opts.get("port"):
        try:
            family, addr = resolve(opts["master_addr"])
            out["connect"] = connect_test(family, addr, opts["port"], opts.get("connect_timeout", 3.0), opts["name"])
        except OSError as exc:
            out["connect"] = {"status": "error", "error": "cannot resolve: " + error_text(exc)}
    peer = opts.get("peer")
    if peer:  # the relay chain: this host opens the connection to the next host's program (hosts/relay.py)
        try:
            family, addr = resolve(peer["addr"])
            out["relay"] = connect_test(family, addr, peer["port"], opts.get("connect_timeout", 3.0), opts["name"])
        except OSError as exc:
            out["relay"] = {"status": "error", "error": "cannot resolve: " + error_text(exc)}
    say({"reach": out})
    return 0


# ------------------------------------------------------------------ the master port


def bind_port(port, family):
    """A listening socket on port (all interfaces), as torch's TCPStore would bind it (SO_REUSEADDR)."""
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("::" if family == socket.AF_INET6 else "", port))
        sock.listen(64)
    except OSError as exc:
        sock.close()
        result = {"free": False, "error": error_text(exc)}
        if exc.errno == errno.EADDRINUSE:
            result["holder"] = source_module("holder", "HOLDER_SOURCE").port_holder(port)
        return None, result
    return sock, {"free": True, "port": sock.getsockname()[1]}


def family_of(opts):
    return socket.AF_INET6 if ":" in (opts.get("master_addr") or "") else socket.AF_INET


# ------------------------------------------------------------------ listen (rank 0's host)


def write_token(path, token):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)  # 0644: other users on other hosts read it
    with os.fdopen(fd, "w") as fh:
        fh.write(token)


def cmd_listen(opts):
    """Bind the master port, say ready, accept the other hosts' connections until all came, the
    deadline passed, the controller went away, or TERM; remove the shared token file on the way out."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    parent = os.getppid()
    written = None
    sock = None
    try:
        ready = {"ready": True, "pid": os.getpid()}
        if opts.get("shared_file"):
            try:
                write_token(opts["shared_file"], opts["token"])
                written = opts["shared_file"]
                ready["shared"] = {"status": "ok"}
            except OSError as exc:
                ready["shared"] = {"status": "error", "error": error_text(exc)}
        sock, ready["port"] = bind_port(opts.get("port") or 0, family_of(opts))
        say(ready)
        deadline = time.time() + opts.get("deadline", 30.0)
        seen = 0
        # sshd does not signal a command when its channel closes: a new parent tells us we were left behind
        while time.time() < deadline and seen < opts.get("expect", 0) and os.getppid() == parent:
            if sock is None:
                time.sleep(0.1)
                continue
            if not select.select([sock], [], [], 0.1)[0]:
                continue
            conn, peer = sock.accept()
            seen += 1
            conn.settimeout(1.0)
            data = b""
            try:  # to the peer's end: the side that closes first keeps TIME_WAIT, and it must not be the port
                while len(data) < 256:
                    chunk = conn.recv(256)
                    if not chunk:
                        break
                    data += chunk
            except OSError:
                pass
            conn.close()
            name = data.decode("utf-8", "replace").strip()
            say({"peer": peer[0], "name": name})
    finally:
        if sock is not None:
            sock.close()
        if written:
            try:
                os.unlink(written)
            except OSError:
                pass
    return 0


def main(argv):
    command = argv[1]
    opts = json.loads(globals().get("OPTIONS", "{}"))
    handler = {"facts": cmd_facts, "reach": cmd_reach, "listen": cmd_listen}.get(command)
    if handler is None:
        say({"error": "unknown command %r" % command})
        return 2
    try:
        return handler(opts)
    except BrokenPipeError:
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
