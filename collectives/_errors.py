"""The one exception the collectives package raises for bad input."""


class CollectiveError(ValueError):
    """Bad input to a collective: names the argument (``field``) and the rule it broke."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.rule = message
