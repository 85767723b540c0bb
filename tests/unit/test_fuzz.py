"""Property tests: inventory loading only ever fails with a located InventoryError, and rendered
commands always parse back, through a POSIX shell's rules, to exactly the argv and env of the plan."""

import shlex
import string

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clusterrun.errors import InventoryError, UsageError
from clusterrun.config.inventory import parse_inventory
from clusterrun.plan import build_plan, render_rank_command

FILE = "/proj/inv.yaml"
texts = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=40)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.text(max_size=300))
def test_arbitrary_text_never_crashes_the_loader(text):
    try:
        parse_inventory(text, FILE)
    except InventoryError as exc:
        assert exc.problems and all(p.line >= 1 and p.column >= 1 and p.file == FILE for p in exc.problems)
    except UsageError:
        pass


scalars = st.one_of(st.integers(-5, 70000), st.booleans(), st.none(), texts, st.floats(allow_nan=False))
host_entries = st.dictionaries(st.sampled_from(["name", "host", "addr", "port", "slots", "user", "env", "python",
                                                "connection", "bogus"]), scalars, max_size=6)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.lists(host_entries, min_size=0, max_size=4), st.dictionaries(
    st.sampled_from(["script", "args", "init_method", "backend", "timeout", "sync"]), scalars, max_size=4))
def test_structured_garbage_is_either_valid_or_located(hosts, job):
    text = yaml.safe_dump({"version": 1, "hosts": hosts, "job": job})
    try:
        inv = parse_inventory(text, FILE)
    except InventoryError as exc:
        assert all(p.line >= 1 for p in exc.problems)
        return
    assert all(h.slots >= 1 and (h.port is None or 1 <= h.port <= 65535) for h in inv.hosts)


args = st.lists(st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
                        max_size=20), max_size=6)
env_values = st.dictionaries(st.text(alphabet=string.ascii_uppercase + "_", min_size=1, max_size=8)
                             .filter(lambda k: not k.startswith(("RANK", "WORLD", "LOCAL", "GROUP", "ROLE", "NODE",
                                                                "MASTER", "CLUSTERRUN"))),
                             st.text(alphabet=st.characters(blacklist_categories=("Cs",),
                                                            blacklist_characters="\x00"), max_size=20), max_size=4)


@settings(max_examples=300, deadline=None)
@given(args, env_values)
def test_rendered_commands_split_back_to_the_exact_argv_and_env(job_args, env):
    inv = parse_inventory("version: 1\nhosts: [{host: h}]\njob: {script: t.py}\n", FILE)
    from dataclasses import replace

    inv = replace(inv, hosts=(replace(inv.hosts[0], env=env),), job=replace(inv.job, args=tuple(job_args)))
    plan = build_plan(inv, "20261130-000000-0000")
    node, rank = plan.nodes[0], plan.ranks[0]
    words = shlex.split(render_rank_command(plan, node, rank).split(" && ", 1)[1])
    assert words[0] == "env"
    assignments = words[1:1 + len(rank.env)]
    assert dict(a.split("=", 1) for a in assignments) == dict(rank.env)
    assert tuple(words[1 + len(rank.env):]) == rank.argv


OPENERS = ["{", "[", "'", '"', "{[", "[{", "{'", "['", "\"{", "'["]
PLACES = ["hosts: {op}name: a, host: x", "hosts:\n  - {op}name: a, host: x, slots: 2\n  - name: b\n    host: y",
          "hosts: [{{host: x}}]\njob: {op}script: t.py, args: [a]", "hosts: [{{host: x}}]\njob:\n  args: {op}a, b",
          "hosts: [{{host: x}}]\njob:\n  script: {op}t.py\n  backend: gloo"]


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(OPENERS), st.sampled_from(PLACES), st.sampled_from(["", "\n", "\n# end\n", "}", "]"]))
def test_every_unbalanced_bracket_and_quote_is_a_located_problem(op, place, tail):
    """Each kind of unclosed bracket or quote, wherever it stands, is a located InventoryError (exit 2):
    never a crash of the message formatter (the words hold literal braces and quotes)."""
    text = "version: 1\n" + place.format(op=op) + tail
    try:
        parse_inventory(text, FILE)
    except InventoryError as exc:
        assert exc.problems and all(p.line >= 1 and p.column >= 1 and p.file == FILE for p in exc.problems)
        assert exc.exit_code == 2
    except UsageError:
        pass
