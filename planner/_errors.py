"""The planner's one exception for bad input: the field (dotted path) and the rule with its numbers."""


class SpecError(ValueError):
    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.rule = message
