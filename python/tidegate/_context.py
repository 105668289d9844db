"""Process-wide state: the transaction and the plan of the innermost ``with`` blocks (context
variables, so threads and asyncio tasks each see their own) and the default engine (internal)."""

from __future__ import annotations

import contextvars
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from .engine import Tidegate
    from .plans import Plan
    from .transaction import Transaction

current: "contextvars.ContextVar[Optional[Transaction]]" = contextvars.ContextVar("tidegate_tx", default=None)
default: "Optional[Tidegate]" = None
plan: "contextvars.ContextVar[Optional[Plan]]" = contextvars.ContextVar("tidegate_plan", default=None)
