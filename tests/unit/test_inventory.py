"""Inventory loading: every error class names file:line:col and the key path; hostfiles; overrides."""

import os
import textwrap

import pytest

from clusterrun.errors import InventoryError, UsageError
from clusterrun.config.inventory import (check_job_files, inventory_from_snapshot, inventory_snapshot, load_inventory, parse_inventory,
                                  with_overrides)

FULL = """\
version: 1
defaults:
  user: alice
  port: 22
  identity_file: ~/.ssh/id_ed25519
  known_hosts: ~/.ssh/known_hosts
  host_key_policy: strict
  python: python3
  workdir: ~/.clusterrun
  connection: ssh
  env: {OMP_NUM_THREADS: "1"}
hosts:
  - name: node0
    host: 10.0.0.10
    addr: 192.168.1.10
    slots: 2
  - name: node1
    host: 10.0.0.11
    port: 2222
    env: {NCCL_DEBUG: INFO}
master: {port: 29500}
job:
  script: train_job/train.py
  args: ["--epochs", 2]
  sync: [train_job/, data/]
  init_method: env
  backend: gloo
  timeout: 30m
  time_limit: 2h
secrets: [WANDB_API_KEY]
"""


def parse(text, file="/proj/inv.yaml"):
    return parse_inventory(textwrap.dedent(text), file, local_python="/venv/bin/python")


def problems(text):
    with pytest.raises(InventoryError) as info:
        parse(text)
    return [str(p) for p in info.value.problems]


def test_full_example_is_read_with_defaults_and_overrides():
    inv = parse(FULL)
    n0, n1 = inv.hosts
    assert (n0.name, n0.host, n0.addr, n0.slots, n0.user, n0.port) == ("node0", "10.0.0.10", "192.168.1.10", 2, "alice", 22)
    assert (n1.port, n1.slots, n1.master_addr) == (2222, 1, "10.0.0.11")
    assert n1.env == {"OMP_NUM_THREADS": "1", "NCCL_DEBUG": "INFO"}
    assert inv.master_port == 29500
    assert inv.job.script == "train_job/train.py"
    assert inv.job.args == ("--epochs", "2")  # a number in args is taken as its literal text
    assert inv.job.sync == ("train_job/", "data/")
    assert (inv.job.timeout_s, inv.job.time_limit_s) == (1800.0, 7200.0)
    assert inv.job.root == "/proj"
    assert inv.secrets == ("WANDB_API_KEY",)


def test_local_hosts_default_to_this_machine_and_the_controllers_python():
    inv = parse("""
        version: 1
        hosts: [{connection: local, slots: 2}]
        job: {script: job.py}
    """)
    (h,) = inv.hosts
    assert (h.host, h.addr, h.python, h.name) == ("localhost", "127.0.0.1", "/venv/bin/python", "localhost")


