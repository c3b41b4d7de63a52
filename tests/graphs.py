"""What a traced graph orders, for tests that read it."""

from __future__ import annotations


def ancestors(op) -> set:
    """Every op that `op` waits for, directly or not, through data and
    control edges."""
    seen, todo = set(), [op]
    while todo:
        current = todo.pop()
        for up in [t.op for t in current.inputs] + list(current.control_inputs):
            if up not in seen:
                seen.add(up)
                todo.append(up)
    return seen
