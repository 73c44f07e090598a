"""Show the chaos table in every run's terminal summary (CI runs plain `pytest`, without `-s`)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

_TABLES = pytest.StashKey[list[str]]()


@pytest.fixture()
def chaos_report(request: pytest.FixtureRequest) -> Callable[[str], None]:
    """Call with the finished table; it is printed at the end of the session, pass or fail."""

    def report(table: str) -> None:
        request.config.stash.setdefault(_TABLES, []).append(table)

    return report


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    for table in config.stash.get(_TABLES, []):
        terminalreporter.write_sep("=", "chaos: faults injected and what they did")
        terminalreporter.write_line(table)
