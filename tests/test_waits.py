"""``wait_until`` returns the first truthy value and fails, naming what it waited for."""

from __future__ import annotations

import itertools
import time

import pytest

from tests.waits import wait_until


def test_returns_the_first_truthy_value() -> None:
    n = itertools.count()
    assert wait_until(lambda: next(n) >= 3 and "done", timeout=5, every_s=0.001) == "done"


def test_a_timeout_fails_naming_what_and_the_last_value() -> None:
    t0 = time.monotonic()
    with pytest.raises(AssertionError, match=r"0\.2 s waiting for the answer; last: \[\]; tail"):
        wait_until(list, timeout=0.2, every_s=0.05, what="the answer", detail=lambda: "tail")
    assert 0.2 <= time.monotonic() - t0 < 2


def test_ignored_exceptions_are_not_yet_others_propagate() -> None:
    calls = itertools.count()

    def flaky() -> int:
        if next(calls) < 2:
            raise ConnectionError("starting")
        return 7

    assert wait_until(flaky, timeout=5, every_s=0.001, ignore=(ConnectionError,)) == 7

    def down() -> int:
        raise ConnectionError("refused")

    with pytest.raises(AssertionError, match="ConnectionError"):
        wait_until(down, timeout=0.1, ignore=(ConnectionError,))
    with pytest.raises(ZeroDivisionError):
        wait_until(lambda: 1 / 0, timeout=5)
