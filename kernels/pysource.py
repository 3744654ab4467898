"""Python source parsed into an AST from any thread.

CPython 3.11 and 3.12 keep the AST constructor's recursion depth in state that the threads of
one interpreter share: two threads parsing at once (evaluations in flight in `kernels tune`
each run the static checks) can make one of them fail with `SystemError: AST constructor
recursion depth mismatch` on valid source. Every parse here goes through one lock; parsing a
candidate takes milliseconds.
"""

from __future__ import annotations

import ast
import threading

_LOCK = threading.Lock()


def parse(source: str, filename: str = "<unknown>", mode: str = "exec") -> ast.AST:
    """`ast.parse`, one thread at a time."""
    with _LOCK:
        return ast.parse(source, filename=filename, mode=mode)
