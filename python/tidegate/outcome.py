"""What the engine reports back: settlements, reads, held acknowledgements, probe answers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Generic, Mapping, Optional, Tuple, TypeVar

from .errors import WrongState

__all__ = [
    "EffectOutcome",
    "Outcome",
    "ReadResult",
    "RunResult",
    "SpeculationOutcome",
    "Happened",
    "Held",
]

T = TypeVar("T")


@dataclass(frozen=True)
class EffectOutcome:
    """How one effect settled.

    ``tag`` is ``"clean"`` (settled as intended), ``"leaked"`` (an irreversible effect left
    before the abort), ``"unresolved"`` (an operator must look: failed or missing compensation,
    residue, unknown outcome) or ``"partial-commit"``. ``disposition`` says what happened:
    ``accepted``, ``applied``, ``fired``, ``discarded``, ``compensated``, ``compensation_failed``,
    ``not_compensable``, ``release_failed``, ``not_released``, ``unknown``, ``replayed``.
    """

    id: int
    tool: str
    effect: str
    key: str
    disposition: str
    tag: str
    detail: Optional[str] = None


@dataclass(frozen=True)
class Outcome:
    """The settlement of a transaction: committed or not, why, and every effect in issuance
    order with its tag. ``partial`` is set when a commit released only some of its held
    effects (see :class:`~tidegate.PartialCommit`)."""

    tx: int
    epoch: int
    agent: str
    committed: bool
    effects: Tuple[EffectOutcome, ...]
    reason: Optional[Dict[str, Any]] = None
    partial: Optional[Dict[str, Any]] = None

    @classmethod
    def _from_dict(cls, d: Mapping[str, Any]) -> "Outcome":
        # Every settled transaction builds one: the generated `__init__` of a frozen dataclass
        # sets each field through `object.__setattr__`, which made this 2.7 us of a 17 us
        # transaction. Filling `__dict__` directly gives the same objects (fields, equality,
        # hashing and repr are unchanged) in a fraction of the time.
        new = object.__new__
        effects = []
        for e in d.get("effects", ()):
            eo = new(EffectOutcome)
            eo.__dict__.update(
                id=e["id"],
                tool=e["tool"],
                effect=e["class"],
                key=e["key"],
                disposition=e["disposition"],
                tag=e["tag"],
                detail=e.get("detail"),
            )
            effects.append(eo)
        o = new(cls)
        o.__dict__.update(
            tx=d["tx"],
            epoch=d["epoch"],
            agent=d["agent"],
            committed=d["committed"],
            effects=tuple(effects),
            reason=d.get("reason"),
            partial=d.get("partial"),
        )
        return o

    @property
    def is_clean(self) -> bool:
        """Whether every effect settled ``clean``."""
        return all(e.tag == "clean" for e in self.effects)

    @property
    def residue(self) -> Tuple[EffectOutcome, ...]:
        """Effects whose tag is not ``clean`` (what an operator must look at)."""
        return tuple(e for e in self.effects if e.tag != "clean")

    @property
    def tags(self) -> Dict[int, str]:
        """``{effect id: tag}``."""
        return {e.id: e.tag for e in self.effects}

    @property
    def reason_kind(self) -> Optional[str]:
        """The abort reason's machine name (``"stale_read"``, ``"vetoed"``...), if aborted."""
        if self.reason is None:
            return None
        kind = self.reason.get("kind")
        return kind if isinstance(kind, str) else None

    def effect(self, effect_id: int) -> Optional[EffectOutcome]:
        """The settlement of effect ``effect_id``, if it belongs to this transaction."""
        for e in self.effects:
            if e.id == effect_id:
                return e
        return None


@dataclass(frozen=True)
class ReadResult:
    """A recorded read: the scope's committed ``version`` and, if this transaction staged a
    write to the scope (a bufferable effect), the ``staged`` arguments (read-your-writes)."""

    version: int
    staged: Any = None


@dataclass(frozen=True)
class RunResult(Generic[T]):
    """What :meth:`Tidegate.run` returns: the body's value, the committed outcome, and how
    many attempts it took."""

    value: T
    outcome: Outcome
    attempts: int


@dataclass(frozen=True)
class SpeculationOutcome:
    """The settlement of a speculation group: the winner's outcome and the losers'."""

    winner: Outcome
    losers: Tuple[Outcome, ...]


class Happened:
    """A probe's answer that the call took effect, with its output."""

    __slots__ = ("output",)

    def __init__(self, output: Any = None) -> None:
        self.output = output

    @property
    def _tidegate_happened(self) -> Any:
        return self.output

    def __repr__(self) -> str:
        return f"Happened({self.output!r})"


#: Dispositions of a held effect that ran at commit (its return value was collected).
_RAN = ("applied", "fired", "accepted")


class Held:
    """The acknowledgement of a held effect: ``kind`` is ``"staged"`` (bufferable) or
    ``"queued"`` (gated). The tool has not run; it runs when the transaction commits, after
    which ``result`` holds its return value."""

    __slots__ = ("tool", "effect", "kind", "_result", "_done")

    def __init__(self, tool: str, effect: int, kind: str) -> None:
        self.tool = tool
        self.effect = effect
        self.kind = kind
        self._result: Any = None
        self._done = False

    @property
    def released(self) -> bool:
        """Whether the effect has been released (the tool ran at commit)."""
        return self._done

    @property
    def result(self) -> Any:
        """The tool's return value once released; raises :class:`WrongState` before."""
        if not self._done:
            raise WrongState(
                f"effect {self.effect} of tool `{self.tool}` is {self.kind}; it runs at commit",
                kind="wrong_state",
            )
        return self._result

    def _set(self, result: Any) -> None:
        self._result = result
        self._done = True

    def __repr__(self) -> str:
        state = f"result={self._result!r}" if self._done else self.kind
        return f"<Held {self.tool}#{self.effect} {state}>"


def _ran(held: "list[Held]", outcome: Outcome) -> "list[Held]":
    """The held acknowledgements whose effect ran at commit (its tool returned a value), in
    issuance order."""
    ran = []
    for h in held:
        e = outcome.effect(h.effect)
        if e is not None and e.disposition in _RAN:
            ran.append(h)
    return ran


def _fill_held(held: "list[Held]", outcome: Outcome, released: "list[Any]") -> None:
    """Gives each held acknowledgement the value its tool returned at commit. ``released``
    holds the return values of the held effects that ran, in issuance order."""
    for h, value in zip(_ran(held, outcome), released):
        h._set(value)
