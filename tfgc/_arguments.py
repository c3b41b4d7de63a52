"""Strict checks of the arguments of compressors, communicators and the
optimizer.

Booleans must be booleans and numbers must be numbers: a string is refused
with the value and the fix, never parsed (`bool("false")` is True, and
`float("0.01")` would accept one spelling where `rank="2"` is refused).
An unknown keyword argument is named with the closest valid one.
"""

from __future__ import annotations

import difflib
import inspect
import math
import numbers
from collections.abc import Callable, Iterable

import numpy as np


def _received(name: str, value) -> str:
    return f"Received: {name}={value!r} (a {type(value).__name__})"


def check_bool(name: str, value, allow_none: bool = False) -> bool | None:
    """Returns `value` as a bool; refuses anything but a bool (or None).

    Raises:
        ValueError: naming the argument, the value and what to pass.
    """
    if value is None and allow_none:
        return None
    if isinstance(value, bool | np.bool_):
        return bool(value)
    fix = "True or False" + (" (or None)" if allow_none else "")
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        fix = f"{name}={value.strip().lower() == 'true'}"
    raise ValueError(
        f"`{name}` must be a bool. {_received(name, value)}. Pass {fix}."
    )


def _string_fix(name: str, value, parse: Callable) -> str:
    """A clause that shows `value` unquoted, if `parse` reads it."""
    if isinstance(value, str):
        try:
            return f" Pass a number, not a string: {name}={parse(value)!r}."
        except ValueError:
            pass
    return ""


def check_int(name: str, value, minimum: int | None = None) -> int:
    """Returns `value` as an int; refuses bools, strings and floats.

    Raises:
        ValueError: naming the argument, the value and the bound.
    """
    ok = isinstance(value, numbers.Integral) and not isinstance(
        value, bool | np.bool_
    )
    if not ok or (minimum is not None and value < minimum):
        bound = "" if minimum is None else f" >= {minimum}"
        raise ValueError(
            f"`{name}` must be an integer{bound}. Received: "
            f"{name}={value!r}.{_string_fix(name, value, int)}"
        )
    return int(value)


def check_number(name: str, value, requirement: str = "a number") -> float:
    """Returns `value` as a float; refuses bools, strings and non-finite
    values.

    Args:
        name: the argument's name, for the message.
        value: what was passed.
        requirement: what the message says `value` must be, e.g.
            "a number in (0, 1]"; the caller checks the range itself.

    Raises:
        ValueError: naming the argument, the value and the fix.
    """
    ok = isinstance(value, numbers.Real) and not isinstance(
        value, bool | np.bool_
    )
    if not ok or not _finite(value):
        raise ValueError(
            f"`{name}` must be {requirement}. Received: {name}={value!r}."
            f"{_string_fix(name, value, float)}"
        )
    return float(value)


def _finite(value: numbers.Real) -> bool:
    """Whether `value` is a finite float (an int too large for a float,
    which Python's float() refuses with OverflowError, is not)."""
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


def keyword_names(function: Callable) -> list[str]:
    """The named keyword arguments `function` takes (not `**kwargs`)."""
    parameters = inspect.signature(function).parameters.values()
    return [
        p.name
        for p in parameters
        if p.name != "self"
        and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]


def unexpected_keyword(
    owner: str, name: str, valid: Iterable[str]
) -> TypeError:
    """The error for an unknown keyword, naming the closest valid one."""
    valid = list(valid)
    close = difflib.get_close_matches(name, valid, n=1)
    hint = (
        f"Did you mean {close[0]!r}?"
        if close
        else f"Valid keyword arguments: {', '.join(valid)}."
    )
    return TypeError(
        f"{owner} got an unexpected keyword argument {name!r}. {hint}"
    )


def check_keywords(owner: str, function: Callable, kwargs) -> None:
    """Raises `unexpected_keyword` for the first keyword in `kwargs` that
    `function` does not take (none if it takes `**kwargs`)."""
    parameters = inspect.signature(function).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return
    valid = keyword_names(function)
    for name in kwargs:
        if name not in valid:
            raise unexpected_keyword(owner, name, valid)
