"""``transfer_engine_bench``'s command line: the flags of Mooncake's
``mooncake-transfer-engine/example/transfer_engine_bench.cpp`` (0.3.13 wheel), parsed as gflags by
:mod:`.master_flags`. Defaults are Mooncake's except where Mooncake's would leave loopback or need
hardware kvcake lacks: ``--metadata_server=P2PHANDSHAKE`` (Mooncake: an etcd at 192.168.3.77),
``--protocol=tcp`` (Mooncake: rdma), ``--local_server_name=127.0.0.1`` (Mooncake: the hostname),
and no default ``--segment_id`` (Mooncake: 192.168.3.76; the target prints its name)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from dataclasses import dataclass

from kvcake.compat.mooncake import master_flags
from kvcake.core.errors import ConfigError

PROG = "transfer_engine_bench"
RATE_UNITS = {
    "GB": 1000**3, "GiB": 1 << 30, "Gb": 1000**3 / 8, "MB": 1000**2, "MiB": 1 << 20,
    "Mb": 1000**2 / 8, "KB": 1000, "KiB": 1 << 10, "Kb": 1000 / 8,
}  # fmt: skip
DEFAULTS: dict[str, str] = {
    "mode": "initiator",
    "operation": "read",
    "metadata_server": "P2PHANDSHAKE",
    "local_server_name": "127.0.0.1",
    "segment_id": "",
    "protocol": "tcp",
    "buffer_size": str(1 << 30),
    "batch_size": "128",
    "block_size": "65536",
    "duration": "10",
    "threads": "12",
    "report_unit": "GB",
    "report_precision": "2",
    "backend": "classic",
}
IGNORED = ("device_name", "nic_priority_matrix", "auto_discovery", "logtostderr", "minloglevel")


@dataclass(frozen=True)
class BenchArgs:
    mode: str
    operation: str
    metadata_server: str
    local_server_name: str
    segment_id: str
    protocol: str
    buffer_size: int
    batch_size: int
    block_size: int
    duration: int
    threads: int
    report_unit: str
    report_precision: int

    @property
    def span(self) -> int:
        """Bytes the initiator's requests cover (Mooncake's ``require_size``)."""
        return self.block_size * self.batch_size * self.threads


def parser() -> argparse.ArgumentParser:
    return master_flags.program_parser(
        PROG,
        "kvcake's stand-in for Mooncake's transfer_engine_bench: a target registers a buffer "
        "and waits; an initiator reads or writes blocks of it in batches for --duration "
        "seconds over kvcake's Transfer Engine and reports the throughput.",
        {k: f"default {v!r}" for k, v in DEFAULTS.items()},
        IGNORED,
    )


def parse(argv: list[str]) -> BenchArgs:
    given = master_flags.given_gflags(master_flags.parse_gflags(parser(), argv))
    v = {k: given.get(k, d) for k, d in DEFAULTS.items()}
    _choice(v, "mode", ("initiator", "target"))
    _choice(v, "operation", ("read", "write"))
    _choice(v, "protocol", ("tcp", "auto", "shm"), "kvcake has no RDMA; use --protocol=tcp")
    _choice(v, "backend", ("classic",), "kvcake has one Transfer Engine (no TENT)")
    if v["mode"] == "initiator" and not v["segment_id"]:
        raise ConfigError("--segment_id is required: the target's name, as it prints it")
    if v["report_unit"] not in RATE_UNITS:
        _warn(f"report_unit only supports {'|'.join(RATE_UNITS)}, not {v['report_unit']}; GB")
        v["report_unit"] = "GB"
    args = BenchArgs(
        mode=v["mode"],
        operation=v["operation"],
        metadata_server=v["metadata_server"],
        local_server_name=v["local_server_name"],
        segment_id=v["segment_id"],
        protocol=v["protocol"],
        buffer_size=_int("buffer_size", v["buffer_size"]),
        batch_size=_int("batch_size", v["batch_size"]),
        block_size=_int("block_size", v["block_size"]),
        duration=_int("duration", v["duration"]),
        threads=_int("threads", v["threads"]),
        report_unit=v["report_unit"],
        report_precision=_int("report_precision", v["report_precision"], minimum=0),
    )
    if args.buffer_size < args.span:
        _warn(f"buffer size is smaller than require_size, adjust to {args.span}")
        args = dataclasses.replace(args, buffer_size=args.span)
    return args


def _choice(v: dict[str, str], name: str, allowed: tuple[str, ...], why: str = "") -> None:
    if v[name] not in allowed:
        raise ConfigError(f"--{name}={v[name]}: use {' or '.join(allowed)}. {why}".strip())


def _int(name: str, text: str, minimum: int = 1) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(f"--{name}={text}: a whole number") from None
    if value < minimum:
        raise ConfigError(f"--{name}={text}: must be >= {minimum}")
    return value


def _warn(msg: str) -> None:
    print(f"{PROG}: warning: {msg}", file=sys.stderr)
