"""The exception hierarchy. Every error raised across a kvcake API boundary derives from
:class:`KvcakeError`, so callers can catch one type; subclasses say which layer failed."""

from __future__ import annotations


class KvcakeError(Exception):
    """Base class of all kvcake errors."""


class ConfigError(KvcakeError, ValueError):
    """A configuration value is missing, malformed or out of range. The message names the key
    and says what to change."""


class FramingError(KvcakeError):
    """A wire frame could not be decoded."""


class MalformedFrame(FramingError):
    """Bad magic, unknown version, or a body that does not decode to a known message."""


class TruncatedFrame(FramingError):
    """The stream ended in the middle of a frame."""


class FrameTooLarge(FramingError):
    """A frame announces more bytes than the receiver accepts."""


class TraceError(KvcakeError, ValueError):
    """A trace file line is malformed. ``line`` is 1-based; ``field`` names the bad field."""

    def __init__(self, message: str, *, line: int | None = None, field: str | None = None):
        where = []
        if line is not None:
            where.append(f"line {line}")
        if field is not None:
            where.append(f"field {field!r}")
        prefix = f"{', '.join(where)}: " if where else ""
        super().__init__(prefix + message)
        self.line = line
        self.field = field


class TransferError(KvcakeError):
    """A transfer request failed (unknown segment, out-of-range offset, no path left)."""


class StoreError(KvcakeError):
    """A store operation failed; ``code`` is the Mooncake-compatible error code."""

    def __init__(self, message: str, code: int = -1):
        super().__init__(message)
        self.code = code


class EngineError(KvcakeError):
    """The inference engine cannot serve a request (model missing, context too long...)."""


class SchedulingError(KvcakeError):
    """The conductor was given an inconsistent snapshot."""
