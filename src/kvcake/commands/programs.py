"""Process entry points that parse their own command line, as ``kvcake`` sub-commands:
``vllm-proxy`` (the vLLM fleet's proxy), ``netns-up`` / ``netns-relay`` (the network-namespace
cluster harness and its delaying relay) and kvcake's stand-ins for Mooncake's programs
(``mooncake-master``, ``mooncake-client``, ``mooncake-transfer-engine-bench``,
``mooncake-metadata-server``; ``kvcake mooncake-shim install`` also writes them under Mooncake's
own names). Each hands its arguments to the module's ``main`` (:func:`._common.add_program`)."""

from __future__ import annotations

from typing import Any

from kvcake.commands._common import add_program

_MOONCAKE = (
    "kvcake's stand-in for Mooncake's {prog}: the same command line (gflags: --flag=value), run "
    "on kvcake. `kvcake mooncake-shim install` writes it under the name {prog} too."
)


def register(sub: Any) -> None:
    add_program(sub, "vllm-proxy", "kvcake.fleet.proxy:main",
                help="run the KV-aware OpenAI proxy in front of vLLM engines (the vLLM fleet)",
                description="kvcake's KV-aware proxy in front of vLLM engines: kv_both engines "
                "(--engine) or a P/D fleet (--prefill, --decode). `kvcake up` starts it for a "
                "[vllm] cluster.")  # fmt: skip
    add_program(sub, "netns-up", "kvcake.launch.netns_up:main",
                help="run a cluster with each process on its own network namespace (root)",
                description="The emulated-hosts cluster of `kvcake up --netns`, sized by flags "
                "instead of a cluster file (root: it creates network namespaces).")  # fmt: skip
    add_program(sub, "netns-relay", "kvcake.launch.netns_relay:main",
                help="run a delaying TCP relay (added latency without netem)",
                description="A TCP relay that delays every chunk by --delay-ms per direction; "
                "the netns harness starts one per delayed host.")  # fmt: skip
    for name, prog, target in (
        ("mooncake-master", "mooncake_master", "kvcake.commands._mooncake_master:main"),
        ("mooncake-client", "mooncake_client", "kvcake.compat.mooncake.real_client:main"),
        ("mooncake-transfer-engine-bench", "transfer_engine_bench",
         "kvcake.compat.mooncake.te_bench:main"),
        ("mooncake-metadata-server", "mooncake_http_metadata_server",
         "kvcake.compat.mooncake.http_metadata_server:main"),
    ):  # fmt: skip
        text = _MOONCAKE.format(prog=prog)
        if name == "mooncake-metadata-server":
            text = text.split(" `kvcake mooncake-shim")[0] + " (mooncake.http_metadata_server)"
        add_program(sub, name, target, help=f"Mooncake's {prog}, run on kvcake",
                    description=text, preface=prog != "mooncake_http_metadata_server")  # fmt: skip
