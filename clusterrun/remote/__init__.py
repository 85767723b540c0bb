"""The host program as the controller ships it: one zip of the stdlib-only package `host/`, its content
id, and the one-line bootstrap and installer that run it with the host's Python."""

from __future__ import annotations

import os

_HOST = os.path.join(os.path.dirname(os.path.abspath(__file__)), "host")
_MAIN = b"import sys\nfrom clusterrun_host.main import run\nrun(sys.argv)\n"


def host_sources():
    """(path relative to host/, bytes) of every module of the host program, subpackages included, sorted."""
    out = []
    for folder, dirs, files in os.walk(_HOST):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__")))
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path, "rb") as fh:
                    out.append((os.path.relpath(path, _HOST).replace(os.sep, "/"), fh.read()))
    return sorted(out)


def _entries():
    """(name in the zip, bytes) of everything the host program is made of."""
    return [("__main__.py", _MAIN)] + [(f"clusterrun_host/{rel}", data) for rel, data in host_sources()]


def _build_zip() -> bytes:
    """The package as one zip with a __main__.py (it travels in one write and is unpacked on the host);
    fixed timestamps keep its bytes the same wherever it is built from the same sources."""
    import io
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        for arcname, data in _entries():
            info = zipfile.ZipInfo(arcname, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o600 << 16
            zf.writestr(info, data)
    return buf.getvalue()


_BUILT: dict = {}


def __getattr__(name: str):
    """PROGRAM_ID (the content id: a hash over every file's name and bytes), and SOURCE (the zip) with its
    SHA-256 SOURCE_SHA256 (which the installer checks), made on first use: commands that never talk to a
    host program (`ps` from the registry, `--help`) do not read its sources, and only an install zips them.

    Hosts keep every version they were sent under its content id, so controllers of different versions
    can work on the same host side by side."""
    import hashlib

    if name == "PROGRAM_ID":
        if name not in _BUILT:
            digest = hashlib.sha256()
            for arcname, data in _entries():
                digest.update(b"%s\0%d\0" % (arcname.encode(), len(data)) + data)
            _BUILT[name] = digest.hexdigest()[:16]
        return _BUILT[name]
    if name in ("SOURCE", "SOURCE_SHA256"):
        if "SOURCE" not in _BUILT:
            source = _build_zip()
            _BUILT.update(SOURCE=source, SOURCE_SHA256=hashlib.sha256(source).hexdigest())
        return _BUILT[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


EXIT_PROGRAM_MISSING = 97
EXIT_UNSAFE_WORKDIR = 96
UNSAFE_WORKDIR = "clusterrun-unsafe-workdir"  # its line on stderr: the marker, the path, its owner, its mode

# Neither runs code it finds in a workdir (or bin/, or the program's folder) that is not the login user's
# own or that others may write to: on a shared path another user could have planted it (exit 96).
_TRUST = (
    "u=[(p,s) for p in (w,os.path.join(w,'bin'),os.path.join(w,'bin','host-'+sys.argv[2])) "
    "if os.path.exists(p) for s in [os.stat(p)] if s.st_uid!=os.getuid() or s.st_mode&18];"
    "u and (sys.stderr.write('" + UNSAFE_WORKDIR + " %s %d %o\\n'%(u[0][0],u[0][1].st_uid,u[0][1].st_mode&4095))"
    ",sys.exit(96));"
)
# One line each (csh and fish also run them): find the program under the workdir and run it, or exit
# 97 so the controller installs it. The installer checks the zip's SHA-256, then unpacks it into a
# folder of its own (renamed into place), so the host's Python caches its bytecode from the second run on.
BOOTSTRAP = (
    "import os,sys;w=os.path.expanduser(sys.argv[1]);" + _TRUST +
    "a=os.path.join(w,'bin','host-'+sys.argv[2]);"
    "os.path.isfile(os.path.join(a,'__main__.py')) or sys.exit(97);"
    "sys.argv=[a,sys.argv[1]]+sys.argv[3:];sys.path.insert(0,a);"
    # what runpy.run_path(a) would do, without runpy's own imports on every command
    "from clusterrun_host.main import run;run(sys.argv)"
)
INSTALLER = (
    "import os,sys,io,shutil,hashlib,zipfile;os.umask(0o077);w=os.path.expanduser(sys.argv[1]);" + _TRUST +
    "d=os.path.join(w,'bin');os.makedirs(d,0o700,exist_ok=True);b=sys.stdin.buffer.read();"
    "hashlib.sha256(b).hexdigest()==sys.argv[3] or sys.exit(98);"
    "t=os.path.join(d,'.host-%d.tmp'%os.getpid());zipfile.ZipFile(io.BytesIO(b)).extractall(t);"
    "f=os.path.join(d,'host-'+sys.argv[2]);"
    # another controller may have installed the same version a moment ago: keep its copy
    "exec('try:\\n os.replace(t,f)\\nexcept OSError:\\n shutil.rmtree(t)')"
)
