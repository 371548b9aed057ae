"""Right after a take-over, new replicas go only to storage nodes that re-registered with the
new leader (the others are not in its Transfer Engine directory yet); with none re-registered,
placement falls back to every segment as before."""

from __future__ import annotations

from kvcake.core.ids import ClientId, SegmentName
from kvcake.store.config import MasterConfig
from kvcake.store.ha.replay import build_state
from kvcake.store.ha.view import SegRec, View

CAP = 1 << 20


def _state() -> object:
    view = View()
    for name, owner in (("seg-a", "10.0.0.1/1/a"), ("seg-b", "10.0.0.2/2/b")):
        view.apply(SegRec(name, owner, owner.split("/")[0], "memory", CAP))
    return build_state(MasterConfig(http_port=-1), view)


def _placed(state: object, n: int, tag: str) -> set[str]:
    segs = set()
    for i in range(n):
        reps = state.put_start(ClientId("w"), "10.0.0.9", f"{tag}{i}", 1000)  # type: ignore[attr-defined]
        segs |= {r.segment for r in reps}
    return segs


def test_new_replicas_avoid_nodes_that_have_not_re_registered() -> None:
    state = _state()
    assert _placed(state, 40, "before") == {"seg-a", "seg-b"}  # nobody back yet: as before
    state.mount(ClientId("10.0.0.1/1/a"), "10.0.0.1", SegmentName("seg-a"), CAP)  # type: ignore[attr-defined]
    assert _placed(state, 40, "one") == {"seg-a"}
    state.mount(ClientId("10.0.0.2/2/b"), "10.0.0.2", SegmentName("seg-b"), CAP)  # type: ignore[attr-defined]
    assert _placed(state, 40, "both") == {"seg-a", "seg-b"}
    state.check()  # type: ignore[attr-defined]