@pytest.mark.parametrize("text, expected", [
    ("version: 1\nhosts:\n  - host: a\n    prot: 22\n", "/proj/inv.yaml:4:5: hosts[0].prot: unknown key 'prot'; did you mean 'port'?"),
    ("version: 1\nhosts:\n  - host: a\n    port: 70000\n", "/proj/inv.yaml:4:11: hosts[0].port: must be an integer from 1 to 65535, got 70000"),
    ("version: 1\nhosts:\n  - host: a\n    port: '22'\n", "/proj/inv.yaml:4:11: hosts[0].port: expected an integer, got a string"),
    ("version: 1\nhosts:\n  - host: a\n    slots: 0\n", "hosts[0].slots: must be an integer from 1 to 4096, got 0"),
    ("version: 1\nhosts:\n  - host: a\n    slots: -2\n", "hosts[0].slots: must be an integer from 1 to 4096, got -2"),
    ("version: 1\nhosts:\n  - host: a\n    user: yes\n", "/proj/inv.yaml:4:11: hosts[0].user: expected a string, got the YAML boolean 'yes'"),
    ("version: 1\nhosts:\n  - host: a\n  - host: b\n    host: c\n", "/proj/inv.yaml:5:5: hosts[1].host: duplicate key (first given on line 4)"),
    ("version: 2\nhosts: [{host: a}]\n", "version: this clusterrun reads inventory version 1, not 2"),
    ("hosts: [{host: a}]\n", "/proj/inv.yaml:1:1: (document): missing required key 'version'"),
    ("version: 1\nhosts: []\n", "hosts: expected a non-empty list of hosts"),
    ("version: 1\nhosts: [{host: a}]\njob: {init_method: mpi}\n", "job.init_method: must be one of env, tcp, file; got 'mpi'"),
    ("version: 1\nhosts: [{host: a}]\njob: {init_method: file}\n", "init_method: file needs job.shared_dir"),
    ("version: 1\nhosts: [{host: a}]\njob: {timeout: soon}\n", "job.timeout: expected a positive duration"),
    ("version: 1\nhosts: [{host: a}]\nmaster: {port: 0}\n", "master.port: must be an integer from 1 to 65535"),
    ("version: 1\nhosts: [{host: a, env: {1BAD: x}}]\n", "hosts[0].env.1BAD: '1BAD' is not a valid environment variable name"),
    ("version: 1\nhosts: [{host: 'a;rm -rf /'}]\n", "hosts[0].host: 'a;rm -rf /' is not a valid host name"),
    ("version: 1\nhosts: [{host: a, user: '$(id)'}]\n", "hosts[0].user: '$(id)' is not a valid user name"),
    ("version: 1\nhosts: [{host: a, name: 'my node'}]\n", "hosts[0].name: 'my node' is not a valid host label"),
    ("version: 1\nhosts: [{host: a}]\njob: {script: ../outside.py}\n", "job.script: '../outside.py' is outside the job root /proj"),
    ("version: 1\nhosts: [{host: a}]\njob: {sync: [/etc]}\n", "job.sync[0]: '/etc' is outside the job root /proj"),
    ("version: 1\nhosts: [{host: a}]\nsecrets: [A-B]\n", "secrets[0]: 'A-B' is not a valid environment variable name"),
    ("version: 1\nhosts: [{host: a}, {host: a}]\n", "hosts[1]: 'a' is listed twice with the same workdir"),
    ("version: 1\nhosts: [{host: a, name: x}, {host: b, name: x}]\n", "hosts[1]: duplicate host name 'x'"),
    ("version: 1\nhosts: [{host: a, env: {K: v}}]\nsecrets: [K]\n", "K is both a secret and an env value"),
    ("version: 1\nhosts:\n\t- host: a\n", "/proj/inv.yaml:3:1: YAML syntax error"),
    ("version: 1\nhosts: [{host: a}\n", "YAML syntax error"),
    ("version: 1\nhosts: [{host: a}]\nextra: 1\n", "/proj/inv.yaml:3:1: extra: unknown key 'extra'"),
    ("version: 1\nhosts: [{port: 22}]\n", "hosts[0]: missing required key 'host'"),
    ("version: 1\nhosts: [{host: a, host_key_policy: yolo}]\n", "hosts[0].host_key_policy: must be one of strict, accept-new"),
])
def test_errors_name_file_line_col_and_key(text, expected):
    found = problems(text)
    assert any(expected in p for p in found), found


def test_tab_indentation_gets_a_hint():
    found = problems("version: 1\nhosts:\n\t- host: a\n")
    assert "tabs are not allowed" in found[0]


def test_all_problems_are_reported_at_once():
    found = problems("version: 1\nhosts:\n  - {host: a, port: x, slots: 0, colour: red}\n")
    assert len(found) == 3, found


def test_master_port_auto():
    inv = parse("version: 1\nhosts: [{host: a}]\nmaster: {port: auto}\n")
    assert inv.master_port is None


def test_durations():
    inv = parse("version: 1\nhosts: [{host: a}]\njob: {timeout: 1h30m, time_limit: 90}\ntimeouts: {connect: 2s, grace: 1.5}\n")
    assert (inv.job.timeout_s, inv.job.time_limit_s) == (5400.0, 90.0)
    assert (inv.timeouts.connect, inv.timeouts.grace, inv.timeouts.command) == (2.0, 1.5, 60.0)


