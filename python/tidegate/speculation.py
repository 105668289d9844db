"""Speculation groups: alternative branches of one decision, of which one commits."""

from __future__ import annotations

import asyncio
import contextvars
from typing import TYPE_CHECKING, Any, Iterator, Optional, Tuple, Union

from .errors import InvalidArgument, PartialCommit, TidegateError
from .outcome import Outcome, SpeculationOutcome, _fill_held
from .transaction import Transaction, _partial_message

if TYPE_CHECKING:
    from .engine import Tidegate

__all__ = ["Speculation"]


class Speculation:
    """A speculation group: alternative branches of one decision, run as transactions sharing
    one epoch. Run work in a branch with ``with spec.branches[i]:`` (entering a branch does not
    commit it), then ``spec.commit(i)``. Leaving the ``with tg.speculate(...)`` block without a
    commit, or with an exception, aborts every branch.

    With asyncio: ``async with tg.speculate(...) as spec:``, ``async with branch:``,
    ``await spec.acommit(i)`` / ``await spec.aabort()``; the loop is never blocked.
    """

    #: The settlement, once a winner committed.
    outcome: Optional[SpeculationOutcome]

    def __init__(self, engine: "Tidegate", native: Any) -> None:
        self._engine = engine
        self._native = native
        #: The branches, one transaction each.
        self.branches: Tuple[Transaction, ...] = tuple(
            Transaction(engine, "branch", None, None, None, native=n, branch=True) for n in native.branches()
        )
        self.outcome = None
        self._aborted: Optional[Tuple[Outcome, ...]] = None

    def __iter__(self) -> Iterator[Transaction]:
        return iter(self.branches)

    def __len__(self) -> int:
        return len(self.branches)

    def _index(self, winner: Union[int, Transaction]) -> int:
        if isinstance(winner, Transaction):
            try:
                return self.branches.index(winner)
            except ValueError:
                raise InvalidArgument(
                    f"invalid `winner` = {winner!r}: expected one of this group's branches",
                    kind="invalid_argument",
                    argument="winner",
                ) from None
        if isinstance(winner, int) and not isinstance(winner, bool):
            index = winner + len(self.branches) if winner < 0 else winner
            if 0 <= index < len(self.branches):
                return index
            raise InvalidArgument(
                f"invalid `winner` = {winner!r}: expected an index below {len(self.branches)}",
                kind="invalid_argument",
                argument="winner",
            )
        raise InvalidArgument(
            f"invalid `winner` = {winner!r}: expected a branch index or a branch",
            kind="invalid_argument",
            argument="winner",
        )

    def _won(self, index: int, result: Any) -> SpeculationOutcome:
        settled, losers = result
        win = Outcome._from_dict(settled.outcome)
        branch = self.branches[index]
        branch.outcome = win
        _fill_held(branch._held, win, list(settled.released))
        lo = tuple(Outcome._from_dict(x) for x in losers)
        self._assign(lo)
        self.outcome = SpeculationOutcome(win, lo)
        if win.partial is not None:
            raise PartialCommit(_partial_message(win), kind="partial_commit", retryable=False, outcome=settled.outcome)
        return self.outcome

    def _assign(self, outcomes: Tuple[Outcome, ...]) -> None:
        by_id = {o.tx: o for o in outcomes}
        for b in self.branches:
            o = by_id.get(b.id)
            if o is not None:
                b.outcome = o

    def _failed(self, index: int, e: TidegateError) -> None:
        if e.outcome is not None:
            self.branches[index].outcome = e.outcome

    def commit(self, winner: Union[int, Transaction]) -> SpeculationOutcome:
        """Chooses ``winner`` (a branch or its index), aborts the other branches (compensating
        what they executed, dropping what they held), then commits the winner."""
        index = self._index(winner)
        try:
            result = self._native.commit(index)
        except TidegateError as e:
            self._failed(index, e)
            raise
        return self._won(index, result)

    async def acommit(self, winner: Union[int, Transaction]) -> SpeculationOutcome:
        """The asyncio form of :meth:`commit`."""
        index = self._index(winner)
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._native.commit_async(index, loop, contextvars.copy_context(), fut)
        try:
            result = await fut
        except TidegateError as e:
            self._failed(index, e)
            raise
        return self._won(index, result)

    def _lost(self, outs: Any) -> Tuple[Outcome, ...]:
        outcomes = tuple(Outcome._from_dict(x) for x in outs)
        self._assign(outcomes)
        self._aborted = outcomes
        return outcomes

    def abort(self, reason: str = "speculation abandoned") -> Tuple[Outcome, ...]:
        """Aborts every branch."""
        return self._lost(self._native.abort(str(reason)))

    async def aabort(self, reason: str = "speculation abandoned") -> Tuple[Outcome, ...]:
        """The asyncio form of :meth:`abort`."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._native.abort_async(str(reason), loop, contextvars.copy_context(), fut)
        return self._lost(await fut)

    def _unsettled(self) -> bool:
        return self.outcome is None and self._aborted is None

    def __enter__(self) -> "Speculation":
        return self

    def __exit__(self, exc_type: Any, exc: Optional[BaseException], tb: Any) -> None:
        if self._unsettled():
            try:
                self.abort("speculation block left without a winner" if exc is None else f"exception: {exc!r}")
            except TidegateError:
                if exc is None:
                    raise

    async def __aenter__(self) -> "Speculation":
        return self

    async def __aexit__(self, exc_type: Any, exc: Optional[BaseException], tb: Any) -> None:
        if self._unsettled():
            try:
                await self.aabort("speculation block left without a winner" if exc is None else f"exception: {exc!r}")
            except TidegateError:
                if exc is None:
                    raise
