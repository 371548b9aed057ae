"""Direct prefill -> decode KV through the Transfer Engine (``pd_transport = "te"``).

The decode *pulls*: the prefill keeps a finished P/D request's blocks (vLLM's ``delay_free``)
and answers with ``kv_transfer_params`` naming them (:mod:`.pd_wire`); the decode allocates its
own blocks, reads every layer's blocks straight from the prefill worker's registered KV tensors
into its own (one Transfer Engine batch per request, all layers), then sends a release note.
Why pull and not push: docs/integrations/vllm.md ("P/D through the Transfer Engine").

Scheduler side (:class:`PdScheduler`, pure bookkeeping plus the release inbox) and worker side
(:class:`PdWorker`, the reads) are separate objects; they meet through the step metadata.

Invariants: a prefill block kept for a decode is freed exactly once (release note or lease
end); a decode block is never handed back to vLLM while a read into it may still land (a read
past ``load_timeout_s`` is reported failed at once, but its request's blocks stay held until
the Transfer Engine batch has ended).
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from kvcake.integrations.vllm.pd_wire import (
    Inbox,
    Notifier,
    PdParamsError,
    RemoteKv,
    is_te_decode,
    parse_remote,
    producer_params,
    segment_name,
)


@dataclass
class PullJob:
    """scheduler -> worker: read ``remote_block_ids`` of ``remote`` into ``local_block_ids``."""

    req_id: str
    remote: RemoteKv
    remote_block_ids: list[int]
    local_block_ids: list[int]


@dataclass
class PdStep:
    pulls: list[PullJob] = field(default_factory=list)
    frees: list[str] = field(default_factory=list)  # prefill: requests whose blocks to free
    expired: int = 0  # of ``frees``: freed at the lease's end, not by a release note


@dataclass
class _Expect:
    remote: RemoteKv
    local_tokens: int


class PdScheduler:
    """Scheduler-side state of the direct path. Bounds: one entry per live request."""

    def __init__(
        self, engine_id: str, num_blocks: int, block_tokens: int, lease_s: float,
        log: logging.Logger, produce: bool = True,
    ):  # fmt: skip
        self.engine_id = engine_id
        self.num_blocks = num_blocks
        self.block_tokens = block_tokens
        self.lease_s = lease_s
        self.log = log
        self.inbox = Inbox(log) if produce else None
        self.notifier = Notifier()
        self._leases: dict[str, float] = {}  # prefill: request -> monotonic expiry
        self._expect: dict[str, _Expect] = {}  # decode: parsed params, before allocation
        self._pulls: list[PullJob] = []
        self._pulled: set[str] = set()  # decode: requests the worker reads (held at finish)

    # ---- decode side -----------------------------------------------------------------------

    def match(self, request: Any, local_tokens: int) -> tuple[int, bool] | None:
        """``get_num_new_matched_tokens`` for a te decode request; None for any other."""
        params = request.kv_transfer_params
        if not is_te_decode(params):
            return None
        rid = request.request_id
        try:
            remote = parse_remote(params)
        except PdParamsError as exc:
            self.log.warning("kvcake: %s: %s; the prompt is recomputed", rid, exc)
            params["do_remote_prefill"] = False
            return 0, False
        prompt = len(request.prompt_token_ids or [])
        usable = min(len(remote.block_ids), (prompt - 1) // self.block_tokens)
        count = usable * self.block_tokens - local_tokens
        if count <= 0:  # the local prefix cache has it all: just release the prefill's blocks
            params["do_remote_prefill"] = False
            self.notifier.send(remote.notify, [remote.request_id])
            return 0, False
        self._expect[rid] = _Expect(remote, local_tokens)
        return count, True

    def allocated(self, request: Any, block_ids: list[int], external_tokens: int) -> bool:
        """``update_state_after_alloc``; True when the request was a te decode request."""
        exp = self._expect.pop(request.request_id, None)
        if exp is None:
            return False
        request.kv_transfer_params["do_remote_prefill"] = False  # one pull per request
        first = exp.local_tokens // self.block_tokens
        n = external_tokens // self.block_tokens
        local = list(block_ids[first : first + n])
        remote = list(exp.remote.block_ids[first : first + n])
        if n <= 0 or len(local) != n or len(remote) != n:
            self.notifier.send(exp.remote.notify, [exp.remote.request_id])
            return True
        self._pulls.append(PullJob(request.request_id, exp.remote, remote, local))
        self._pulled.add(request.request_id)
        return True

    # ---- prefill side ----------------------------------------------------------------------

    def produced(self, request: Any, block_ids: list[int]) -> tuple[bool, dict[str, Any]]:
        """``request_finished`` of a P/D prefill request: keep its full prompt blocks."""
        full = min(len(block_ids), len(request.prompt_token_ids or []) // self.block_tokens)
        keep = list(block_ids[:full])
        assert self.inbox is not None
        params = producer_params(
            self.engine_id, request.request_id, keep, self.num_blocks, self.inbox.address
        )
        if not keep:
            return False, params
        self._leases[request.request_id] = time.monotonic() + self.lease_s
        return True, params

    # ---- both ------------------------------------------------------------------------------

    def finished(self, request: Any) -> bool:
        """``request_finished`` of any other request; True: hold its blocks (a read into
        them may still be running; the worker frees them once it has ended)."""
        rid = request.request_id
        exp = self._expect.pop(rid, None)
        if exp is not None:  # aborted before allocation: the prefill need not wait for us
            self.notifier.send(exp.remote.notify, [exp.remote.request_id])
        elif is_te_decode(request.kv_transfer_params):
            # never matched (match() clears do_remote_prefill): vLLM rejected the request
            # before scheduling it (its notify_kv_transfer_request_rejected) or aborted it
            # while it waited: nobody reads the prefill's blocks, release them now
            with contextlib.suppress(PdParamsError):
                remote = parse_remote(request.kv_transfer_params)
                self.notifier.send(remote.notify, [remote.request_id])
        if rid in self._pulled:
            self._pulled.discard(rid)
            return True
        return False

    def step(self) -> PdStep:
        """Pulls to start and prefill blocks to free in this engine step."""
        out = PdStep(pulls=self._pulls)
        self._pulls = []
        if self._leases:
            now = time.monotonic()
            released = self.inbox.drain() if self.inbox is not None else set()
            for rid in [r for r in self._leases if r in released]:
                del self._leases[rid]
                out.frees.append(rid)
            for rid in [r for r, t in self._leases.items() if t <= now]:
                del self._leases[rid]
                out.frees.append(rid)
                out.expired += 1
        elif self.inbox is not None:
            self.inbox.drain()  # late or stray notes for requests already freed
        return out

    def pending(self) -> int:
        return len(self._leases)

    def close(self) -> None:
        if self.inbox is not None:
            self.inbox.close()
        self.notifier.close()


def plane_segments(engine_id: str, rank: int, planes: int) -> list[str]:
    return [segment_name(engine_id, rank, p) for p in range(planes)]
