"""Type checks of plain values read from YAML, JSON, a checkpoint or the command line.

One definition each, in the lowest layer, so a scenario schema, a rule family and the
checkpoint reader mean the same thing by the same word:

- :func:`is_int`: a whole number, and not a bool (``True`` is an ``int`` to Python, never to a
  config).
- :func:`is_number`: an int or a float, not a bool; it may be NaN or infinite.
- :func:`is_finite_number`: a number that converts to a finite float (a 400-digit int does not:
  ``float()`` overflows).
"""

from __future__ import annotations

import math

__all__ = ["is_finite_number", "is_int", "is_number"]


def is_int(value: object) -> bool:
    """A whole number that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> bool:
    """An int or a float that is not a bool (NaN and infinities included)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_finite_number(value: object) -> bool:
    """A number (:func:`is_number`) that converts to a finite float."""
    if not is_number(value):
        return False
    try:
        return math.isfinite(float(value))  # type: ignore[arg-type]
    except OverflowError:
        return False
