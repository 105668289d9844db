"""Type stubs of the PyO3 extension ``tidegate._native`` (python/src). Internal: use the
``tidegate`` package."""

import asyncio
import contextvars
import os
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

_Path = Union[str, "os.PathLike[str]"]

class Ack:
    """The engine's answer to one tool call."""

    kind: str
    effect: int
    output: Any
    @property
    def held(self) -> bool: ...

class Settled:
    """A settlement: the outcome (as a dict) and the released held effects' return values."""

    outcome: Dict[str, Any]
    released: List[Any]

class ToolHandle:
    name: str
    effect: str

class Completion:
    def finish(self, ok: bool, value: Any) -> None: ...

class Tx:
    @property
    def id(self) -> int: ...
    @property
    def epoch(self) -> int: ...
    @property
    def state(self) -> Optional[str]: ...
    def read(self, scope: str) -> Tuple[int, Any]: ...
    def call(
        self,
        handle: ToolHandle,
        args: Tuple[Any, ...],
        kwargs: Optional[Dict[str, Any]],
        scopes: Sequence[str],
        key: Optional[str] = None,
        call_id: Optional[str] = None,
    ) -> Ack: ...
    def call_async(
        self,
        handle: ToolHandle,
        args: Tuple[Any, ...],
        kwargs: Optional[Dict[str, Any]],
        scopes: Sequence[str],
        key: Optional[str],
        call_id: Optional[str],
        event_loop: asyncio.AbstractEventLoop,
        context: contextvars.Context,
        future: "asyncio.Future[Ack]",
    ) -> None: ...
    def seal(self) -> None: ...
    def commit(self, wait_timeout: Optional[float] = None) -> Settled: ...
    def commit_async(
        self,
        wait_timeout: Optional[float],
        event_loop: asyncio.AbstractEventLoop,
        context: contextvars.Context,
        future: "asyncio.Future[Settled]",
    ) -> None: ...
    def abort(self, reason: str) -> Settled: ...
    def abort_async(
        self,
        reason: str,
        event_loop: asyncio.AbstractEventLoop,
        context: contextvars.Context,
        future: "asyncio.Future[Settled]",
    ) -> None: ...
    def add_hook(self, name: str, hook: Callable[..., Any], is_async: bool = False) -> None: ...

_Aio = Tuple[asyncio.AbstractEventLoop, contextvars.Context, "asyncio.Future[Any]"]

class Plan:
    @property
    def id(self) -> int: ...
    def begin(
        self,
        agent: str = "agent",
        may_touch: Optional[List[str]] = None,
        lease: Optional[float] = None,
        aio: Optional[_Aio] = None,
    ) -> Tx: ...
    def commit(self, aio: Optional[_Aio] = None) -> None: ...
    def fail(self, reason: str, aio: Optional[_Aio] = None) -> None: ...
    def verdict(self, tx: int, effect: int, verdict_: str, aio: Optional[_Aio] = None) -> None: ...
    def resolve(self, choice_: str, aio: Optional[_Aio] = None) -> None: ...
    def arm(self, predicate_: Any, aio: Optional[_Aio] = None) -> None: ...
    def detail(self) -> Dict[str, Any]: ...

class Spec:
    def branches(self) -> List[Tx]: ...
    def commit(self, winner: int) -> Tuple[Settled, List[Dict[str, Any]]]: ...
    def commit_async(
        self,
        winner: int,
        event_loop: asyncio.AbstractEventLoop,
        context: contextvars.Context,
        future: "asyncio.Future[Tuple[Settled, List[Dict[str, Any]]]]",
    ) -> None: ...
    def abort(self, reason: str) -> List[Dict[str, Any]]: ...
    def abort_async(
        self,
        reason: str,
        event_loop: asyncio.AbstractEventLoop,
        context: contextvars.Context,
        future: "asyncio.Future[List[Dict[str, Any]]]",
    ) -> None: ...

class Engine:
    def __init__(
        self,
        data_dir: Optional[_Path] = None,
        lease: float = 30.0,
        first_committer_wins: bool = False,
        retry_attempts: int = 4,
        retry_backoff: float = 0.02,
        level: str = "L4",
        isolation: str = "serializable",
        trace: Optional[_Path] = None,
        scope_types: Sequence[Tuple[str, str, str]] = ...,
    ) -> None: ...
    def tool(
        self,
        name: str,
        effect: str,
        call: Callable[..., Any],
        names: List[str],
        call_async: bool = False,
        compensate: Optional[Callable[..., Any]] = None,
        compensate_async: bool = False,
        probe: Optional[Callable[..., Any]] = None,
        probe_async: bool = False,
        wants_call_id: Tuple[bool, bool, bool] = (False, False, False),
        descriptor: Optional[Dict[str, Any]] = None,
    ) -> ToolHandle: ...
    def capability(self, name: str, handler: Callable[..., Any], is_async: bool = False) -> None: ...
    def plan(
        self,
        owner: str,
        deadline: Optional[float] = None,
        cascade_limit: Optional[int] = None,
        triggers: Sequence[Any] = ...,
        aio: Optional[_Aio] = None,
    ) -> Plan: ...
    def plan_by_id(self, id: int) -> Plan: ...
    def plans(self) -> List[Dict[str, Any]]: ...
    def plan_detail(self, id: int) -> Optional[Dict[str, Any]]: ...
    def stuck_plans(self) -> List[Tuple[int, Dict[str, Any]]]: ...
    def plan_tenant(self) -> str: ...
    def begin(self, agent: str = "agent", may_touch: Optional[List[str]] = None, lease: Optional[float] = None) -> Tx: ...
    def speculate(
        self, branches: int, agent: str = "agent", may_touch: Optional[List[str]] = None, lease: Optional[float] = None
    ) -> Spec: ...
    def recover(self) -> Dict[str, Any]: ...
    def version(self, scope: str) -> int: ...
    def canonical_scope(self, scope: str) -> str: ...
    def stats(self) -> Dict[str, int]: ...
    def settings(self) -> Tuple[str, str]: ...
    def check_integrity(self) -> None: ...
    def add_hook(self, name: str, hook: Callable[..., Any], is_async: bool = False) -> None: ...
    def flush_trace(self) -> None: ...
    def close(self) -> None: ...

def check_json(field: str, value: Any) -> None: ...
def _at_exit() -> int: ...
def _exiting() -> bool: ...
