"""Where the master's state reports what a mutation changed (the HA journal's hook).

The parts of :class:`~kvcake.store.master_state.MasterState` call :class:`Changes` at each
mutation point, with the state lock held, naming the object key or segment name they touched.
The base class forgets the marks (a master without an operation log);
:class:`kvcake.store.ha.journal.Journal` keeps them until they are logged.
"""

from __future__ import annotations


class Changes:
    """Receives change marks; called with the state lock held. Must not call the state back."""

    def object(self, key: str) -> None:
        """The object ``key`` changed (its record must be logged again)."""

    def segment(self, name: str) -> None:
        """The segment ``name`` was mounted or dropped, or its ranges in the writer's grace
        changed."""

    def writing(self, key: str, size: int) -> None:
        """A put of ``key`` (``size`` bytes) was given ranges (a ``PutStart``): its record, the
        hold on those ranges, must be logged, but its reply waits for that only when the
        request's puts are large (a copy that may still run when a new leader takes over)."""
