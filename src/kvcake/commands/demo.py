"""``kvcake demo`` (``make demo``): the live system in a few minutes.

1. Start the default cluster (``configs/cluster.toml``: master + store-server + 1 prefill +
   1 decode instance running the real SmolLM2-135M + the proxy) and hold a short multi-turn
   conversation through the OpenAI endpoint, printing each answer with its TTFT and how many
   prompt tokens came from the KV cache (later turns reuse earlier turns' KV).
2. Start an emulated-backend cluster (``configs/emulated.toml``) and replay a slice of the
   bundled Mooncake trace sample against it; print the summary.
Both clusters are real processes and are stopped at the end (or on Ctrl-C).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

from rich.console import Console

from kvcake.core.trace import read_trace, scale_time
from kvcake.data import sample_trace_path
from kvcake.replay.cli import print_summary
from kvcake.serve.config import default_cluster_file

QUESTIONS = (
    "What is the capital of France?",
    "What is a famous museum there?",
    "Name one painting that hangs in it.",
)


def register(sub: Any) -> None:
    p = sub.add_parser(
        "demo",
        help="start a local cluster, chat with the real model, replay a trace slice",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", help="real-model cluster TOML (default: configs/cluster.toml)")
    p.add_argument("--emulated-config", help="default: configs/emulated.toml")
    p.add_argument("--requests", type=int, default=40, help="trace requests to replay")
    p.add_argument("--speedup", type=float, default=0.5, help="trace replay speed")
    p.add_argument("--max-tokens", type=int, default=96, help="answer length per turn")
    p.add_argument(
        "--think-s",
        type=float,
        default=1.0,
        help="pause between turns, as a user reading the answer (the decode instance puts "
        "the answer's KV blocks into the pool asynchronously; the proxy sees them at its next "
        "poll, so a next turn sent within ~0.2 s reuses only the earlier prompt's blocks)",
    )
    p.set_defaults(func=_run)


def _chat_turn(url: str, messages: list[dict[str, str]], max_tokens: int) -> dict[str, Any]:
    # lazy: CLI start-up
    import httpx

    body = {
        "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
        "stream_options": {"include_usage": True},
    }  # fmt: skip
    t0 = time.perf_counter()
    ttft: float | None = None
    text: list[str] = []
    usage: dict[str, Any] = {}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=600) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {r.read().decode()[:300]}")
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            doc = json.loads(line[6:])
            if "error" in doc:
                raise RuntimeError(doc["error"]["message"])
            usage = doc.get("usage") or usage
            for ch in doc.get("choices", []):
                piece = ch.get("delta", {}).get("content")
                if piece:
                    ttft = ttft if ttft is not None else time.perf_counter() - t0
                    text.append(piece)
                    print(piece, end="", flush=True)
    print()
    return {"text": "".join(text), "ttft": ttft or 0.0, "usage": usage}


def _conversation(args: argparse.Namespace) -> None:
    # lazy: CLI start-up
    from kvcake.launch.launcher import Cluster, load_serve_file

    console = Console()
    conf = load_serve_file(args.config or default_cluster_file(), {"cluster": {"proxy_port": 0}})
    console.rule("[bold]1. a conversation with SmolLM2-135M on a disaggregated cluster")
    cluster = Cluster(conf, quiet=True)
    with console.status(f"starting master, store, prefill, decode, proxy (logs {cluster.run_dir})"):
        cluster.start()
    with cluster:
        console.print(f"OpenAI endpoint: [bold]{cluster.url}/v1[/]")
        messages: list[dict[str, str]] = []
        for q in QUESTIONS:
            messages.append({"role": "user", "content": q})
            console.print(f"\n[bold cyan]user:[/] {q}\n[bold green]assistant:[/] ", end="")
            ans = _chat_turn(cluster.url, messages, args.max_tokens)
            use = ans["usage"]
            cached = use.get("prompt_tokens_details", {}).get("cached_tokens", 0)
            console.print(
                f"[dim]TTFT {ans['ttft'] * 1000:.0f} ms; prefix-cache hit {cached} of "
                f"{use.get('prompt_tokens', 0)} prompt tokens[/]"
            )
            messages.append({"role": "assistant", "content": ans["text"]})
            time.sleep(args.think_s)
        console.print("\nstopping the cluster...")


def _replay(args: argparse.Namespace) -> dict[str, Any]:
    # lazy: CLI start-up
    from rich.progress import Progress

    from kvcake.launch.launcher import Cluster, load_serve_file
    from kvcake.replay.runner import ReplayOptions, RequestRecord, run_replay

    console = Console()
    path = args.emulated_config or default_cluster_file().with_name("emulated.toml")
    conf = load_serve_file(path)
    console.rule("[bold]2. replaying the Mooncake trace sample on an emulated cluster")
    recs = scale_time(read_trace(sample_trace_path(), limit=args.requests), args.speedup)
    cluster = Cluster(conf, quiet=True)
    with console.status(f"starting the emulated cluster (logs {cluster.run_dir})"):
        cluster.start()
    with cluster, Progress(console=console) as bar:
        task = bar.add_task(f"replaying {len(recs)} requests", total=len(recs))

        def done(_: RequestRecord) -> None:
            bar.update(task, advance=1)

        opts = ReplayOptions(
            url=cluster.url, tokens_per_block=512, max_context=conf.instance.max_context,
            ttft_slo_s=conf.proxy.conductor.ttft_slo_s,
            tbt_slo_s=conf.proxy.conductor.tbt_slo_s, max_output=128,
        )  # fmt: skip
        summary = asyncio.run(run_replay(recs, opts, done))
    keys = ("requests", "completed", "rejected", "errors", "dropped", "ttft_p50", "ttft_p99",
            "tbt_p50", "tbt_p99", "prefix_hit_rate", "effective_capacity")  # fmt: skip
    d = summary.as_dict()
    print_summary(console, {k: d[k] for k in keys}, "trace replay (emulated LLaMA3-70B)")
    return d


def _run(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    _conversation(args)
    d = _replay(args)
    Console().print(
        f"\n[bold]demo done[/] in {time.monotonic() - t0:.0f} s: SmolLM2-135M answered "
        f"{len(QUESTIONS)} turns on a prefill/decode cluster (later turns reused earlier turns' "
        f"KV), and {d['completed']} of {d['requests']} Mooncake-trace requests ran on an "
        "emulated LLaMA3-70B cluster.\n[bold]next:[/] `.venv/bin/kvcake up` starts the cluster "
        "and leaves it running (then `kvcake status`, `kvcake top`, http://127.0.0.1:8000/"
        "dashboard, `kvcake logs`); `kvcake --help` lists everything; README.md has a tour."
    )
    return 0
