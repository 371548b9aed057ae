"""Process entry of ``kvcake proxy``: builds the codec and the conductor from what the instances
report (block size, KV bytes per token, calibrated cost model), then serves the OpenAI API."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from kvcake.conductor import Conductor
from kvcake.conductor.predictors import Predictors
from kvcake.core.config import KVLayoutConfig
from kvcake.core.costmodel import DecodeCoefficients, PrefillCoefficients, preset
from kvcake.core.errors import ConfigError
from kvcake.core.memtrace import install_from_env
from kvcake.net.httpserve import serve
from kvcake.net.listen import bind
from kvcake.proxy.app import ProxyState, build_app
from kvcake.proxy.auth import ApiKeys
from kvcake.proxy.metrics import ProxyMetrics
from kvcake.proxy.reqlog import RequestLog
from kvcake.proxy.textcodec import ByteCodec, ModelCodec
from kvcake.serve.config import ProxyConfig
from kvcake.serve.wire import InstanceInfo


def make_codec_factory(backend: str, model_path: str) -> Any:
    def factory(info: InstanceInfo) -> Any:
        if backend == "torch":
            return ModelCodec(model_path)
        return ByteCodec(info.vocab_size, info.eos_token_ids)

    return factory


def make_conductor_factory(cfg: ProxyConfig, colocated: bool) -> Any:
    def factory(info: InstanceInfo) -> Any:
        ccfg = replace(cfg.conductor, colocated=colocated)  # the [conductor] section
        # The instances' own cost model (calibrated or preset) scaled to wall-clock time.
        cal = info.calibration
        scale = float(cal.get("time_scale", 1.0)) or 1.0
        pre = PrefillCoefficients(*(float(c) * scale for c in cal["prefill"]))
        dec = DecodeCoefficients(*(float(c) * scale for c in cal["decode"]))
        cm = preset().with_coefficients(pre, dec)
        return Conductor(ccfg, Predictors.from_cost_model(cm))

    return factory


def run_proxy(
    cfg: ProxyConfig,
    kv: KVLayoutConfig,
    backend: str,
    model_path: str = "smollm2",
    colocated: bool = False,
    run_state: str = "",
) -> int:
    """``run_state``: the cluster.json of the `kvcake up` run (the dashboard's restarts and
    master address); "" when the proxy was started by hand."""

    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per poll otherwise
    urls = [*cfg.prefill, *cfg.decode]
    if not urls:
        raise ConfigError("proxy: give at least one instance (--prefill URL / --decode URL)")
    sock = bind(cfg.host, cfg.port, "proxy (proxy.port / --port)")

    install_from_env("proxy")  # KVCAKE_TRACEMALLOC=DIR: heap snapshots on SIGUSR2 (soak.py)
    st = ProxyState(
        urls=list(dict.fromkeys(urls)),
        models=cfg.served_model_name or (kv.model,),
        codec_factory=make_codec_factory(backend, model_path),
        conductor_factory=make_conductor_factory(cfg, colocated),
        link_bandwidth=cfg.link_bandwidth,
        poll_interval_s=cfg.poll_interval_s,
        max_prompt_tokens=cfg.max_prompt_tokens,
        max_body_bytes=cfg.max_body_bytes,
        master=cfg.master,
        directory=cfg.directory,
        run_state=run_state,
        api_keys=ApiKeys.load(cfg.api_keys, cfg.api_keys_file),
        metrics=ProxyMetrics(
            (cfg.served_model_name or (kv.model,))[0], cfg.metrics_names, cfg.max_prompt_tokens
        ),
        request_log=RequestLog(cfg.request_log, cfg.request_log_max_bytes, cfg.request_log_backups)
        if cfg.request_log
        else None,
    )
    port = sock.getsockname()[1]
    print(f"kvcake proxy on http://{cfg.host}:{port}/v1", flush=True)
    serve(build_app(st), sock, graceful_s=10)
    return 0
