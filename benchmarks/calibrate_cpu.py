"""Measure the calibrated CPU preset (``core.costmodel``: ``smollm2-135m/cpu-calibrated``).

``kvcake calibrate --backend torch --threads 1`` with one change: every timing is the computing
thread's CPU time (``time.thread_time``) instead of wall time. With one torch thread the forward
pass runs on the calling thread, so its CPU time is the wall time it would take on an idle core;
on a shared machine (the 2-core VM with other work running) the wall clock would measure the
other work too. Prints the fitted coefficients as a preset entry and writes the calibration file.

    python benchmarks/calibrate_cpu.py [--out cpu-calibration.json] [--repeats 2]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", default="cpu-calibration.json")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args(argv)
    from dataclasses import replace

    import kvcake.engine.calibrate as cal
    from kvcake.core.costmodel import save_calibration
    from kvcake.engine.config import EngineConfig
    from kvcake.engine.torch_backend import TorchBackend

    class _CpuClock:  # the module's ``time``, with the thread's CPU clock as perf_counter
        perf_counter = staticmethod(time.thread_time)

    cal.time = _CpuClock  # type: ignore[assignment]
    be = TorchBackend(EngineConfig(num_kv_blocks=96, threads=1))
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    cm = cal.calibrate(be, replace(cal.TORCH_GRID, repeats=args.repeats),
                       be.model_config.vocab, progress=print)  # fmt: skip
    save_calibration(cm, args.out)
    p, d = cm.prefill, cm.decode
    print(f"PrefillCoefficients({p.c0:.4g}, {p.c1:.4g}, {p.c2:.4g})")
    print(f"DecodeCoefficients({d.d0:.4g}, {d.d1:.4g}, {d.d2:.4g})")
    print(f"fit error: prefill {cm.fit_error['prefill']:.1%}, decode {cm.fit_error['decode']:.1%}")
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} CPUs, load "
          f"average {load:.1f} at the start; {time.perf_counter() - t0:.0f} s wall; wrote {args.out}")  # fmt: skip
    be.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
