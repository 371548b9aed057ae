"""Settings of a durable / highly available master (``[ha]`` in TOML, ``KVCAKE_HA_*``, flags of
``kvcake master``)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from kvcake.core.config import require, size_field


@dataclass(frozen=True)
class HaConfig:
    etcd_endpoints: str = field(
        default="",
        metadata={"help": "etcd URLs (http://127.0.0.1:2379[,...]): elect a leader, log to etcd"},
    )
    state_dir: Path | None = field(
        default=None,
        metadata={"help": "without etcd: log + snapshot here; a restart keeps the metadata"},
    )
    cluster: str = field(
        default="kvcake",
        metadata={"help": "etcd key prefix /kvcake/<cluster>/ (several pools on one etcd)"},
    )
    ha_lease_ttl_s: int = field(
        default=2,
        metadata={"help": "leader lease: a dead leader is replaced about this long after"},
    )
    snapshot_every: int = field(
        default=20_000,
        metadata={"help": "logged records between two snapshots (each compacts etcd's history)"},
    )
    snapshot_bytes: int = size_field(
        "8MiB",
        "a snapshot also once the log since the last one holds this many bytes (what a "
        "take-over reads: ~50 ms a MiB from etcd here)",
    )
    # etcd transactions in flight. 1 measured best (benchmarks/ha_bench.py, 16 clients: 851-930
    # vs 613-651 put/s at 4): one transaction at a time gathers ~2x the records each.
    commit_depth: int = field(
        default=1, metadata={"help": "operation-log writes (etcd transactions) in flight at once"}
    )
    # Under concurrent load (the last entry carried >= commit_siblings requests) the log's writer
    # waits up to commit_delay_us for as many requests as recent entries carried before it
    # writes the next one (PostgreSQL's commit_delay / commit_siblings). Fuller, fewer etcd
    # transactions leave more CPU to everything else: 4-16 clients on 2 vCPUs, 2 ms: +13-27 %
    # HA put/s (docs/benchmarks.md, "Store HA"). A lone client never waits. 0 turns it off.
    commit_delay_us: int = field(
        default=2000,
        metadata={
            "help": "under concurrent load, wait up to this long to gather a whole group "
            "of requests into one log write (0: off)"
        },
    )
    commit_siblings: int = field(
        default=4,
        metadata={
            "help": "gather only after a log write that carried at least this many "
            "requests (a lone client never waits)"
        },
    )

    def __post_init__(self) -> None:
        require(
            not (self.etcd_endpoints and self.state_dir is not None),
            "ha: give either --etcd-endpoints (HA) or --state-dir (one durable master), not both",
        )
        require(
            bool(re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", self.cluster)),
            f"ha.cluster must be 1-64 of [A-Za-z0-9_.-], got {self.cluster!r}",
        )
        require(2 <= self.ha_lease_ttl_s <= 60, "ha.ha_lease_ttl_s must be in [2, 60]")
        require(self.snapshot_every >= 100, "ha.snapshot_every must be >= 100")
        require(self.snapshot_bytes >= 1 << 16, "ha.snapshot_bytes must be >= 64KiB")
        require(1 <= self.commit_depth <= 16, "ha.commit_depth must be in [1, 16]")
        require(0 <= self.commit_delay_us <= 100_000, "ha.commit_delay_us must be in [0, 100000]")
        require(1 <= self.commit_siblings <= 1024, "ha.commit_siblings must be in [1, 1024]")

    @property
    def enabled(self) -> bool:
        return bool(self.etcd_endpoints) or self.state_dir is not None
