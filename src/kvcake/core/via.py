"""A facade's method that is one of its parts' methods, with no wrapper in between."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, overload

P = ParamSpec("P")
R = TypeVar("R")


class Via(Generic[P, R]):
    """``put = Via("_parts.kv", KvOps.put)`` in a facade class: ``facade.put`` is the bound
    ``put`` of the object at ``facade._parts.kv`` when the attribute is read (so a facade may
    swap its parts), with that method's exact signature; mypy sees ``KvOps.put``'s type. On the
    class it is a plain function taking the facade first."""

    def __init__(self, path: str, fn: Callable[Concatenate[Any, P], R]) -> None:
        self.path, self.name = tuple(path.split(".")), fn.__name__
        self._fn = fn

    def __set_name__(self, owner: type, name: str) -> None:
        if name != self.name:  # a method serves under its own name only (no aliasing slips)
            raise TypeError(f"{owner.__name__}.{name} is via {'.'.join(self.path)}.{self.name}")

    def part(self, obj: Any) -> Any:
        for attr in self.path:
            obj = getattr(obj, attr)
        return obj

    @overload
    def __get__(self, obj: None, owner: type) -> Callable[Concatenate[Any, P], R]: ...
    @overload
    def __get__(self, obj: object, owner: type | None = None) -> Callable[P, R]: ...
    def __get__(self, obj: Any, owner: Any = None) -> Any:
        if obj is None:
            return self._unbound()
        return getattr(self.part(obj), self.name)

    def _unbound(self) -> Callable[..., R]:
        @functools.wraps(self._fn)
        def call(facade: Any, *args: Any, **kwargs: Any) -> R:
            method: Callable[..., R] = getattr(self.part(facade), self.name)
            return method(*args, **kwargs)

        return call
