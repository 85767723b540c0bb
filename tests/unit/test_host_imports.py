"""The host program's launch hot path loads only what a plain launch uses: every host pays for each module
it imports on every launch (bench hostcpu), so the heavy ones stay behind the feature that needs them."""
import os
import subprocess
import sys

HOT = ["clusterrun_host.main", "clusterrun_host.push.receive", "clusterrun_host.push.held",
       "clusterrun_host.run.start", "clusterrun_host.run.python_launcher", "clusterrun_host.observe.follow",
       "clusterrun_host.env.fingerprint", "clusterrun_host.run.supervisor", "clusterrun_host.push.facts",
       "clusterrun_host.run.peers", "clusterrun_host.run.stop", "clusterrun_host.observe.status",
       "clusterrun_host.run.oom", "clusterrun_host.run.flight", "clusterrun_host.run.rendezvous"]
# never the Python modules around json, socket, signal (their enums and regexes: ~18 ms of CPU per
# process, stdlib.py), nor re, nor those a plain launch has no use for
HEAVY = ["enum", "re", "json", "socket", "signal", "selectors", "importlib", "subprocess", "shutil", "hashlib",
         "pickle", "bz2", "lzma"]
# loaded only by the feature that uses them: a claim / relay push / job.environment / a hang timeout
KEPT_OUT = HEAVY + ["clusterrun_host.share.claims", "clusterrun_host.share.session", "clusterrun_host.push.relay",
                    "clusterrun_host.env.base", "clusterrun_host.env.build", "clusterrun_host.run.hang"]
# an SSH host claims by default (docs/sharing.md): the claim's modules are on a default launch's path too
CLAIM = ["clusterrun_host.share.session", "clusterrun_host.share.claims", "clusterrun_host.share.gpus",
         "clusterrun_host.share.folder"]


def loaded(tmp_path, modules, watched):
    """Which of `watched` a fresh `python -S` has loaded after importing `modules` of the host program."""
    host = os.path.join(os.path.dirname(__file__), "..", "..", "clusterrun", "remote", "host")
    if not (tmp_path / "clusterrun_host").exists():
        os.symlink(os.path.abspath(host), tmp_path / "clusterrun_host")
    probe = ("import sys\n"
             "for m in %r: __import__(m)\n"
             "print(' '.join(m for m in %r if m in sys.modules))\n" % (modules, watched))
    out = subprocess.run([sys.executable, "-S", "-c", probe], cwd=tmp_path, capture_output=True, text=True,
                         env={"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(tmp_path)}, check=True)
    return out.stdout.split()


def test_the_launch_hot_path_loads_none_of_the_heavy_modules(tmp_path):
    assert loaded(tmp_path, HOT, KEPT_OUT) == [], "the launch hot path loads them"


def test_a_claim_loads_none_of_the_heavy_standard_modules(tmp_path):
    assert loaded(tmp_path, HOT + CLAIM, HEAVY) == [], "a default launch's claim loads them"
