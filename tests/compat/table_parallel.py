"""Call-table cases for ``ParallelAxis`` / ``TensorParallelism`` / ``ReadTarget`` and the
``_with_parallelism`` / ``_with_tp`` families (run by ``mooncake_table.py`` on either side):
every axis kind, the wheel's validation, stored names and bytes, each read mode, batch, ``_into``
and ``_from`` forms."""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any


def run(ms: Any, st: Any, case: Callable[..., Any], buf: Callable[[int], int]) -> None:
    import torch

    def ax(
        kind: str, rank: int, size: int, sd: Any = None, eid: Any = None, sid: Any = None
    ) -> Any:
        a = ms.ParallelAxis()
        a.kind, a.rank, a.size = kind, rank, size
        a.split_dim, a.expert_id, a.stage_id = sd, eid, sid
        return a

    def par(*axes: Any) -> Any:
        p = ms.TensorParallelism()
        p.axes = list(axes)
        return p

    def tgt(mode: str, p: Any = None) -> Any:
        t = ms.ReadTarget()
        t.mode, t.parallelism = mode, p
        return t

    a0 = ms.ParallelAxis()
    case("par.axis_defaults", lambda: [a0.kind, a0.rank, a0.size, a0.split_dim, a0.expert_id])
    case("par.target_defaults", lambda: [ms.ReadTarget().mode, ms.ReadTarget().parallelism])
    case("par.kind_int", lambda: setattr(ms.ParallelAxis(), "kind", 5))
    case("par.rank_str", lambda: setattr(ms.ParallelAxis(), "rank", "1"))
    case("par.mode_int", lambda: setattr(ms.ReadTarget(), "mode", 3))
    case("par.mode_upper", lambda: tgt("SHARD").mode)

    def appended() -> int:
        p = ms.TensorParallelism()
        p.axes.append(ax("dp", 0, 1))
        return len(p.axes)

    case("par.axes_append", appended)
    t = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    puts = {
        "tp": [ax("tp", 1, 2, 0)], "tp0": [ax("tp", 0, 2, 1)], "tp_nosd": [ax("tp", 1, 2)],
        "empty_kind": [ax("", 1, 2, 0)], "upper": [ax("TP", 1, 2, 0)], "dp": [ax("dp", 1, 2)],
        "dp_sd": [ax("dp", 1, 2, 0)], "ep": [ax("ep", 0, 2, eid=3)], "ep_noeid": [ax("ep", 0, 2)],
        "pp": [ax("pp", 1, 4, sid=1)], "pp_nosid": [ax("pp", 1, 4)],
        "dp_tp": [ax("dp", 1, 2), ax("tp", 1, 2, 1)], "tp_dp": [ax("tp", 1, 2, 1), ax("dp", 1, 2)],
        "all": [ax("pp", 1, 2, sid=1), ax("ep", 0, 2, eid=3), ax("tp", 1, 2, 1), ax("dp", 1, 2)],
        "dup": [ax("tp", 0, 2, 0), ax("tp", 1, 2, 0)], "badrank": [ax("dp", 2, 2)],
        "bad_kind": [ax("xx", 0, 1)], "empty": [],
    }  # fmt: skip
    for name, axes in puts.items():
        case(
            f"par.put.{name}",
            lambda a=axes, n=name: st.put_tensor_with_parallelism(f"p.{n}", t, par(*a)),
        )
    case("par.put.not_parallelism", lambda: st.put_tensor_with_parallelism("p.x", t, 5))
    case(
        "par.put.uneven",
        lambda: st.put_tensor_with_parallelism(
            "p.u", t[:3], par(*puts["dp_tp"][:1], ax("tp", 0, 2, 0))
        ),
    )
    names = [
        "p.tp_tp_1", "p.tp0_tp_0", "p.upper_tp_1", "p.dp__dp_1of2", "p.ep__ep_0of2_eid3",
        "p.pp__pp_1of4_sid1", "p.dp_tp__dp_1of2__tp_1of2_sd1", "p.tp_dp__dp_1of2__tp_1of2_sd1",
        "p.all__dp_1of2__tp_1of2_sd1__ep_0of2_eid3__pp_1of2_sid1", "p.tp", "p.dp",
    ]  # fmt: skip
    case("par.stored_names", lambda: [st.is_exist(k) for k in names])
    for k in (
        "p.tp0_tp_0",
        "p.dp__dp_1of2",
        "p.ep__ep_0of2_eid3",
        "p.all__dp_1of2__tp_1of2_sd1__ep_0of2_eid3__pp_1of2_sid1",
    ):
        case(f"par.bytes.{k}", lambda k=k: st.get(k))  # the stored header, byte for byte
    shard = tgt("shard", par(ax("tp", 1, 2, 1), ax("dp", 1, 2)))
    case("par.get.shard_multi", lambda: st.get_tensor_with_parallelism("p.tp_dp", shard))
    case(
        "par.get.shard_other_axes",
        lambda: st.get_tensor_with_parallelism("p.dp", tgt("shard", par(ax("dp", 0, 2)))),
    )
    case(
        "par.get.as_stored_par",
        lambda: st.get_tensor_with_parallelism("p.dp", tgt("as_stored", par(ax("dp", 1, 2)))),
    )
    case("par.get.bad_mode", lambda: st.get_tensor_with_parallelism("p.dp", tgt("bogus")))
    case("par.get.not_target", lambda: st.get_tensor_with_parallelism("p.dp", 5))
    # a complete tp set (two shards of a 4x6) read in every mode
    for r in range(2):
        st.put_tensor_with_parallelism(
            "p.set", t.chunk(2, 0)[r].contiguous(), par(ax("tp", r, 2, 0))
        )
    st.put_tensor_with_parallelism("p.half", t.chunk(2, 0)[0].contiguous(), par(ax("tp", 0, 2, 0)))
    st.put_tensor("p.plain", t)
    reads = {
        "full": ("p.set", tgt("full", par(ax("tp", 1, 2, 0)))),
        "full_any_size": ("p.set", tgt("full", par(ax("tp", 0, 4, 0)))),
        "full_other_dim": ("p.set", tgt("full", par(ax("tp", 0, 2, 1)))),
        "full_dp": ("p.set", tgt("full", par(ax("dp", 0, 2)))),
        "full_nopar": ("p.set", tgt("full")), "full_plain": ("p.plain", tgt("full")),
        "full_incomplete": ("p.half", tgt("full", par(ax("tp", 0, 2, 0)))),
        "shard_exact": ("p.set", tgt("shard", par(ax("tp", 1, 2, 0)))),
        "reshard": ("p.set", tgt("shard", par(ax("tp", 1, 4, 0)))),
        "reshard_missing_rank": ("p.set", tgt("shard", par(ax("tp", 3, 4, 0)))),
        "reshard_uneven": ("p.set", tgt("shard", par(ax("tp", 0, 3, 0)))),
        "shard_other_dim": ("p.set", tgt("shard", par(ax("tp", 0, 3, 1)))),
        "shard_incomplete": ("p.half", tgt("shard", par(ax("tp", 0, 4, 0)))),
        "shard_missing": ("p.half", tgt("shard", par(ax("tp", 1, 2, 0)))),
        "shard_nopar": ("p.set", tgt("shard")), "as_stored": ("p.set", tgt("as_stored")),
        "plain_shard": ("p.plain", tgt("shard", par(ax("tp", 0, 2, 0)))),
    }  # fmt: skip
    for name, (key, target) in reads.items():
        case(f"par.read.{name}", lambda k=key, g=target: st.get_tensor_with_parallelism(k, g))
    case("tp.get_size1", lambda: st.get_tensor_with_tp("p.plain", tp_rank=0, tp_size=1))
    case("tp.get_unchecked_size", lambda: st.get_tensor_with_tp("p.set", tp_rank=1, tp_size=4))
    u = torch.arange(30, dtype=torch.float32).reshape(5, 6)
    case("tp.put_uneven", lambda: st.put_tensor_with_tp("p.wt5", u, tp_size=2, split_dim=0))
    case(
        "tp.batch_put_uneven",
        lambda: st.batch_put_tensor_with_tp(["p.b5", "p.b6"], [u, t], tp_size=2),
    )
    # batch, _into and _from forms
    bp = [par(ax("dp", 0, 2)), None, par(ax("tp", 0, 2))]
    case(
        "par.batch_put",
        lambda: st.batch_put_tensor_with_parallelism(["p.q0", "p.q1", "p.q2"], [t] * 3, bp),
    )
    case(
        "par.batch_put_len",
        lambda: st.batch_put_tensor_with_parallelism(["p.r0", "p.r1"], [t, t], bp[:1]),
    )
    targets = [tgt("shard", bp[0]), None, tgt("full", par(ax("tp", 0, 2, 0)))]
    case(
        "par.batch_get",
        lambda: st.batch_get_tensor_with_parallelism(["p.q0", "p.q1", "p.set"], targets),
    )
    case("par.batch_get_none", lambda: st.batch_get_tensor_with_parallelism(["p.q1", "p.set"]))
    case(
        "par.batch_get_len", lambda: st.batch_get_tensor_with_parallelism(["p.q1", "p.set"], [None])
    )
    case(
        "par.batch_get_bad_mode",
        lambda: st.batch_get_tensor_with_parallelism(["p.q1"], [tgt("bogus")]),
    )
    b = buf(1 << 16)
    st.register_buffer(b, 1 << 16)
    into = {
        "shard": ("p.set", tgt("shard", par(ax("tp", 1, 2, 0)))),
        "full": ("p.set", tgt("full", par(ax("tp", 0, 2, 0)))),
        "reshard": ("p.set", tgt("shard", par(ax("tp", 1, 4, 0)))),
        "reshard_uneven": ("p.set", tgt("shard", par(ax("tp", 0, 3, 0)))),
        "plain": ("p.plain", None), "dp": ("p.dp", tgt("shard", par(ax("dp", 1, 2)))),
    }  # fmt: skip
    for name, (key, target) in into.items():
        case(
            f"par.into.{name}",
            lambda k=key, g=target: st.get_tensor_with_parallelism_into(k, b, 1 << 16, g),
        )
    case(
        "par.into.small",
        lambda: st.get_tensor_with_parallelism_into("p.set", b, 100, into["full"][1]),
    )
    case("par.into.bytes", lambda: ctypes.string_at(b, 400))  # the rebuilt tensor's header + data
    src = buf(1 << 12)
    blob = st.get("p.plain")
    ctypes.memmove(src, bytes(blob), len(blob))
    n = len(blob)
    case(
        "par.from.dp",
        lambda: st.put_tensor_with_parallelism_from("p.f", src, n, par(ax("dp", 1, 2))),
    )
    case(
        "par.from.tp",
        lambda: st.put_tensor_with_parallelism_from("p.ft", src, n, par(ax("tp", 1, 2, 0))),
    )
    case("par.from.tp_all_ranks", lambda: [st.get_tensor("p.ft_tp_0"), st.get_tensor("p.ft_tp_1")])
    case(
        "par.from.dp_tp",
        lambda: st.put_tensor_with_parallelism_from(
            "p.fd", src, n, par(ax("dp", 1, 2), ax("tp", 1, 2, 0))
        ),
    )
    case("par.from.dp_tp_get", lambda: st.get_tensor("p.fd__dp_1of2__tp_1of2_sd0"))
    case(
        "par.from.batch",
        lambda: st.batch_put_tensor_with_parallelism_from(
            ["p.g0", "p.g1"], [src, src], [n, n], [par(ax("ep", 1, 2, eid=0)), None]
        ),
    )
    # upserts of objects nobody read (kvcake refuses to overwrite leased bytes: upsert.leased)
    st.put_tensor_with_parallelism("p.ud", t, par(ax("dp", 1, 2)))
    st.put_tensor_with_parallelism("p.uq", t, bp[0])
    up = par(ax("dp", 1, 2))
    case("par.upsert", lambda: st.upsert_tensor_with_parallelism("p.ud", t * 2, up))
    pars = [bp[0], par(ax("pp", 0, 1, sid=0))]
    case(
        "par.batch_upsert",
        lambda: st.batch_upsert_tensor_with_parallelism(["p.uq", "p.n"], [t * 3, t], pars),
    )
    case("par.upsert_get", lambda: st.get_tensor("p.ud__dp_1of2"))
    # writer partitions: each writer holds the whole tensor and stores its share + a manifest
    import types

    def wp(r: int, n: int, d: int) -> Any:
        return types.SimpleNamespace(rank=r, size=n, split_dim=d)

    cfg = ms.ReplicateConfig()
    case("wp.put0", lambda: st.put_tensor_with_parallelism("p.w", t, None, cfg, wp(0, 2, 0)))
    case("wp.manifest", lambda: st.get("p.w__writer_manifest"))
    case("wp.share_bytes", lambda: st.get("p.w__writer_0of2_sd0"))
    case("wp.full_partial", lambda: st.get_tensor_with_parallelism("p.w", tgt("full")))
    case("wp.put1", lambda: st.put_tensor_with_parallelism("p.w", t, None, cfg, wp(1, 2, 0)))
    case("wp.full", lambda: st.get_tensor_with_parallelism("p.w", tgt("full")))
    case(
        "wp.full_tp",
        lambda: st.get_tensor_with_parallelism("p.w", tgt("full", par(ax("tp", 0, 2, 0)))),
    )
    case(
        "wp.shard",
        lambda: st.get_tensor_with_parallelism("p.w", tgt("shard", par(ax("tp", 1, 2, 0)))),
    )
    case(
        "wp.reshard",
        lambda: st.get_tensor_with_parallelism("p.w", tgt("shard", par(ax("tp", 1, 4, 0)))),
    )
    case("wp.as_stored", lambda: st.get_tensor_with_parallelism("p.w", tgt("as_stored")))
    case(
        "wp.dict",
        lambda: st.put_tensor_with_parallelism(
            "p.wd", t, None, cfg, {"rank": 0, "size": 2, "split_dim": 0}
        ),
    )
    case("wp.uneven", lambda: st.put_tensor_with_parallelism("p.wu", t[:3], None, cfg, wp(0, 2, 0)))
    case("wp.bad_dim", lambda: st.put_tensor_with_parallelism("p.wb", t, None, cfg, wp(0, 2, 2)))
    case(
        "wp.with_parallelism",
        lambda: st.put_tensor_with_parallelism("p.wx", t, par(ax("dp", 0, 2)), cfg, wp(0, 2, 0)),
    )
    case(
        "wp.batch",
        lambda: st.batch_put_tensor_with_parallelism(
            ["p.wb0", "p.wb1"], [t, t], None, cfg, [wp(0, 1, 1), None]
        ),
    )
    case(
        "wp.batch_len",
        lambda: st.batch_put_tensor_with_parallelism(
            ["p.wc0", "p.wc1"], [t, t], None, cfg, [wp(0, 1, 0)]
        ),
    )
    case(
        "wp.batch_full",
        lambda: st.batch_get_tensor_with_parallelism(["p.w", "p.wb0"], [tgt("full"), tgt("full")]),
    )
    case(
        "wp.into_full", lambda: st.get_tensor_with_parallelism_into("p.w", b, 1 << 16, tgt("full"))
    )
    case(
        "wp.from",
        lambda: st.put_tensor_with_parallelism_from("p.wf", src, n, None, cfg, wp(1, 2, 1)),
    )
    case(
        "wp.from_names",
        lambda: [st.is_exist("p.wf__writer_1of2_sd1"), st.is_exist("p.wf__writer_manifest")],
    )
    st.unregister_buffer(b)