def test_hostfile_is_accepted_as_the_whole_inventory():
    inv = parse("# the cluster\nnode1 slots=4\nnode2   # one slot\n\nnode3 slots=2 max_slots=8\n", "/p/hostfile")
    assert [(h.host, h.slots, h.connection) for h in inv.hosts] == [("node1", 4, "ssh"), ("node2", 1, "ssh"),
                                                                     ("node3", 2, "ssh")]
    assert inv.job.script is None


def test_hostfile_errors_name_line_and_column():
    with pytest.raises(InventoryError) as info:
        parse("node1 slots=4\nnode2 gpus=2\n", "/p/hostfile")
    assert str(info.value.problems[0]) == "/p/hostfile:2:7: unexpected 'gpus=2'; expected slots=N"


def test_hosts_may_name_a_hostfile(tmp_path):
    (tmp_path / "hosts").write_text("a slots=2\nb\n")
    inv_path = tmp_path / "inv.yaml"
    inv_path.write_text("version: 1\ndefaults: {user: bob}\nhosts: hosts\njob: {script: t.py}\n")
    inv = load_inventory(str(inv_path))
    assert [(h.host, h.slots, h.user) for h in inv.hosts] == [("a", 2, "bob"), ("b", 1, "bob")]


def test_overrides_from_the_command_line(tmp_path):
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "other.py").write_text("print(1)\n")
    inv = parse("version: 1\nhosts: [{host: a}]\njob: {script: t.py, args: [--x]}\n", str(tmp_path / "inv.yaml"))
    inv = with_overrides(inv, script="jobs/other.py", args=["--epochs", "3"], cwd=str(tmp_path))
    assert inv.job.script == "jobs/other.py"
    assert inv.job.args == ("--epochs", "3")
    with pytest.raises(UsageError, match="outside the job root"):
        with_overrides(inv, script="/etc/passwd")
    # a --script that is not there is said of the current folder it was given in, not of job.root
    with pytest.raises(UsageError) as missing:
        with_overrides(inv, script="jobs/typo.py", cwd=str(tmp_path / "jobs"))
    assert str(missing.value) == (f"--script jobs/typo.py: {tmp_path}/jobs/jobs/typo.py does not exist (--script "
                                  f"is relative to the current folder, {tmp_path}/jobs)")
    assert with_overrides(inv, args=[]).job.args == ()  # a bare `--` clears job.args


def test_a_bare_double_dash_clears_job_args(tmp_path, capsys, cr_home):
    """`launch INV --` runs the job with no arguments (click drops the `--`; JobArgsCommand notes it)."""
    import json

    from clusterrun.cli import run

    (tmp_path / "t.py").write_text("")
    (tmp_path / "inv.yaml").write_text("version: 1\nhosts: [{name: a, connection: local}]\n"
                                       "job: {script: t.py, args: [--epochs, '9']}\n")
    argvs = []
    for extra in ([], ["--"]):
        assert run(["launch", "--dry-run", "--json", str(tmp_path / "inv.yaml"), *extra]) == 0
        argvs.append(json.loads(capsys.readouterr().out)["nodes"][0]["ranks"][0]["argv"])
    assert argvs[0][-2:] == ["--epochs", "9"] and "--epochs" not in argvs[1], argvs


def test_job_files_must_exist_and_not_link_out(tmp_path):
    (tmp_path / "t.py").write_text("")
    os.symlink("/etc", tmp_path / "escape")
    inv = parse("version: 1\nhosts: [{host: a}]\njob: {script: t.py, sync: [missing/, escape]}\n",
                str(tmp_path / "inv.yaml"))
    with pytest.raises(UsageError) as info:
        check_job_files(inv)
    text = str(info.value)
    assert "job.sync[0]" in text and "does not exist" in text
    assert "job.sync[1]" in text and "symlink out of it" in text


def test_snapshot_round_trip():
    inv = parse(FULL)
    assert inventory_from_snapshot(inventory_snapshot(inv)) == inv


