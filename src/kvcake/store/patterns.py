"""Key patterns of ``remove_all`` (docs/store.md, "Patterns"), matched off the state lock.

- ``""``: every key.
- no ``*``, ``?`` or ``[``: a **prefix** (``"model/fp32/"``).
- otherwise a **glob** over the whole key (``fnmatch`` rules, case-sensitive; ``*`` also
  crosses ``/``). Python's glob translation never backtracks exponentially.
- Mooncake's ``remove_by_regex`` sends a regular expression instead (``RemoveAll.regex``):
  matched with the ``regex`` module under a total time budget (``InvalidParams`` when exceeded)
  and without the GIL, so a pattern like ``(a+)+$`` costs its caller, not every other client.

Patterns are at most ``MAX_PATTERN`` characters.
"""

from __future__ import annotations

import fnmatch
import re
import time
from collections.abc import Callable, Iterable

import regex

from kvcake.store.errors import InvalidParams

MAX_PATTERN = 1024
REGEX_BUDGET_S = 1.0
GLOB_CHARS = frozenset("*?[")


def matcher(pattern: str) -> Callable[[str], bool]:
    """A predicate for a prefix/glob ``pattern``; InvalidParams if it is too long."""
    if len(pattern) > MAX_PATTERN:
        raise InvalidParams(f"pattern longer than {MAX_PATTERN} characters")
    if not pattern:
        return lambda key: True
    if not GLOB_CHARS & set(pattern):
        return lambda key: key.startswith(pattern)
    rx = re.compile(fnmatch.translate(pattern))
    return lambda key: rx.match(key) is not None


def match_regex(expr: str, keys: Iterable[str], budget_s: float = REGEX_BUDGET_S) -> list[str]:
    """Keys that ``re.search``-match ``expr`` (Mooncake's remove_by_regex), within a budget."""

    if len(expr) > MAX_PATTERN:
        raise InvalidParams(f"regular expression longer than {MAX_PATTERN} characters")
    try:
        rx = regex.compile(expr, flags=regex.VERSION0)
    except regex.error as exc:
        raise InvalidParams(f"bad regular expression: {exc}") from exc
    deadline = time.monotonic() + budget_s
    out = []
    for key in keys:
        left = deadline - time.monotonic()
        try:
            if left <= 0:
                raise TimeoutError
            if rx.search(key, timeout=left, concurrent=True) is not None:
                out.append(key)
        except TimeoutError as exc:
            raise InvalidParams(
                f"regular expression {expr!r} took longer than {budget_s} s; "
                "use a prefix or glob pattern (remove_all(pattern=...))"
            ) from exc
    return out
