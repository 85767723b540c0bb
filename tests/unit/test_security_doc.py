"""docs/security.md names a test for each thing it says another user can or cannot do: every test it names
exists, and the figures it gives are the code's."""

import re
from pathlib import Path

from clusterrun.remote.host.share import folder
from clusterrun.runs import pull_limits
from clusterrun.transport import forward

ROOT = Path(__file__).resolve().parents[2]
TEXT = (ROOT / "docs" / "security.md").read_text()


def test_every_test_the_page_names_exists():
    named = re.findall(r"`([a-z_]+\.py)::(test_[a-z0-9_]+)", TEXT)
    assert len(named) >= 25
    for module, test in named:
        source = (ROOT / "tests" / "unit" / module).read_text()
        assert re.search(rf"^def {test}\(", source, re.M), f"{module}::{test} is named in docs/security.md"


def test_the_figures_on_the_page_are_the_codes():
    assert f"at most {forward.MAX_CONNECTIONS} connections" in TEXT
    assert f"fails after {folder.LOCK_WAIT:g} s" in TEXT
    assert f"{pull_limits.RESERVE >> 20} MiB kept free" in TEXT and f"more than {pull_limits.MAX_FILE >> 40} TiB" in TEXT
    assert "at most a day" in TEXT and folder.KEEP_MAX == 24 * 3600
