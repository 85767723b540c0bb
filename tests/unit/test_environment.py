"""job.environment: the inventory keys (file:line:col), the pure key and fingerprint rules, and, on this
machine with two `connection: local` hosts (the real CLI, the real host program, pip from hand-written
wheels with no index), the venv built once per host, used as it is on a relaunch (no installer), a new
one for changed requirements, a failed build that leaves nothing, and the stacks compared."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from clusterrun.config.environment import Environment, environment_key, index_settings, mismatches
from clusterrun.errors import InventoryError, StackMismatch
from clusterrun.launch.environment import check_stacks, fingerprint_table
from clusterrun.remote.host.env import fingerprint
from support import inventory_text, write_tree, write_wheel
from test_inventory import parse

CLI = [sys.executable, "-m", "clusterrun"]
JOB = textwrap.dedent("""\
    import argparse, sys, time, tinypkg
    p = argparse.ArgumentParser(); p.add_argument("--rank"); p.add_argument("--world-size")
    p.add_argument("--sleep", type=float, default=0); a = p.parse_args()
    print("rank", a.rank, "python", sys.executable, "tinypkg", tinypkg.__version__, tinypkg.dep(), flush=True)
    time.sleep(a.sleep)
""")
REQUIREMENTS = "--no-index\n--find-links wheels\ntinypkg==0.3\n"


# ------------------------------------------------------------------ the inventory's keys


def env_inv(body):
    return parse("version: 1\nhosts: [{host: a}]\njob:\n  script: t.py\n  environment:\n" + body)


def test_environment_keys_are_read_with_their_defaults():
    env = env_inv("    requirements: reqs/requirements.txt\n").job.environment
    assert env == Environment(requirements="reqs/requirements.txt", python=None, wheels="index", allow_mismatch=())
    env = env_inv("    requirements: requirements.txt\n    python: 3.11\n    wheels: controller\n"
                  "    allow_mismatch: [driver, cudnn]\n").job.environment
    assert (env.python, env.wheels, env.allow_mismatch) == ("3.11", "controller", ("driver", "cudnn"))


@pytest.mark.parametrize("body, expected", [
    ("    python: '3.11'\n", "/proj/inv.yaml:6:5: job.environment: missing required key 'requirements'"),
    ("    requirements: ../up.txt\n", "/proj/inv.yaml:6:19: job.environment.requirements: '../up.txt' is outside"),
    ("    requirements: pyproject.toml\n", "job.environment.requirements: 'pyproject.toml': give a pinned "
                                          "requirements file (.txt)"),
    ("    requirements: r.txt\n    wheels: laptop\n", "/proj/inv.yaml:7:13: job.environment.wheels: must be one "
                                                      "of index, controller, auto; got 'laptop'"),
    ("    requirements: r.txt\n    python: '3.1x'\n", "job.environment.python: '3.1x': give a version as 3.X"),
    ("    requirements: r.txt\n    allow_mismatch: [drivers]\n", "job.environment.allow_mismatch[0]: 'drivers' "
                                                                 "is not a fingerprint field (python, torch, cuda, "
                                                                 "nccl, cudnn, driver); did you mean 'driver'?"),
    ("    requirements: r.txt\n    wheel: index\n", "job.environment.wheel"),
])
def test_environment_problems_name_file_line_col_and_key(body, expected):
    with pytest.raises(InventoryError) as err:
        env_inv(body)
    assert expected in str(err.value)


def test_the_key_changes_with_the_file_the_interpreter_and_the_index_but_nothing_else():
    base = {"version": "3.11.2", "implementation": "cp", "tag": "cp311-linux_x86_64-glibc2.36", "executable": "/a"}
    index = index_settings(REQUIREMENTS, "index")
    key = environment_key(REQUIREMENTS.encode(), base, index)
    assert len(key) == 16 and key == environment_key(REQUIREMENTS.encode(), dict(base, executable="/b"), index)
    assert key != environment_key(REQUIREMENTS.encode() + b"tinydep==1.0\n", base, index)
    assert key != environment_key(REQUIREMENTS.encode(), dict(base, version="3.11.9"), index)
    assert key != environment_key(REQUIREMENTS.encode(), dict(base, tag="cp311-linux_aarch64-glibc2.36"), index)
    assert key != environment_key(REQUIREMENTS.encode(), base, index_settings(REQUIREMENTS, "controller"))


def test_index_settings_are_read_from_the_requirements_file():
    text = ("-i https://mirror/simple\n--extra-index-url=https://extra/simple  # ours\n-f ./wheels\n"
            "--find-links /srv/w\n--no-index\ntorch==2.14.1 --hash=sha256:00\n")
    assert index_settings(text, "auto") == {"wheels": "auto", "index_url": "https://mirror/simple",
                                            "extra_index_urls": ["https://extra/simple"],
                                            "find_links": ["./wheels", "/srv/w"], "no_index": True}


def test_controller_wheels_are_asked_for_the_hosts_platform_and_auto_follows_the_hosts_reach():
    from clusterrun.launch.wheels import download_argv, index_address, platform_tags, uses_controller

    base = {"version": "3.11.2", "implementation": "cp", "platform": "linux_x86_64", "libc": "glibc2.36"}
    tags = platform_tags(base)
    assert tags[:2] == ["manylinux_2_36_x86_64", "manylinux_2_35_x86_64"] and tags[-4:] == [
        "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64", "linux_x86_64"]
    argv = download_argv("/py", base, "/job/requirements.txt", "/dest")
    assert argv[:4] == ["/py", "-m", "pip", "download"] and "--only-binary=:all:" in argv
    assert argv[argv.index("--python-version") + 1] == "311" and argv.count("--platform") == len(tags)
    assert index_address("tinypkg==1\n") == ("pypi.org", 443)
    assert index_address("--index-url http://mirror.lab:8080/simple\n") == ("mirror.lab", 8080)
    reach = {"a": {"index_reachable": True}, "b": {"index_reachable": False}}
    assert uses_controller("auto", reach) and not uses_controller("auto", {"a": reach["a"]})
    assert uses_controller("controller", {"a": reach["a"]}) and not uses_controller("index", reach)


# ------------------------------------------------------------------ the fingerprint's rules

STACK = {"python": "3.11.2", "torch": "2.14.1+cu124", "cuda": "12.4", "nccl": "2.21.5", "cudnn": "90100",
         "driver": "550.54.15"}


def test_one_odd_host_is_named_against_the_others():
    prints = {"a1": STACK, "a2": STACK, "a3": dict(STACK, torch="2.13.0+cpu", cuda=None)}
    found = mismatches(prints)
    assert [m.field for m in found] == ["torch", "cuda"]
    assert found[0].text() == "a3: torch 2.13.0+cpu, the others 2.14.1+cu124"
    assert found[1].text() == "a3: cuda none, the others 12.4"
    assert mismatches(prints, allowed=("torch", "cuda")) == []


def test_a_mismatch_refuses_with_a_table_and_the_fix_and_allow_mismatch_accepts_it():
    prints = {"a1": STACK, "a2": dict(STACK, driver="535.104.05")}
    with pytest.raises(StackMismatch) as err:
        check_stacks(prints)
    text = str(err.value)
    assert err.value.exit_code == 2
    assert "a1: driver 550.54.15; a2: driver 535.104.05" in text
    assert "driver*" in text and "allow_mismatch: [driver]" in text
    check_stacks(prints, allowed=("driver",))  # accepted: no error
    check_stacks({"a1": dict(STACK, driver=None), "a2": dict(STACK, driver=None)})  # no GPU anywhere: the same


def test_the_table_has_a_row_per_host_and_a_dash_for_what_a_host_lacks():
    lines = fingerprint_table({"a1": STACK, "a2": dict(STACK, torch=None)}, ["torch"]).splitlines()
    assert lines[0].split() == ["host", "python", "torch*", "cuda", "nccl", "cudnn", "driver"]
    assert lines[2].split()[:3] == ["a2", "3.11.2", "-"]


def test_the_fingerprint_reads_torch_without_importing_it_and_is_cached(tmp_path):
    site = tmp_path / "site"
    write_tree(site, {"torch/__init__.py": "raise SystemExit('imported!')\n",
                      "torch/version.py": "__version__ = '2.14.1+cu124'\ncuda: Optional[str] = '12.4'\n"})
    probe = fingerprint.PROBE + "\nimport json\nprint(json.dumps(found))\n"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(site)))
    found = json.loads(done.stdout)
    assert (found["torch"], found["cuda"]) == ("2.14.1+cu124", "12.4")
    env_dir = tmp_path / "env"
    env_dir.mkdir()
    first = fingerprint.of_env(str(env_dir), sys.executable)
    second = fingerprint.of_env(str(env_dir), sys.executable)
    assert (first["cached"], second["cached"]) == (False, True)
    assert first["python"] == second["python"] == "%d.%d.%d" % sys.version_info[:3]


def test_the_driver_comes_from_the_kernel_module_else_nvidia_smi(tmp_path):
    proc = tmp_path / "version"
    proc.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n")
    assert fingerprint.driver(str(proc)) == "550.54.15"
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 535.104.05\necho 535.104.05\n")
    smi.chmod(0o755)
    assert fingerprint.driver(str(tmp_path / "absent"), smi=str(smi)) == "535.104.05"
    smi.write_text("#!/bin/sh\necho '[N/A]'\n")  # a value nvidia-smi could not read is no version
    assert fingerprint.driver(str(tmp_path / "absent"), smi=str(smi)) is None


# ------------------------------------------------------------------ on this machine: two local hosts


@pytest.fixture
def project(tmp_path, cr_home, monkeypatch):
    monkeypatch.setenv("CLUSTERRUN_NO_RETENTION", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", "")  # this machine's pip config: only the job's wheels count
    write_wheel(tmp_path / "wheels", "tinydep", "1.0", "def dep():\n    return 'dep 1.0'\n")
    write_wheel(tmp_path / "wheels", "tinypkg", "0.3", "from tinydep import dep\n", requires=("tinydep==1.0",))
    return write_tree(tmp_path, {"job.py": JOB, "requirements.txt": REQUIREMENTS})


def inventory(project, args=(), **environment):
    job = {"script": "job.py", "timeout": "60s", "sync": ["wheels/"], "args": list(args),
           "environment": {"requirements": "requirements.txt", "python": sys.executable, **environment}}
    write_tree(project, {"inv.yaml": inventory_text(
        [{"name": "here0", "workdir": f"{project}/w0"}, {"name": "here1", "workdir": f"{project}/w1"}], job,
        defaults={"connection": "local"}, master={"port": "auto"}, timeouts={"grace": "3s"})})
    return project / "inv.yaml"


def cli(*args, timeout=180):
    return subprocess.run(CLI + [str(a) for a in args], capture_output=True, text=True, timeout=timeout)


def envs(project, host=0):
    folder = project / f"w{host}" / "envs"
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def last_hosts():
    return json.loads(cli("ps", "--json", "--no-reconcile").stdout)[0]["hosts"]


def test_the_env_is_built_once_per_host_used_as_it_is_on_a_relaunch_and_cleaned_only_when_unused(project):
    inv = inventory(project)
    first = cli("launch", inv)
    assert first.returncode == 0, first.stderr
    key = [n for n in envs(project) if not n.endswith(".lock")]
    assert len(key) == 1 and key == [n for n in envs(project, 1) if not n.endswith(".lock")]
    venv_python = f"{project}/w0/envs/{key[0]}/bin/python"
    assert f"rank 0 python {venv_python} tinypkg 0.3 dep 1.0" in first.stdout  # the ranks ran in the venv
    assert f"environment {key[0][:8]}…: built on here0, here1" in first.stderr
    assert "(pip)" in first.stderr  # which installer built it
    assert "[here0 env] Successfully installed tinydep-1.0 tinypkg-0.3" in first.stdout  # the build's progress
    stack = last_hosts()[0]["stack"]
    assert stack["environment"] == {"key": key[0], "python": venv_python, "built": True, "installer": "pip"}
    assert stack["fingerprint"]["python"] == "%d.%d.%d" % sys.version_info[:3]

    second = cli("launch", inv)
    assert second.returncode == 0, second.stderr
    assert f"environment {key[0][:8]}…: here0, here1 had it" in second.stderr
    assert "[here0 env]" not in second.stdout and "[here1 env]" not in second.stdout
    run = json.loads(cli("ps", "--json", "--no-reconcile").stdout)[0]["id"]
    # no installer ran: the build step writes the run's environment.log only when it builds
    assert not (project / "w0" / "runs" / run / "environment.log").exists()
    assert all(h["stack"]["environment"]["built"] is False for h in last_hosts())
    assert f"rank 1 python {project}/w1/envs/{key[0]}/bin/python" in second.stdout

    (project / "requirements.txt").write_text(REQUIREMENTS + "tinydep==1.0\n")
    third = cli("launch", inv)
    assert third.returncode == 0, third.stderr
    assert len([n for n in envs(project) if not n.endswith(".lock")]) == 2  # a changed file: a new env
    check_clean(project, inv, old=key[0])


def check_clean(project, inv, old):
    """clean collects unused envs and dead builds, never one a live run uses (the two envs built above: old
    and the current requirements' one; built once for both tests, a venv build per host being the cost)."""
    current = [n for n in envs(project) if not n.endswith(".lock") and n != old][0]
    dead = project / "w0" / "envs" / ".build-0123456789abcdef-4242"
    dead.mkdir()
    disk = json.loads(cli("ps", "--disk", "--json", "--no-reconcile").stdout)
    assert disk  # ps --disk asks the hosts' listing, which counts the venvs (usage.envs)
    kept = cli("clean", inv, "--older-than", "1h", "--json")
    assert kept.returncode == 0, kept.stderr
    assert [h["envs"]["removed"] for h in json.loads(kept.stdout)["hosts"]] == [[], []]  # used a moment ago
    assert [h["usage"]["envs_count"] for h in json.loads(kept.stdout)["hosts"]] == [2, 2]
    assert not dead.exists()  # a build nobody holds the lock of: gone

    live = cli("launch", inventory(project, args=["--sleep", "30"]), "--detach")
    assert live.returncode == 0, live.stderr
    busy = cli("clean", inv, "--cache", "--json")
    assert busy.returncode == 0, busy.stderr
    busy_hosts = json.loads(busy.stdout)["hosts"]
    assert busy_hosts[0]["envs"]["in_use"] == [current]  # a live run's: stays
    assert [[e["key"] for e in h["envs"]["removed"]] for h in busy_hosts] == [[old], [old]]  # unused: goes
    assert current in envs(project) and old not in envs(project)
    assert cli("stop", "latest").returncode == 0
    done = cli("clean", inv, "--cache", "--json")
    assert done.returncode == 0, done.stderr
    gone = json.loads(done.stdout)["hosts"]
    assert [[e["key"] for e in h["envs"]["removed"]] for h in gone] == [[current], [current]]
    assert gone[0]["envs"]["bytes"] > 1_000_000  # a venv with pip in it
    assert [n for n in envs(project) if not n.endswith(".lock")] == []


def test_a_requirement_that_does_not_resolve_fails_with_the_installers_words_and_leaves_nothing(project):
    (project / "requirements.txt").write_text(REQUIREMENTS.replace("0.3", "9.9"))
    done = cli("launch", inventory(project))
    assert done.returncode == 1, done.stderr
    assert ("here0: environment build failed: installing the requirements: python exited 1; "
            "requirements.txt:3: tinypkg==9.9") in done.stderr  # the host, and the line of the file
    assert "here1: environment build failed" in done.stderr
    assert "| ERROR: No matching distribution found for tinypkg==9.9" in done.stderr  # the installer's own words
    assert [n for n in envs(project) if not n.endswith(".lock")] == []  # no env, no build folder
    assert os.listdir(project / "w0" / "runs") == []  # nothing half-done stays on the host


def test_a_base_interpreter_that_a_host_lacks_is_named_before_anything_is_built(project):
    done = cli("launch", inventory(project, python="3.99"))
    assert done.returncode == 1, done.stderr
    assert "here0: preflight failed: job.environment's base interpreter: python3.99: no such interpreter" \
        in done.stderr
    assert "here1: preflight failed" in done.stderr
    assert envs(project) == envs(project, 1) == []


BUILD_ONE = textwrap.dedent("""\
    import json, sys
    from clusterrun.remote.host.env.build import run_environment
    workdir, run_dir, request = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    answer, ready = run_environment(workdir, run_dir, request, sys.stdin)
    sys.stderr.write(json.dumps(answer) + "\\n")
""")


def frames(data):
    out = []
    while data:
        n = int.from_bytes(data[:4], "big")
        out.append(json.loads(data[4:4 + n]))
        data = data[4 + n:]
    return out


def test_two_builds_of_one_key_at_once_build_once_and_the_other_waits(project, tmp_path):
    """The host's build step itself (env/build.py), twice at once on one workdir: one builds under the
    key's lock, the other says it waits, then uses the venv as it is."""
    workdir = tmp_path / "w"
    request = {"key": "0123456789abcdef", "base": sys.executable, "requirements": "requirements.txt",
               "timeout": 300, "installer": "pip", "find_links": [str(project / "wheels")], "no_index": True}
    procs = []
    held, keep = os.pipe()  # the controllers' end stays open: a closed one means the controller went away
    for i in range(2):
        run_dir = write_tree(tmp_path / f"run{i}", {"job/requirements.txt": "tinypkg==0.3\n"})
        procs.append(subprocess.Popen([sys.executable, "-c", BUILD_ONE, str(workdir), str(run_dir), json.dumps(request)],
                                      stdin=held, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    os.close(held)
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err.decode()
        results.append((frames(out), json.loads(err.decode().strip().splitlines()[-1])["environment"]))
    built = [r for _, r in results if r["built"]]
    waited = [r for _, r in results if r["waited"]]
    assert len(built) == 1 and len(waited) == 1 and not waited[0]["built"]  # built once; the other waited
    steps = [[f["env"]["step"] for f in fs if "env" in f] for fs, _ in results]
    assert any(s[:1] == ["waiting"] and "installing" not in s for s in steps)
    os.close(keep)
    assert sorted(os.listdir(workdir / "envs")) == ["0123456789abcdef", "0123456789abcdef.lock"]
    assert results[0][1]["python"] == results[1][1]["python"] == f"{workdir}/envs/0123456789abcdef/bin/python"
