"""In-process instances for the router tests: real Transfer Engines and a real store (master +
storage node subprocesses), seen by the router through the ``RemoteInstance`` surface."""

from __future__ import annotations

from typing import Any

from kvcake.core.api import DecodeTarget, KVReservation, LoadReport, PrefillTask, Role
from kvcake.core.config import KVLayoutConfig
from kvcake.core.ids import InstanceId, RequestId
from kvcake.engine.block_manager import KVCacheFull
from kvcake.instance.instance import Instance
from kvcake.instance.main import build_instance
from kvcake.serve.config import InstanceConfig
from kvcake.serve.wire import InstanceError, InstanceState, ReserveKV

BT = 16  # tokens per block


class Local:
    """An in-process instance seen through the proxy's ``RemoteInstance`` surface."""

    def __init__(self, inst: Instance):
        self.inst = inst
        self.instance_id, self.role = inst.instance_id, inst.role
        self.info, self.alive = inst.info(), True
        self.state: InstanceState | None = None
        self.url = f"inproc://{inst.instance_id}"  # resolved by InProcPeers

    async def fetch_state(self, since: int) -> InstanceState:
        first, last = self.inst.event_bounds()
        ev = tuple(self.inst.kv_events(since))
        fit = self.inst.fit.fitted().as_dict()
        self.state = InstanceState(self.inst.load_report(), ev, first, last, fit)
        return self.state

    def load_report(self) -> LoadReport:
        if self.state is None:
            return LoadReport(self.instance_id, self.role, 0.0)
        return self.state.load

    async def submit_prefill(self, task: PrefillTask) -> Any:
        return await self.inst.submit_prefill(task)

    def stream_tokens(self, *a: Any) -> Any:
        return self.inst.stream_tokens(*a)

    async def abort(self, rid: RequestId, writer_stopped: bool = False) -> bool:
        return await self.inst.abort(rid, writer_stopped)


class InProcPeers:
    """A prefill instance's decode peers in this process: ``reserve_kv`` called directly (what
    the decode instance's HTTP layer would answer, a full KV as ``kv_full``)."""

    def __init__(self, insts: dict[str, Instance]):
        self.insts = insts

    async def reserve(self, target: DecodeTarget, req: ReserveKV) -> KVReservation:
        d = self.insts[str(target.instance_id)]
        try:
            return await d.reserve_kv(
                req.request_id, req.num_tokens, req.prompt_tokens, req.block_hashes, req.sampling
            )
        except KVCacheFull as exc:
            raise InstanceError(str(exc), 503, "kv_full") from exc


def make_instances(
    directory: str, master: str, spec: tuple[tuple[str, Role, int, float], ...]
) -> dict[str, Instance]:
    """Started instances ``(name, role, kv blocks, time_scale)`` on the emulated backend."""
    kv = KVLayoutConfig(kv_block_tokens=BT)
    base = {"backend": "emulated", "directory": directory, "master": master, "kv_scale": 0.001}
    out = {}
    for name, role, blocks, scale in spec:
        cfg = InstanceConfig(id=name, kv_blocks=blocks, time_scale=scale, **base)  # type: ignore[arg-type]
        out[name] = build_instance(role, cfg, kv, InstanceId(name))
        out[name].start()
    for inst in out.values():
        inst.prefill.d.peers = InProcPeers(out)
    return out


def close_all(insts: dict[str, Instance]) -> None:
    for inst in insts.values():
        inst.close()
        te = getattr(inst, "te", None)
        if te is not None:
            te.close()
        inst.backend.close()


def watch_kv(d: Instance, bad: list[str], good: list[str]) -> None:
    """Check every normally finished request's whole context before its blocks go."""
    keep = d.decoder._keep_kv

    def checked(r: Any) -> None:
        toks = r.tokens[: r.seq.num_computed]
        ok = d.backend.verify_kv(toks, r.seq.block_table)  # type: ignore[attr-defined]
        (good if ok else bad).append(str(r.seq.request_id))
        keep(r)

    d.decoder._keep_kv = checked  # type: ignore[method-assign]
