"""Client load for the fault suite: threads sending a mix of streaming and non-streaming
completions (shared prompt prefixes, so KV is reused, pooled and fetched), each with a client
timeout, recording what every request got."""

from __future__ import annotations

import json
import random
import threading
import time
from dataclasses import dataclass, field

import httpx

BLOCK = 32
PREFIXES = [[1000 + 64 * k + i for i in range(8 * BLOCK)] for k in range(3)]
SUFFIX = 16
MAX_TOKENS = 12
CLIENT_TIMEOUT_S = 20.0
CLEAR_HTTP_ERRORS = {429, 500, 502, 503, 504}


@dataclass
class Result:
    kind: str  # "ok" | "http_error" | "sse_error" | "conn_error" | "timeout" | "wrong"
    seconds: float
    detail: str = ""
    text: str = ""
    tokens: tuple[int, ...] | None = None  # non-streaming answers carry their token ids
    end: float = field(default_factory=time.monotonic)


@dataclass
class Load:
    url: str
    threads: int = 4
    seed: int = 0
    results: list[Result] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _workers: list[threading.Thread] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> None:
        for i in range(self.threads):
            t = threading.Thread(target=self._run, args=(self.seed * 100 + i,), daemon=True)
            t.start()
            self._workers.append(t)

    def stop(self) -> list[Result]:
        self._stop.set()
        for t in self._workers:
            t.join(CLIENT_TIMEOUT_S + 10)
        assert not any(t.is_alive() for t in self._workers), "a client thread hangs"
        return list(self.results)

    def _run(self, seed: int) -> None:
        rng = random.Random(seed)
        with httpx.Client(base_url=self.url, timeout=CLIENT_TIMEOUT_S) as http:
            n = 0
            while not self._stop.is_set():
                n += 1
                prompt = rng.choice(PREFIXES) + [20000 + (seed * 997 + n) % 10000] * SUFFIX
                res = one(http, prompt, stream=rng.random() < 0.5)
                with self.lock:
                    self.results.append(res)
                if res.kind != "ok":
                    time.sleep(0.1)  # a client backs off after an error


def one(http: httpx.Client, prompt: list[int], stream: bool) -> Result:
    body = {"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "stream": stream}
    t0 = time.monotonic()
    try:
        if stream:
            return _stream(http, body, t0)
        r = http.post("/v1/completions", json=body)
        if r.status_code != 200:
            return _http_error(r.status_code, r.text, t0)
        doc = r.json()
        ids = tuple(doc["kvcake"]["token_ids"])
        return Result("ok", time.monotonic() - t0, text=doc["choices"][0]["text"], tokens=ids)
    except httpx.TimeoutException as exc:
        return Result("timeout", time.monotonic() - t0, repr(exc))
    except httpx.TransportError as exc:  # refused, reset, cut mid-body
        return Result("conn_error", time.monotonic() - t0, repr(exc))


def _http_error(code: int, text: str, t0: float) -> Result:
    try:
        msg = json.loads(text)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return Result(
            "wrong", time.monotonic() - t0, f"HTTP {code} without a JSON error: {text[:200]}"
        )
    kind = "http_error" if code in CLEAR_HTTP_ERRORS else "wrong"
    return Result(kind, time.monotonic() - t0, f"HTTP {code}: {msg}")


def _stream(http: httpx.Client, body: dict, t0: float) -> Result:
    with http.stream("POST", "/v1/completions", json=body) as r:
        if r.status_code != 200:
            return _http_error(r.status_code, r.read().decode(errors="replace"), t0)
        text, done, err = [], False, ""
        for line in r.iter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: {"):
                doc = json.loads(line[6:])
                if "error" in doc:
                    err = doc["error"]["message"]
                else:
                    text.append(doc["choices"][0]["text"])
        if err:
            return Result("sse_error", time.monotonic() - t0, err)
        if not done:
            return Result("conn_error", time.monotonic() - t0, "stream ended without [DONE]")
        return Result("ok", time.monotonic() - t0, text="".join(text))
