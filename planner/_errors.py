"""The planner's one exception for bad input: the field (dotted path) and the rule with its numbers."""


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


def one_of(field: str, value, choices) -> None:
    """``value`` must be one of ``choices`` (a field holding one of a fixed set of names)."""
    if value not in choices:
        raise SpecError(field, f"must be one of {', '.join(choices)}, got {value!r}")


def at_least_one(field: str, value: int) -> None:
    if value < 1:
        raise SpecError(field, f"must be >= 1, got {value}")
