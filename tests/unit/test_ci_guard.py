"""CI cannot pass by skipping: under CLUSTERRUN_NO_SKIP=1 every kind of skip is a failure."""

import shutil
from pathlib import Path

import pytest

CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"

CASES = {
    "runtime skip": "import pytest\ndef test_x():\n    pytest.skip('no docker')\n",
    "collection skip": "import pytest\npytest.importorskip('no_such_module_at_all')\ndef test_x():\n    pass\n",
    "xfail": "import pytest\n@pytest.mark.xfail(reason='broken')\ndef test_x():\n    assert False\n",
    "skip marker": "import pytest\n@pytest.mark.skip(reason='later')\ndef test_x():\n    pass\n",
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_kind_of_skip_fails_under_no_skip(pytester, monkeypatch, case):
    shutil.copy(CONFTEST, pytester.path / "conftest.py")
    pytester.makepyfile(test_case=CASES[case])
    monkeypatch.setenv("CLUSTERRUN_NO_SKIP", "1")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    assert result.ret != 0, result.stdout.str()
    assert "CLUSTERRUN_NO_SKIP=1" in result.stdout.str()
    monkeypatch.delenv("CLUSTERRUN_NO_SKIP")
    assert pytester.runpytest_subprocess("-p", "no:cacheprovider").ret in (0, 5)  # without it: a skip is a skip


def test_test_modules_have_names_unique_across_lanes():
    """pytest imports test modules by basename (rootdir/prepend mode): two lanes' test_x.py collide at
    collection and the whole run stops (it happened: a unit and an integration test_network.py)."""
    from collections import Counter
    from pathlib import Path

    tests = Path(__file__).resolve().parents[1]
    names = Counter(p.name for p in tests.rglob("*.py") if p.name != "__init__.py" and p.name != "conftest.py")
    assert [n for n, count in names.items() if count > 1] == []
