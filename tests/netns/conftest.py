"""Tests over emulated hosts (network namespaces, kvcake.launch.netns): root only; CI runs as
root. Every test creates its namespaces and removes them (namespaces of a dead earlier run too)."""

from __future__ import annotations

import pytest

from kvcake.launch.netns import remove_stale, unavailable

WHY = unavailable()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if WHY:
        for item in items:
            if "tests/netns/" in str(item.fspath):
                item.add_marker(pytest.mark.skip(reason=f"network namespaces unavailable: {WHY}"))


@pytest.fixture(autouse=True, scope="session")
def _no_stale_namespaces() -> None:
    if not WHY:
        remove_stale()
