"""Suite-wide collection order: the longest files first.

The README's command runs the suite on two workers, a file to a worker
(``pytest -n 2 --dist loadfile``). The stacks' file alone is about five
minutes of end-to-end trainings; started last it would run alone at the end
while the other worker idles. Started first, the rest of the suite runs
beside it. A run on one process is the same set of tests in another order.
"""
from __future__ import annotations

import pytest

#: files whose tests start first, longest first (their share of the suite's time on a 2-core host)
FIRST = ("tests/stacks/", "tests/compare/", "tests/cli/test_compare_interrupt.py")


def _rank(item: pytest.Item) -> int:
    path = item.nodeid
    return next((i for i, prefix in enumerate(FIRST) if path.startswith(prefix)), len(FIRST))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=_rank)  # stable: within a group, collection order
