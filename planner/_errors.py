"""The planner's one exception for bad input: the field (dotted path) and the rule with its numbers."""

import math
from decimal import Decimal


class SpecError(ValueError):
    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.rule = message


def shown(value) -> str:
    """A value as the request wrote it, for a message: JSON's null, true and false; a string quoted."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    return repr(value) if isinstance(value, str) else str(value)


GOT_TEXT = 40  # characters of a string input repeated in a message; a longer one is said by its length


def got(value) -> str:
    """The value a schema rule refused, as a message says it: short, JSON's words, numbers positional (never
    scientific notation: 1e-07 is 0.0000001) unless that is longer than GOT_TEXT."""
    if value is None or isinstance(value, bool):
        return shown(value)
    if isinstance(value, int):
        text = str(value) if abs(value) < 10**GOT_TEXT else ""
        return text or f"an integer of {len(str(abs(value)))} digits"
    if isinstance(value, float):
        if not math.isfinite(value):
            return repr(value)
        text = format(Decimal(repr(value)), "f")
        return text if len(text) <= GOT_TEXT else repr(value)
    if isinstance(value, str):
        return shown(value) if len(value) <= GOT_TEXT else f"a string of {len(value):,} characters"
    if isinstance(value, list | tuple):
        return f"a list of {len(value):,} item{'s' * (len(value) != 1)}"
    if isinstance(value, dict):
        return f"an object of {len(value):,} key{'s' * (len(value) != 1)}"
    return type(value).__name__


def one_of(field: str, value, choices) -> None:
    """``value`` must be one of ``choices`` (a field holding one of a fixed set of names)."""
    if value not in choices:
        raise SpecError(field, f"must be one of {', '.join(choices)}, got {value!r}")


def at_least_one(field: str, value: int) -> None:
    if value < 1:
        raise SpecError(field, f"must be >= 1, got {value}")
