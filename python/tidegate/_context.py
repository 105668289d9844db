"""Process-wide state: the transaction of the innermost ``with`` block (a context variable,
so threads and asyncio tasks each see their own) and the default engine (internal)."""

from __future__ import annotations

import contextvars
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from .engine import Tidegate
    from .transaction import Transaction

current: "contextvars.ContextVar[Optional[Transaction]]" = contextvars.ContextVar("tidegate_tx", default=None)
default: "Optional[Tidegate]" = None
