"""The one base of every request schema: unknown fields rejected, no type coercion (``true`` is not 1,
``"8"`` is not 8, ``8.0`` is not an integer), no NaN or Infinity in float fields. The body filter
(app/limits.BodyLimit) already refuses NaN, Infinity and overflowing literals at parse time; this config
keeps the rule if a model is validated from Python (the CLI, the batch endpoint's items)."""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from planner.exports import CONTROL

MAX_DEVICES = 1 << 17  # the largest cluster a request can describe (Settings.max_devices is the served limit)
MAX_MESSAGE = 1 << 46  # 64 TiB: above any collective's buffer, products stay inside int64

DeviceId = Annotated[int, Field(ge=0, lt=MAX_DEVICES)]
MessageBytes = Annotated[int, Field(ge=0, le=MAX_MESSAGE)]


def optional_positive(le: float, description: str):
    """An optional number above 0 and at most ``le``, null when left out: the one shape of such fields."""
    return Field(default=None, gt=0, le=le, description=description)


def optional_probability(description: str):
    """An optional probability in [0, 1) (a dropout probability), null when left out."""
    return Field(default=None, ge=0, lt=1, description=description)


def with_example(example: dict) -> ConfigDict:
    """A request model's config: unknown fields refused, and ``example`` its OpenAPI example body."""
    return ConfigDict(extra="forbid", json_schema_extra={"examples": [example]})


# Unknown fields one object may name before they are one error instead of one each: 300,000 unknown keys
# (5.5 MB) took 5 s of the event loop to list one by one, /healthz waiting behind them.
MAX_UNKNOWN_FIELDS = 16


def control_character(value, depth: int = 0) -> str | None:
    """Where ``value`` (a string, or one inside lists and dicts, keys included) holds a CONTROL character
    (planner/exports.py: line ends, C0/C1 controls, bidirectional overrides), as ``"[key] U+000A"``; else None."""
    if isinstance(value, str):
        found = CONTROL.search(value)
        return f"U+{ord(found.group()):04X} at character {found.start()}" if found else None
    if depth > 64:
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            where = control_character(key, depth + 1) or control_character(item, depth + 1)
            if where:
                return f"[{str(key)[:40]!r}] {where}"
    elif isinstance(value, list | tuple) and value and any(isinstance(v, str | dict | list | tuple) for v in value):
        for i, item in enumerate(value):
            where = control_character(item, depth + 1)
            if where:
                return f"[{i}] {where}"
    return None


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
    # fields whose text may span lines (an nccl-tests log); every other string is a name and holds no control
    # character: a newline in a cluster's name became a command in the nccl-tests export (issue 26)
    free_text: ClassVar[frozenset[str]] = frozenset()

    @field_validator("*", mode="after")
    @classmethod
    def _no_control_characters(cls, value, info: ValidationInfo):
        if info.field_name in cls.free_text or isinstance(value, int | float | bool | BaseModel) or value is None:
            return value
        where = control_character(value)
        if where:
            raise ValueError(
                f"a control character ({where}): names and other strings here are one line of printable text "
                "(line ends, C0/C1 controls and bidirectional overrides are refused)"
            )
        return value

    _no_control_characters.__func__.refuses_only = True  # app/schemas/write.py: it changes no value

    @model_validator(mode="before")
    @classmethod
    def _few_unknown_fields(cls, data):
        if isinstance(data, dict) and len(data) > len(cls.model_fields) + MAX_UNKNOWN_FIELDS:  # free when it cannot be
            unknown = [key for key in data if key not in cls.model_fields]
            if len(unknown) > MAX_UNKNOWN_FIELDS:
                first = ", ".join(repr(str(key))[:40] for key in unknown[:3])
                raise ValueError(
                    f"{len(unknown):,} unknown fields (first: {first}); at most {MAX_UNKNOWN_FIELDS} are listed one by "
                    f"one; the fields here are {', '.join(cls.model_fields)}"
                )
        return data
