from __future__ import annotations

import pytest

from kvcake.conductor import select_decode
from kvcake.core.errors import SchedulingError

from .util import PRED, decode, request

# tbt = 0.01 + 0.001 * batch + 1e-6 * ctx; the request has 100 prompt tokens, 50 output.


def test_selects_smallest_predicted_tbt_counting_pending() -> None:
    states = (
        decode("d0", running=10, ctx=10_000),  # 0.01 + 0.011 + 0.0101 = 0.0311
        decode("d1", running=4, ctx=30_000),  # 0.01 + 0.005 + 0.0301 = 0.0451
        decode("d2", running=2, ctx=2_000, pending_requests=6, pending_context_tokens=8_000),
        # d2: batch 9, ctx 10_100: 0.01 + 0.009 + 0.0101 = 0.0291
    )
    c = select_decode(states, PRED.decode, request())
    assert c is not None
    assert (c.instance_id, c.index, c.fits) == ("d2", 2, True)
    assert c.tbt_s == pytest.approx(0.0291)


def test_prefers_instances_with_kv_room() -> None:
    # d0 is idle but has only 120 tokens of KV: 100 prompt + 50 output do not fit.
    states = (decode("d0", cap=120), decode("d1", running=20, ctx=50_000))
    c = select_decode(states, PRED.decode, request())
    assert c is not None and c.instance_id == "d1" and c.fits
    assert c.tbt_s == pytest.approx(0.01 + 0.021 + 0.0501)
    # Nothing fits: the smallest TBT overall, flagged.
    c = select_decode(
        (decode("d0", cap=120), decode("d1", running=3, cap=149)), PRED.decode, request()
    )
    assert c is not None and (c.instance_id, c.fits) == ("d0", False)
    # Exactly full fits.
    c = select_decode((decode("d0", cap=150),), PRED.decode, request())
    assert c is not None and c.fits


def test_skips_unhealthy_and_breaks_ties_by_order() -> None:
    states = (decode("d0", healthy=False), decode("d1"), decode("d2"))
    c = select_decode(states, PRED.decode, request())
    assert c is not None and c.instance_id == "d1"
    assert select_decode((decode("d0", healthy=False),), PRED.decode, request()) is None
    assert select_decode((), PRED.decode, request()) is None
    c = select_decode(states, PRED.decode, request(), only="d2")  # type: ignore[arg-type]
    assert c is not None and c.instance_id == "d2"


@pytest.mark.parametrize(
    "bad",
    [
        decode("d0", running=-1),
        decode("d0", ctx=-5),
        decode("d0", cap=0),
        decode("d0", pending_requests=-1),
        decode("d0", pending_context_tokens=-1),
    ],
)
def test_malformed_decode_state(bad) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SchedulingError):
        select_decode((decode("ok"), bad), PRED.decode, request())


def test_non_numeric_decode_state() -> None:
    with pytest.raises(SchedulingError, match="integer"):
        select_decode((decode("d0", running=None),), PRED.decode, request())  # type: ignore[arg-type]


def test_duplicate_decode_ids() -> None:
    with pytest.raises(SchedulingError, match="twice"):
        select_decode((decode("d0"), decode("d0")), PRED.decode, request())
