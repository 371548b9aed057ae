"""Serving sub-commands: ``kvcake prefill``, ``decode``, ``proxy`` (one process each), ``up`` /
``status`` / ``down`` (a whole local cluster from one config file) and ``replay`` (a Mooncake
trace against any OpenAI endpoint). Heavy imports happen inside the handlers."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from kvcake.commands import _up as launcher_cli
from kvcake.conductor.config import ConductorConfig
from kvcake.core import auth
from kvcake.core.api import Role
from kvcake.core.config import KVLayoutConfig, add_config_flags, flag_overrides, load_config
from kvcake.replay import cli as replay_cli
from kvcake.serve.config import InstanceConfig, ProxyConfig, load_proxy_config

# InstanceConfig's fields with a flag (help: each field's metadata); the rest: --config only.
INSTANCE_FLAGS = ("id", "host", "port", "backend", "kv_blocks", "threads", "max_batch",
                  "directory", "master", "max_context", "prefill_chunk", "kv_scale",
                  "calibration", "time_scale", "preset")  # fmt: skip
PROXY_FLAGS = ("host", "port", "request_log", "metrics_names")
CONDUCTOR_FLAGS = ("prefill_policy", "admission_policy", "ttft_slo_s", "tbt_slo_s",
                   "kvcache_balancing_threshold", "seed")  # fmt: skip
CONDUCTOR_ALIASES = {"prefill_policy": ("--policy",), "admission_policy": ("--admission",)}


def register(sub: Any) -> None:
    for role, text in (
        ("prefill", "run a prefill instance (computes prompt KV, streams it to decode)"),
        ("decode", "run a decode instance (continuous batching over received KV)"),
        ("colocated", "run an instance that prefills and decodes (the vLLM-like baseline)"),
    ):
        p = sub.add_parser(role, help=text, description=text)
        p.add_argument("--config", help="cluster TOML ([kv] and [instance] sections)")
        add_config_flags(p, InstanceConfig, only=INSTANCE_FLAGS)
        p.add_argument("--block-tokens", type=int, help="kv_block_tokens (must match the cluster)")
        auth.add_cli_args(p)
        p.set_defaults(func=_instance, role=role)

    p = sub.add_parser(
        "proxy",
        help="run the OpenAI-compatible proxy (holds the conductor)",
        description="OpenAI-compatible front end: /v1/completions, /v1/chat/completions, "
        "/v1/models, /health, /metrics. Instances are given by URL.",
    )
    p.add_argument("--config", help="cluster TOML ([kv], [proxy] and [conductor] sections)")
    add_config_flags(p, ProxyConfig, only=PROXY_FLAGS)
    p.add_argument("--prefill", action="append", help="prefill (or colocated) instance URL")
    p.add_argument("--decode", action="append", help="decode instance URL")
    p.add_argument("--backend", default="torch", help="torch: real tokenizer; emulated: bytes")
    p.add_argument("--colocated", action="store_true", help="instances prefill and decode")
    # [conductor] settings (the section the simulator reads too; --policy and --admission are
    # the short names the proxy always had)
    add_config_flags(p, ConductorConfig, only=CONDUCTOR_FLAGS, aliases=CONDUCTOR_ALIASES)
    auth.add_cli_args(p)  # the proxy signs its calls to the instances with it
    p.set_defaults(func=_proxy)

    launcher_cli.register(sub)
    replay_cli.register(sub)


def _instance(args: argparse.Namespace) -> int:
    # lazy: CLI start-up
    from kvcake.instance.main import run_instance

    cfg = load_config(
        InstanceConfig, toml_path=args.config, section="instance",
        overrides=flag_overrides(args, INSTANCE_FLAGS),
    )  # fmt: skip
    kv = load_config(
        KVLayoutConfig, toml_path=args.config, section="kv",
        overrides={"kv_block_tokens": args.block_tokens},
    )  # fmt: skip
    role = {"prefill": Role.PREFILL, "decode": Role.DECODE, "colocated": Role.BOTH}[args.role]
    return run_instance(role, cfg, kv)


def _proxy(args: argparse.Namespace) -> int:
    # lazy: CLI start-up
    from kvcake.proxy.main import run_proxy

    ov = flag_overrides(args, PROXY_FLAGS)
    ov["prefill"] = tuple(args.prefill) if args.prefill else None
    ov["decode"] = tuple(args.decode) if args.decode else None
    cond = flag_overrides(args, CONDUCTOR_FLAGS)
    cfg = load_proxy_config(args.config, ov, cond)
    kv = load_config(KVLayoutConfig, toml_path=args.config, section="kv")
    # `kvcake up` writes the proxy's config next to its run record (cluster.json): the
    # dashboard reads restarts and the master's address from there.

    # lazy: CLI start-up
    from kvcake.launch.launcher import STATE_FILE

    run_state = str(Path(args.config).with_name(STATE_FILE)) if args.config else ""
    return run_proxy(cfg, kv, args.backend, colocated=args.colocated, run_state=run_state)