def test_retention_defaults_off_and_values():
    base = "version: 1\nhosts: [{host: a}]\njob: {script: t.py}\n"
    r = parse_inventory(base, "/x/i.yaml").retention
    assert (r.enabled, r.keep_runs, r.max_age_s, r.cache_max) == (True, 20, 30 * 86400, 20 * 10 ** 9)
    assert not parse_inventory(base + "retention: off", "/x/i.yaml").retention.enabled
    r = parse_inventory(base + "retention: {keep_runs: 3, max_age: 7d, cache_max: 500M}", "/x/i.yaml").retention
    assert (r.keep_runs, r.max_age_s, r.cache_max) == (3, 7 * 86400, 500 * 10 ** 6)
    assert parse_inventory(base + "retention: {cache_max: off}", "/x/i.yaml").retention.cache_max is None
    with pytest.raises(InventoryError) as e:
        parse_inventory(base + "retention: {cache_max: lots, keep: 2}", "/x/i.yaml")
    assert "i.yaml:4:24: retention.cache_max" in str(e.value) and "retention.keep" in str(e.value)


AROUND = """\
version: 1
hosts: [{name: node0, host: 10.0.0.10}]
job:
  script: train.py
  outputs: [outputs/, "*.pt", checkpoints/last.pt]
  ports: [6006, 8888]
notify:
  - curl -fsS -d "run $CLUSTERRUN_RUN_ID $CLUSTERRUN_STATE" https://ntfy.sh/my-runs
timeouts: {notify: 30s}
"""


def test_outputs_ports_and_notify_are_read_and_survive_the_snapshot():
    inv = parse_inventory(AROUND, "inv.yaml")
    assert inv.job.outputs == ("outputs/", "*.pt", "checkpoints/last.pt")
    assert inv.job.ports == (6006, 8888)
    assert inv.notify == ('curl -fsS -d "run $CLUSTERRUN_RUN_ID $CLUSTERRUN_STATE" https://ntfy.sh/my-runs',)
    assert inv.timeouts.notify == 30.0
    assert inventory_from_snapshot(inventory_snapshot(inv)) == inv


@pytest.mark.parametrize("fragment, where, message", [
    ("job: {script: t.py, outputs: [../secrets]}", "4:31: job.outputs[0]", "leads out of the run's folder"),
    ("job: {script: t.py, outputs: [/etc/passwd]}", "4:31: job.outputs[0]", "is absolute"),
    ("job: {script: t.py, outputs: outputs/}", "4:30: job.outputs", "expected a list"),
    ("job: {script: t.py, outputs: [\"\"]}", "4:31: job.outputs[0]", "must not be empty"),
    ("job: {script: t.py, ports: [6006, 6006]}", "4:35: job.ports[1]", "listed twice"),
    ("job: {script: t.py, ports: [70000]}", "4:29: job.ports[0]", "from 1 to 65535"),
    ("job: {script: t.py, ports: 6006}", "4:28: job.ports", "expected a list of ports"),
    ("job: {script: t.py}\nnotify: curl x", "5:9: notify", "expected a list"),
    ("job: {script: t.py}\nnotify: [yes]", "5:10: notify[0]", "YAML boolean"),
])
def test_bad_outputs_ports_and_notify_name_their_place(fragment, where, message):
    text = "version: 1\nhosts: [{name: a, host: h}]\n# the job\n" + fragment + "\n"
    with pytest.raises(InventoryError) as exc:
        parse_inventory(text, "inv.yaml")
    assert f"inv.yaml:{where}: " in str(exc.value) and message in str(exc.value), str(exc.value)


