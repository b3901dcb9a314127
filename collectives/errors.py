"""The errors collectives raise, and the internal deadline signal the
backends pass to the group's bookkeeping."""
from __future__ import annotations
from collections.abc import Iterable


class CollectiveError(RuntimeError):
    """Base of every error a collective raises for a distributed reason."""


class CollectiveTimeoutError(CollectiveError):
    """Peers did not arrive in time. Attributes: op, group, seq, missing
    (group ranks that did not arrive), statuses (rank -> text)."""

    def __init__(self, msg: str, op: str | None = None,
                 group: str | None = None, seq: int | None = None,
                 missing: Iterable[int] = (),
                 statuses: dict[int, str] | None = None) -> None:
        super().__init__(msg)
        self.op, self.group, self.seq = op, group, seq
        self.missing = list(missing)
        self.statuses = statuses or {}


class CollectiveMismatchError(CollectiveError):
    """Ranks called different collectives, shapes or dtypes (debug mode)."""

    def __init__(self, msg: str, rank: int | None = None) -> None:
        super().__init__(msg)
        self.rank = rank


class RankFailureError(CollectiveError):
    """A peer failed or died (thread raised, socket closed)."""

    def __init__(self, msg: str, rank: int | None = None) -> None:
        super().__init__(msg)
        self.rank = rank


class _Expired(Exception):
    """Internal: a backend's wait hit its deadline. missing = group ranks
    known not to have arrived (None when the backend cannot tell)."""

    def __init__(self, missing=None):
        super().__init__(missing)
        self.missing = missing
