"""README's command table against the click commands themselves: every command has a row, every option a
command takes is in its row, and the row names no option the command does not take. So the table
cannot drift from the code (a new option fails this test until README says what it does)."""

import re
from pathlib import Path

import click

from clusterrun.cli import group

README = Path(__file__).resolve().parents[2] / "README.md"


def command_rows():
    """{command name: the first cells of its rows} from README's "## Commands" table (a command may have
    a row per way of using it: `check` and `check --net`)."""
    text = README.read_text()
    table = text.split("\n## Commands\n", 1)[1].split("\n#", 1)[0]
    rows = {}
    for line in table.splitlines():
        m = re.match(r"\| `clusterrun (\S+)(.*?)` \|", line)
        if m:
            rows[m.group(1)] = rows.get(m.group(1), "") + " " + m.group(2)
    return rows


def options_of(command: click.Command):
    """Each option's spellings (--help left out: every command has it)."""
    return [p.opts + p.secondary_opts for p in command.params
            if isinstance(p, click.Option) and "--help" not in p.opts]


def test_every_command_has_a_row_in_readme():
    assert sorted(command_rows()) == sorted(group.commands), "README's command table and the CLI differ"


def test_every_option_of_every_command_is_in_its_row():
    rows = command_rows()
    missing = {}
    for name, command in group.commands.items():
        cell = rows.get(name, "")
        named = set(re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", cell))
        lacking = [spellings[0] for spellings in options_of(command) if not named & set(spellings)]
        if lacking:
            missing[name] = lacking
    assert not missing, f"options missing from README's command table: {missing}"


def test_the_table_names_no_option_a_command_does_not_take():
    rows = command_rows()
    unknown = {}
    for name, command in group.commands.items():
        known = {o for spellings in options_of(command) for o in spellings} | {"--"}
        named = set(re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", rows.get(name, "")))
        if named - known:
            unknown[name] = sorted(named - known)
    assert not unknown, f"README's command table names options the CLI does not have: {unknown}"
