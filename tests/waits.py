"""One way for tests to wait for a condition: ``wait_until``.

A timeout is a test failure (``AssertionError``) that says what was awaited and what the
condition last returned (or raised), so a failed wait reads like a failed ``assert``."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
_REPR_MAX = 300  # a last value can be a whole response body: enough to recognise it


def wait_until(
    cond: Callable[[], T | None],
    timeout: float = 10.0,
    every_s: float = 0.05,
    what: str = "the condition",
    ignore: tuple[type[BaseException], ...] = (),
    detail: Callable[[], object] | None = None,
) -> T:
    """Call ``cond`` every ``every_s`` seconds until it returns a truthy value, and return it
    (a ``None`` from ``cond`` means "not yet", so ``Optional`` conditions type as their value).

    ``cond`` is called at least once and once more at the deadline. Exceptions of the
    ``ignore`` types count as "not yet" (a server still starting); any other propagates.
    ``detail``, if given, is called on a timeout and its result added to the message (a log's
    tail, say: what the condition alone does not show).
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            last: object = cond()
        except ignore as exc:
            last = exc
        else:
            if last:
                return last  # type: ignore[return-value]
        left = deadline - time.monotonic()
        if left <= 0:
            shown = repr(last)
            if len(shown) > _REPR_MAX:
                shown = shown[:_REPR_MAX] + "..."
            extra = f"; {detail()}" if detail is not None else ""
            raise AssertionError(
                f"timed out after {timeout:g} s waiting for {what}; last: {shown}{extra}"
            )
        time.sleep(min(every_s, left))
