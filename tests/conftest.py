"""Shared test settings. With CLUSTERRUN_NO_SKIP=1 (set by .ci/run) a skipped test fails instead, so CI
can never pass by silently skipping a lane: skips at run time, skips at collection time (a module-level
`pytest.importorskip`, a torch that fails to import) and xfails all count as failures."""

import os

import pytest

pytest_plugins = ["pytester"]

NO_SKIP = "CLUSTERRUN_NO_SKIP"


def _required() -> bool:
    return os.environ.get(NO_SKIP) == "1"


def _why(report) -> str:
    return report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if not _required():
        return
    if report.skipped and hasattr(report, "wasxfail"):
        reason = report.wasxfail
        del report.wasxfail  # pytest does not count a failure that still says it was expected
        report.outcome = "failed"
        report.longrepr = f"xfail under {NO_SKIP}=1 (CI must run every test for real): {reason}"
    elif report.skipped:
        reason = _why(report)
        report.outcome = "failed"
        report.longrepr = f"skipped under {NO_SKIP}=1 (CI must run every lane): {reason}"
    elif report.passed and hasattr(report, "wasxfail"):  # xpass
        reason = report.wasxfail
        del report.wasxfail
        report.outcome = "failed"
        report.longrepr = f"xfail marker under {NO_SKIP}=1: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    report = outcome.get_result()
    if _required() and report.skipped:
        reason = _why(report)
        report.outcome = "failed"
        report.longrepr = f"{collector.nodeid} skipped at collection under {NO_SKIP}=1 (CI must run every lane): " \
                          f"{reason}"


@pytest.fixture
def cr_home(tmp_path, monkeypatch):
    """A private state dir for clusterrun (runs.db, log copies)."""
    home = tmp_path / "cr-home"
    monkeypatch.setenv("CLUSTERRUN_HOME", str(home))
    return home
