"""The host-side program (supervisor.py), as the controller ships it: source, content id, bootstrap."""

from __future__ import annotations

import hashlib
import os

_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "supervisor.py")
with open(_PATH, "rb") as _fh:
    SOURCE: bytes = _fh.read()

# Hosts keep every version they were sent under its content id, so controllers of different versions
# can work on the same host side by side.
AGENT_ID = hashlib.sha256(SOURCE).hexdigest()[:16]
EXIT_AGENT_MISSING = 97

# One line each (csh and fish also run them): find the agent under the workdir and run it in-process,
# or exit 97 so the controller installs it; the installer checks the content id before renaming.
BOOTSTRAP = (
    "import os,sys;w=os.path.expanduser(sys.argv[1]);"
    "a=os.path.join(w,'bin','agent-'+sys.argv[2]+'.py');"
    "os.path.isfile(a) or sys.exit(97);"
    "sys.argv=[a,sys.argv[1]]+sys.argv[3:];"
    "exec(compile(open(a,'rb').read(),a,'exec'),{'__name__':'__main__','__file__':a})"
)
INSTALLER = (
    "import os,sys,hashlib;os.umask(0o077);w=os.path.expanduser(sys.argv[1]);d=os.path.join(w,'bin');"
    "os.makedirs(d,0o700,exist_ok=True);b=sys.stdin.buffer.read();"
    "hashlib.sha256(b).hexdigest()[:16]==sys.argv[2] or sys.exit(98);"
    "t=os.path.join(d,'.agent-%d.tmp'%os.getpid());f=open(t,'wb');f.write(b);f.close();"
    "os.replace(t,os.path.join(d,'agent-'+sys.argv[2]+'.py'))"
)
