"""Token ids -> text, incrementally, with OpenAI ``stop`` strings: the one place the proxy turns
a token stream into the text it sends (streaming and not).

Each token is decoded over a small window (vLLM's prefix/read offsets), so a step costs the same
at token 10 and token 10,000, and a character split over several tokens (UTF-8 bytes, byte-level
BPE) is sent once it is complete. Text that could be the start of a stop string is held back until
it is known not to be; when a stop string appears, everything from its first character on is
dropped and the stream is over (``finish_reason`` ``stop``; the token that completed it counts in
``completion_tokens``, as in vLLM).
"""

from __future__ import annotations

from collections.abc import Iterable

from kvcake.proxy.textcodec import TextCodec

# A complete UTF-8 character spans at most 4 byte tokens; a window still ending in U+FFFD after
# this many tokens holds bytes that will never be valid, and is sent as U+FFFD.
_MAX_PENDING_TOKENS = 6
_REPLACEMENT = "\ufffd"


class Detokenizer:
    """Invariant: ``emitted`` + held-back text == decode(``ids``) up to the stop (if any);
    ``ids`` holds every token consumed, none after the one that completed a stop string."""

    def __init__(self, codec: TextCodec, stop: tuple[str, ...] = ()):
        if any(not s for s in stop):
            raise ValueError("stop strings must be non-empty")
        self.codec = codec
        self.stop = stop
        self.ids: list[int] = []
        self.stopped = False
        self.emitted: list[str] = []
        self._prefix = 0  # ids[_prefix:_read] were decoded already (context for the next token)
        self._read = 0
        self._held = ""  # decoded, not sent: may be the start of a stop string

    @property
    def text(self) -> str:
        return "".join(self.emitted)

    def feed(self, tokens: Iterable[int]) -> str:
        """Consume tokens; return the text that is now safe to send (possibly "")."""
        out = []
        for t in tokens:
            if self.stopped:
                break
            self.ids.append(t)
            out.append(self._release(self._step(final=False)))
        return "".join(out)

    def finish(self) -> str:
        """The stream ended (EOS, length, error): release everything still held back."""
        if self.stopped:
            return ""
        piece = self._release(self._step(final=True))
        rest, self._held = self._held, ""
        self.emitted.append(rest)
        return piece + rest

    def _step(self, final: bool) -> str:
        """The text the newest token(s) completed."""
        if self._read == len(self.ids):
            return ""
        ctx = self.codec.decode(self.ids[self._prefix : self._read])
        full = self.codec.decode(self.ids[self._prefix :])
        waiting = len(self.ids) - self._read < _MAX_PENDING_TOKENS
        if not final and waiting and (full.endswith(_REPLACEMENT) or len(full) <= len(ctx)):
            return ""  # an incomplete character (or nothing visible yet): wait for more
        self._prefix, self._read = self._read, len(self.ids)
        return full[len(ctx) :]

    def _release(self, new: str) -> str:
        if not new and not self._held:
            return ""
        text = self._held + new
        cut = self._first_stop(text)
        if cut is not None:
            self.stopped = True
            self._held = ""
            self.emitted.append(text[:cut])
            return text[:cut]
        keep = self._stop_prefix_len(text)
        send, self._held = text[: len(text) - keep], text[len(text) - keep :]
        self.emitted.append(send)
        return send

    def _first_stop(self, text: str) -> int | None:
        hits = [i for i in (text.find(s) for s in self.stop) if i >= 0]
        return min(hits) if hits else None

    def _stop_prefix_len(self, text: str) -> int:
        """Length of the longest suffix of ``text`` that is a proper prefix of a stop string."""
        best = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:n]):
                    best = n
                    break
        return best