@pytest.mark.parametrize("text, expected", [
    ("version: 1\njob:\n    script: t.py\n  args: [x]\nhosts: [{host: a}]\n",
     "inv.yaml:4:3: YAML syntax error: the indentation is off: this line does not line up with the keys"),
    ("version: 1\nhosts:\n  - host: a\n   - host: b\n", "inv.yaml:4:4: YAML syntax error: the indentation is off"),
    ("version: 1\nhosts: [{host: a}]\njob:\n  script: t.py\n    args: [x]\n",
     "inv.yaml:5:9: YAML syntax error: a `key: value` where none can start: the line is indented more than the key"),
    ("version: 1\nhosts: [{host: a}]\njob:\n  script: a: b\n", "or a value holds ': ' (quote it: 'a: b')"),
    ("version: 1\nhosts: [{host: a}]\njob\n  script: t.py\n", "a ':' is missing after a key"),
    ("version: 1\nhosts: [{host: a}\n", "a [ ... ] list that began on line 2 is not closed"),
    # an unclosed { in an inline host line: its message holds literal braces (a crash once: KeyError ' ')
    ("version: 1\nhosts:\n  - {name: a, host: x, slots: 2\n  - name: b\n    host: y\n",
     "inv.yaml:4:9: YAML syntax error: a { ... } mapping that began on line 3 is not closed"),
    # PyYAML notices a dedented line only at the next one: both are named
    ("version: 1\njob:\n  script: t.py\nargs: [a]\n  backend: gloo\nhosts: [{host: a}]\n",
     "inv.yaml:5:3: YAML syntax error: the indentation is off"),
    ("version: 1\njob:\n  script: t.py\nargs: [a]\n  backend: gloo\nhosts: [{host: a}]\n",
     "; or line 4 before it is indented less than its neighbours: 'args: [a]'"),
    ("version: 1\nhosts:\n  - host: x\n    env:\n    A: 1\n      B: 2\n",
     "; or line 5 before it is indented less than its neighbours: '    A: 1'"),
])
def test_yaml_mistakes_are_said_in_plain_words_with_the_line(text, expected):
    found = problems(text)
    assert any(expected in p for p in found), found
    assert not any("<block" in p or "expected <" in p for p in found), found  # no raw PyYAML parser talk


@pytest.mark.parametrize("text, expected", [
    ("version: 1\nhosts: [{host: a}]\nshared_dir: /shared\n",
     "shared_dir: unknown key 'shared_dir' here; did you mean job.shared_dir? (it goes under job:)"),
    ("version: 1\nuser: cr\nhosts: [{host: a}]\n", "did you mean defaults.user? (it goes under defaults:)"),
    ("version: 1\nhosts: [{host: a, grace: 3s}]\n", "hosts[0].grace: unknown key 'grace' here; did you mean "
                                                    "timeouts.grace?"),
    ("version: 1\nhosts: [{host: a}]\njob: {script: t.py, secrets: [A]}\n",
     "did you mean secrets? (a top-level key, not one under job:)"),
    ("version: 1\nhosts: [{host: a, slot: 2}]\n", "hosts[0].slot: unknown key 'slot'; did you mean 'slots'?"),
])
def test_a_key_in_the_wrong_place_says_where_it_belongs(text, expected):
    found = problems(text)
    assert any(expected in p for p in found), found


