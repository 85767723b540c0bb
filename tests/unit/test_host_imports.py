"""The host program's launch hot path loads only what a plain launch uses: every host pays for each module
it imports on every launch (bench hostcpu), so the heavy ones stay behind the feature that needs them."""
import os
import subprocess
import sys

HOT = ["clusterrun_host.main", "clusterrun_host.push.receive", "clusterrun_host.push.held",
       "clusterrun_host.run.start", "clusterrun_host.run.python_launcher", "clusterrun_host.observe.follow",
       "clusterrun_host.env.fingerprint", "clusterrun_host.run.supervisor", "clusterrun_host.push.facts"]
# loaded only by the feature that uses them: setup / an installer / a GPU claim / relay push / job.environment /
# a hang timeout / a flight recorder dump
KEPT_OUT = ["subprocess", "shutil", "hashlib", "pickle", "bz2", "lzma", "clusterrun_host.share.claims",
            "clusterrun_host.share.session", "clusterrun_host.push.relay", "clusterrun_host.env.base",
            "clusterrun_host.env.build", "clusterrun_host.run.hang"]


def test_the_launch_hot_path_loads_none_of_the_heavy_modules(tmp_path):
    host = os.path.join(os.path.dirname(__file__), "..", "..", "clusterrun", "remote", "host")
    os.symlink(os.path.abspath(host), tmp_path / "clusterrun_host")
    probe = ("import sys\n"
             "for m in %r: __import__(m)\n"
             "print(' '.join(m for m in %r if m in sys.modules))\n" % (HOT, KEPT_OUT))
    out = subprocess.run([sys.executable, "-S", "-c", probe], cwd=tmp_path, capture_output=True, text=True,
                         env={"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(tmp_path)}, check=True)
    assert out.stdout.split() == [], "the launch hot path loads %s" % out.stdout.strip()
