"""The planner's one exception for bad input: the field (dotted path) and the rule with its numbers."""


class SpecError(ValueError):
    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.rule = message


def one_of(field: str, value, choices) -> None:
    """``value`` must be one of ``choices`` (a field holding one of a fixed set of names)."""
    if value not in choices:
        raise SpecError(field, f"must be one of {', '.join(choices)}, got {value!r}")


def at_least_one(field: str, value: int) -> None:
    if value < 1:
        raise SpecError(field, f"must be >= 1, got {value}")
