"""What the unit tests of the host program share: a `connection: local` host with its own workdir, a job
project turned into a push manifest, and a start spec."""

import sys

from clusterrun.config.inventory import DEFAULT_EXCLUDES, Host, Job
from clusterrun.hosts.manifest import HashCache, build_manifest
from support import write_tree


def make_host(workdir):
    return Host(name="here", host="localhost", addr="127.0.0.1", slots=1, connection="local", user=None, port=None,
                identity_file=None, known_hosts=None, host_key_policy="strict", python=sys.executable,
                workdir=str(workdir), env={}, proxy_jump=None, source="t:1:1")


def project(tmp_path, files):
    root = write_tree(tmp_path / "proj", files)
    job = Job(root=str(root), script="job.py", args=(), sync=tuple(k for k in files if k != "job.py"),
              exclude=DEFAULT_EXCLUDES, init_method="env", backend="gloo", timeout_s=60, time_limit_s=None,
              shared_dir=None)
    return build_manifest(job, HashCache(None))


def spec(run_id, ranks, grace=5.0, **extra):
    return {"run_id": run_id, "grace": grace, "fail_fast": True,
            "ranks": [{"rank": r, "argv": argv, "env": {"CLUSTERRUN_RUN_ID": run_id, "PYTHONUNBUFFERED": "1"}}
                      for r, argv in ranks],
            **extra}
