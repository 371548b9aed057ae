"""Shared pieces of the experiments: context (workloads, output directory), result record
(table + JSON + PNG), and a small process pool for independent simulations."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from kvcake.core.costmodel import DEFAULT_PRESET, preset
from kvcake.core.errors import TraceError
from kvcake.core.trace import TraceRecord
from kvcake.sim.config import SimConfig
from kvcake.sim.metrics import SimResult
from kvcake.sim.runner import Observer, simulate
from kvcake.sim.traces import ideal_prefill_s, load_workload

if TYPE_CHECKING:  # matplotlib is the optional "sim" extra, imported when a figure is drawn
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

T = TypeVar("T")
R = TypeVar("R")
_WORKLOADS: dict[str, tuple[str, list[TraceRecord]]] = {}


def workload(spec: str) -> tuple[str, list[TraceRecord]]:
    """Loaded once per process (experiments reuse traces). Raises ``TraceError`` for an
    empty trace or one whose requests all share one timestamp (no rate to replay)."""
    if spec not in _WORKLOADS:
        name, recs = load_workload(spec)
        if not recs:
            raise TraceError(f"--trace {spec}: the trace has no requests")
        ts = [r.timestamp_ms for r in recs]
        if max(ts) <= min(ts):
            raise TraceError(
                f"--trace {spec}: all {len(recs)} requests have the same timestamp "
                "(zero time span): the experiments need a request rate"
            )
        _WORKLOADS[spec] = (name, recs)
    return _WORKLOADS[spec]


def span_s(spec: str) -> float:
    ts = [r.timestamp_ms for r in workload(spec)[1]]
    return (max(ts) - min(ts)) / 1000.0


def decode_step_s(spec: str, preset_name: str = DEFAULT_PRESET) -> float:
    """The uncontended decode step: one sequence at the trace's median context (prompt + half
    the output), on the cost model. The SLO rules of the experiments are multiples of it."""
    recs = workload(spec)[1]
    ctx = float(np.median([r.input_length + r.output_length / 2 for r in recs]))
    return preset(preset_name).decode_step_time(1, int(ctx))


def fill_speed(spec: str, nodes: int, preset_name: str = DEFAULT_PRESET) -> float:
    """The replay speed at which the trace's prefill work, with every block seen before
    reused for free (a lower bound), would keep ``nodes`` prefill instances busy."""
    work = ideal_prefill_s(workload(spec)[1], preset(preset_name))
    return nodes * span_s(spec) / max(work, 1e-12)


def run(spec: str, cfg: SimConfig, observers: Sequence[Observer] = ()) -> SimResult:
    """Replay workload ``spec`` (a trace path or synth preset) on the cluster ``cfg``."""
    return simulate(workload(spec)[1], cfg, observers=observers)


@dataclass
class Context:
    traces: list[str]  # the conversation trace path(s) given on the command line
    out_dir: Path
    jobs: int = 1
    quick: bool = False  # smaller grids (tests, smoke runs)
    cache_model: str = "paper"  # cache-capacity: "paper" or "block-lru" (see cache.py)

    @property
    def main_trace(self) -> str:
        return self.traces[0]


@dataclass
class ExpResult:
    name: str
    title: str
    columns: list[str]
    rows: list[list[Any]]  # JSON cells (ExpResult.load reads them back)
    data: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    png: str = ""
    wall_s: float = 0.0
    quick: bool = False  # run with the --quick grids
    trace: str = ""  # display name of the main trace

    def save(self, out_dir: Path) -> Path:
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / f"{self.name}.json"
        doc = {
            "name": self.name,
            "title": self.title,
            "columns": self.columns,
            "rows": self.rows,
            "data": self.data,
            "notes": self.notes,
            "png": self.png,
            "wall_s": self.wall_s,
            "quick": self.quick,
            "trace": self.trace,
        }
        path.write_text(json.dumps(doc, indent=1, default=_jsonable) + "\n")
        return path

    def with_figure(self, fig: Figure, out_dir: Path) -> ExpResult:
        """Save ``fig`` as ``out_dir/NAME.png`` and record it; returns self."""
        self.png = save_figure(fig, out_dir, self.name)
        return self

    @classmethod
    def load(cls, path: Path) -> ExpResult:
        doc = json.loads(path.read_text())
        return cls(**doc)


def _jsonable(o: object) -> object:
    if hasattr(o, "tolist"):
        return o.tolist()
    return str(o)


def fmt(v: object) -> str:
    if isinstance(v, float):
        if v != v:
            return "-"
        return f"{v:,.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def pmap(fn: Callable[[T], R], items: Sequence[T], jobs: int) -> list[R]:
    """Map over independent simulations, in ``jobs`` processes when > 1 (fork keeps the
    loaded traces)."""
    if jobs <= 1 or len(items) <= 1 or os.name != "posix":
        return [fn(x) for x in items]

    with ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("fork")) as ex:
        return list(ex.map(fn, items))


def new_figure(
    ncols: int = 1, width: float = 7.0, height: float = 4.5
) -> tuple[Figure, list[Axes]]:
    # lazy: optional dependency (matplotlib)
    import matplotlib

    matplotlib.use("Agg")
    # lazy: optional dependency (matplotlib)
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, ncols, figsize=(width * ncols, height), squeeze=False)
    return fig, list(axes[0])


def save_figure(fig: Figure, out_dir: Path, name: str) -> str:
    # lazy: optional dependency (matplotlib)
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path.name