def test_a_missing_job_file_names_job_root_and_where_the_file_is(tmp_path, monkeypatch):
    elsewhere = tmp_path / "mine"
    elsewhere.mkdir()
    (elsewhere / "my_train.py").write_text("print(1)\n")
    inv_path = elsewhere / "inv.yaml"  # a copy of a generated inventory, its absolute job.root kept
    inv_path.write_text(f"version: 1\nhosts: [{{host: a}}]\njob: {{root: {tmp_path / 'repo'}, script: my_train.py}}\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError) as info:
        check_job_files(load_inventory(str(inv_path)))
    text = str(info.value)
    assert f"job.script: {tmp_path / 'repo' / 'my_train.py'} does not exist (job paths are relative to job.root, " \
           f"{tmp_path / 'repo'})" in text
    assert f"it is in {elsewhere}: leave job.root out" in text


def test_gpus_and_claims_per_host_with_their_defaults():
    inv = parse("""\
        version: 1
        defaults: {claims: {slots: 4}}
        hosts:
          - {name: a, host: a, slots: 2, gpus: [0, 1]}
          - {name: b, host: b, slots: 2, gpus: auto, claims: {dir: /var/tmp/claims}}
          - {name: c, host: c, slots: 1, claims: off}
          - {name: d, host: d, slots: 2, env: {CUDA_VISIBLE_DEVICES: "2,3"}}
          - {name: e, host: e, connection: local}
        job: {script: t.py, backend: nccl}
        """)
    a, b, c, d, e = inv.hosts
    assert (a.gpus, a.claims_dir, a.claim_slots) == ((0, 1), "/tmp/clusterrun-claims", 4)
    assert (b.gpus, b.claims_dir, b.claim_slots) == ("auto", "/var/tmp/claims", None)
    assert (c.gpus, c.claims_dir) == ("auto", None)  # nccl: every GPU the host reports; claims off
    assert d.gpus == (2, 3)  # the env's CUDA_VISIBLE_DEVICES names them
    assert e.claims_dir == "/tmp/clusterrun-claims"  # defaults: said so for every host
    gloo = parse("version: 1\nhosts: [{host: a}, {name: here, connection: local}]\njob: {script: t.py}\n")
    assert gloo.hosts[0].gpus is None and gloo.hosts[0].claims_dir == "/tmp/clusterrun-claims"
    assert gloo.hosts[1].claims_dir is None  # this machine: claims only when the inventory says where
    assert inventory_from_snapshot(inventory_snapshot(inv)) == inv


@pytest.mark.parametrize("host, expected", [
    ("{host: a, gpus: [0, 0]}", "hosts[0].gpus: expected distinct GPU indices"),
    ("{host: a, gpus: yes}", "hosts[0].gpus: expected auto, none or a list"),
    ("{host: a, gpus: [-1]}", "hosts[0].gpus[0]: must be an integer from 0"),
    ("{host: a, slots: 2, gpus: [0]}", "hosts[0].gpus: lists 1 GPU for slots: 2"),
    ("{host: a, gpus: [0], env: {CUDA_VISIBLE_DEVICES: '0'}}", "hosts[0].gpus: both gpus: and env"),
    ("{host: a, claims: {slots: 0}}", "hosts[0].claims.slots: must be an integer from 1"),
    ("{host: a, claims: {where: /x}}", "hosts[0].claims.where: unknown key"),
])
def test_gpus_and_claims_mistakes_name_the_key(host, expected):
    found = problems(f"version: 1\nhosts: [{host}]\njob: {{script: t.py, backend: nccl}}\n")
    assert any(expected in p for p in found), found


def test_inventories_compose_with_libyaml_and_errors_read_as_pyyamls(tmp_path, monkeypatch):
    """libyaml composes (~13x faster: 12 ms of a 32-host launch's start) with the same nodes, tags and
    marks as PyYAML's own parser, so every file:line:col is the same; a document it refuses is composed
    again by the pure parser, whose message is the one reported."""
    import glob

    import yaml

    from clusterrun.config import yaml_nodes

    def shape(node):
        kids = [] if isinstance(node.value, str) else [k for pair in node.value for k in
                                                       (pair if isinstance(pair, tuple) else (pair,))]
        return [(node.tag, node.start_mark.line, node.start_mark.column, node.end_mark.line,
                 node.value if isinstance(node.value, str) else None)] + [s for k in kids for s in shape(k)]

    root = os.path.join(os.path.dirname(__file__), "..", "..")
    for path in glob.glob(os.path.join(root, "inventories", "*.yaml")):
        text = open(path).read()
        assert shape(yaml_nodes.compose(text, path)) == shape(yaml.compose(text, Loader=yaml.SafeLoader)), path
    bad = "version: 1\nhosts:\n  - {name: a, host: b\njob: {script: t.py}\n"
    with pytest.raises(InventoryError) as fast:
        yaml_nodes.compose(bad, "inv.yaml")
    monkeypatch.delattr(yaml, "CSafeLoader")  # as with a PyYAML built without libyaml: the pure parser alone
    with pytest.raises(InventoryError) as pure:
        yaml_nodes.compose(bad, "inv.yaml")
    monkeypatch.undo()
    assert str(fast.value) == str(pure.value) and "inv.yaml:4:4: YAML syntax error" in str(fast.value)
    real, used = yaml.compose, []
    monkeypatch.setattr(yaml, "compose", lambda text, Loader: used.append(Loader) or real(text, Loader=Loader))
    yaml_nodes.compose("version: 1\n", "inv.yaml")
    assert used == [yaml.CSafeLoader]
    assert yaml.__with_libyaml__  # here, PyYAML's wheel has it: the fast path is the one tested above
