"""``kvcake generate`` (offline generation with the real model) and ``kvcake calibrate``
(profile a backend and write fitted cost-model coefficients)."""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from typing import Any

from kvcake.core.api import SamplingParams
from kvcake.core.config import load_config
from kvcake.core.costmodel import save_calibration
from kvcake.core.errors import ConfigError


def register(sub: Any) -> None:
    g = sub.add_parser(
        "generate",
        help="generate text with the local model (SmolLM2-135M by default)",
        description="Run the engine offline on one prompt and print the answer. The model is "
        "converted from its GGUF once and cached under $KVCAKE_CACHE_DIR or ~/.cache/kvcake.",
    )
    g.add_argument("prompt", help="the prompt text")
    mode = g.add_mutually_exclusive_group()
    mode.add_argument(
        "--chat",
        dest="chat",
        action="store_true",
        default=None,
        help="wrap the prompt as a user chat message (the default when the model has a chat "
        "template, as SmolLM2-Instruct does)",
    )
    mode.add_argument(
        "--raw", dest="chat", action="store_false", help="plain text completion of the prompt"
    )
    g.add_argument("--model", default=None, help="'smollm2', a .gguf file or a checkpoint dir")
    g.add_argument("--config", help="TOML file with an [engine] table")
    g.add_argument("--max-tokens", type=int, default=64)
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--threads", type=int, default=None, help="torch threads (0 = default)")
    g.add_argument("--stats", action="store_true", help="print token counts and timings")
    g.set_defaults(func=_generate)

    c = sub.add_parser(
        "calibrate",
        help="profile a backend and write fitted cost-model coefficients",
        description="Time prefill over (prompt length, prefix length) and decode iterations "
        "over (batch, context), fit core.costmodel coefficients, write them to --out and print "
        "the fit error.",
    )
    c.add_argument("--backend", choices=("torch", "emulated"), default="torch")
    c.add_argument("--out", default="calibration.json", help="file to write (JSON)")
    c.add_argument("--model", default=None, help="torch backend: model to load")
    c.add_argument("--config", help="TOML file with [engine] / [emulated] tables")
    c.add_argument("--threads", type=int, default=None, help="torch threads (0 = default)")
    c.add_argument("--preset", default=None, help="emulated backend: cost-model preset")
    c.add_argument("--time-scale", type=float, default=None, help="emulated backend: time scale")
    c.add_argument("--repeats", type=int, default=None, help="timings per grid point")
    c.set_defaults(func=_calibrate)


def _engine_config(args: argparse.Namespace, num_kv_blocks: int | None = None) -> Any:
    # lazy: CLI start-up
    from kvcake.engine.config import EngineConfig

    over = {"model": args.model, "threads": args.threads, "num_kv_blocks": num_kv_blocks}
    return load_config(EngineConfig, toml_path=args.config, section="engine", overrides=over)


def _generate(args: argparse.Namespace) -> int:
    # lazy: CLI start-up
    from kvcake.engine.llm import LLM

    try:
        sp = SamplingParams(
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            top_p=args.top_p,
            seed=args.seed,
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    t0 = time.perf_counter()
    llm = LLM(config=_engine_config(args))
    loaded = time.perf_counter() - t0
    # An instruct model answers a question only inside its chat template, so chat is the default.
    chat = bool(llm.tokenizer.chat_template) if args.chat is None else args.chat
    prompt: Any = [{"role": "user", "content": args.prompt}] if chat else args.prompt
    out = llm.generate(prompt, sp)[0]
    if out.error:
        print(f"kvcake: error: {out.error}", file=sys.stderr)
        return 1
    print(out.text.strip() if chat else args.prompt + out.text)
    if args.stats:
        print(
            f"[{len(out.prompt_token_ids)} prompt tokens, {len(out.token_ids)} generated, "
            f"finish={out.finish_reason}, load {loaded:.1f}s, TTFT {out.ttft_s * 1000:.0f} ms, "
            f"total {out.latency_s:.2f}s]",
            file=sys.stderr,
        )
    llm.close()
    return 0


def _calibrate(args: argparse.Namespace) -> int:
    # lazy: CLI start-up
    from kvcake.engine.calibrate import EMULATED_GRID, TORCH_GRID, calibrate
    from kvcake.engine.config import EmulatedConfig

    be: Any
    if args.backend == "torch":
        # lazy: CLI start-up
        from kvcake.engine.torch_backend import TorchBackend

        grid = TORCH_GRID
        be = TorchBackend(_engine_config(args, num_kv_blocks=96))
        vocab = be.model_config.vocab
    else:
        # lazy: CLI start-up
        from kvcake.engine.emulated import EmulatedBackend

        grid = EMULATED_GRID
        over = {"preset": args.preset, "time_scale": args.time_scale, "num_kv_blocks": 8192}
        cfg = load_config(EmulatedConfig, toml_path=args.config, section="emulated", overrides=over)
        be = EmulatedBackend(cfg)
        vocab = cfg.vocab_size
    if args.repeats is not None:
        if args.repeats < 1:
            raise ConfigError("--repeats must be >= 1")
        grid = replace(grid, repeats=args.repeats)
    t0 = time.perf_counter()
    cm = calibrate(be, grid, vocab, progress=print)
    save_calibration(cm, args.out)
    p, d = cm.prefill, cm.decode
    print(f"prefill: t = {p.c0:.4g} + {p.c1:.4g}*(L-P) + {p.c2:.4g}*(L^2-P^2)  s")
    print(f"decode:  t = {d.d0:.4g} + {d.d1:.4g}*batch + {d.d2:.4g}*context  s")
    print(
        f"fit error (mean relative): prefill {cm.fit_error['prefill']:.1%}, "
        f"decode {cm.fit_error['decode']:.1%}"
    )
    print(f"wrote {args.out} ({time.perf_counter() - t0:.0f} s)")
    be.close()
    return 0
