"""The command tables against the click commands themselves. docs/commands.md's full table: every command
has a row, every option a command takes is in its row, and the row names no option the command does not
take, so the table cannot drift from the code (a new option fails this test until the docs say what it
does). README's short table: every command has one row of at most 100 characters, naming only options the
command takes. And every link in README and docs/ leads somewhere: a file that exists, a heading that is
there, and every page of docs/ is linked from README."""

import re
from pathlib import Path

import click

from clusterrun.cli import group

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
COMMANDS = ROOT / "docs" / "commands.md"


def command_rows(page=COMMANDS):
    """{command name: the first cells of its rows} from the page's "## Commands" table (a command may have
    a row per way of using it: `check` and `check --net`)."""
    text = page.read_text()
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
    assert sorted(command_rows()) == sorted(group.commands), "docs/commands.md's table and the CLI differ"


def test_every_option_of_every_command_is_in_its_row():
    rows = command_rows()
    missing = {}
    for name, command in group.commands.items():
        cell = rows.get(name, "")
        named = set(re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", cell))
        lacking = [spellings[0] for spellings in options_of(command) if not named & set(spellings)]
        if lacking:
            missing[name] = lacking
    assert not missing, f"options missing from docs/commands.md's table: {missing}"


def test_the_table_names_no_option_a_command_does_not_take():
    rows = command_rows()
    unknown = {}
    for name, command in group.commands.items():
        known = {o for spellings in options_of(command) for o in spellings} | {"--"}
        named = set(re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", rows.get(name, "")))
        if named - known:
            unknown[name] = sorted(named - known)
    assert not unknown, f"docs/commands.md's table names options the CLI does not have: {unknown}"


def test_readme_has_the_short_table_one_line_a_command():
    text = README.read_text()
    table = text.split("\n## Commands\n", 1)[1].split("\n#", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| `clusterrun ")]
    assert sorted(command_rows(README)) == sorted(group.commands), "README's short table and the CLI differ"
    assert len(rows) == len(group.commands), "README's short table: one row per command"
    long = [line for line in rows if len(line) > 100]
    assert not long, f"README's command rows over 100 characters: {long}"


def test_readme_short_table_names_only_real_options():
    table = README.read_text().split("\n## Commands\n", 1)[1].split("\n#", 1)[0]
    unknown = {}
    for line in table.splitlines():
        m = re.match(r"\| `clusterrun ([\w-]+)", line)
        if not m:
            continue
        command = group.commands[m.group(1)]
        known = {o for spellings in options_of(command) for o in spellings} | {"--"}
        named = set(re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", line)) - known
        if named:
            unknown[m.group(1)] = sorted(named)
    assert not unknown, f"README's short table names options the CLI does not have: {unknown}"


def slug(heading):
    """The anchor GitHub gives a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page):
    inside_code = False
    found = set()
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            inside_code = not inside_code
        elif not inside_code and line.startswith("#"):
            found.add(slug(line.lstrip("#")))
    return found


def links(page):
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return re.findall(r"\]\(([^)\s]+)\)", text)


def test_every_link_in_readme_and_docs_leads_somewhere():
    broken = []
    for page in [README, *sorted((ROOT / "docs").glob("*.md"))]:
        for target in links(page):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "links that lead nowhere:\n" + "\n".join(broken)


def test_every_docs_page_is_linked_from_readme():
    linked = {(README.parent / t.partition("#")[0]).resolve() for t in links(README)}
    unlinked = [p.name for p in sorted((ROOT / "docs").glob("*.md")) if p.resolve() not in linked]
    assert not unlinked, f"docs pages README does not link: {unlinked}"


def test_readme_fits_on_a_few_screens():
    assert len(README.read_text().splitlines()) <= 250
