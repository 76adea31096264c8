"""The one base of every request schema: unknown fields rejected, no type coercion (``true`` is not 1,
``"8"`` is not 8, ``8.0`` is not an integer), no NaN or Infinity in float fields. The body filter
(app/limits.BodyLimit) already refuses NaN, Infinity and overflowing literals at parse time; this config
keeps the rule if a model is validated from Python (the CLI, the batch endpoint's items)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

MAX_DEVICES = 1 << 17  # the largest cluster a request can describe (Settings.max_devices is the served limit)
MAX_MESSAGE = 1 << 46  # 64 TiB: above any collective's buffer, products stay inside int64

DeviceId = Annotated[int, Field(ge=0, lt=MAX_DEVICES)]
MessageBytes = Annotated[int, Field(ge=0, le=MAX_MESSAGE)]


# Unknown fields one object may name before they are one error instead of one each: 300,000 unknown keys
# (5.5 MB) took 5 s of the event loop to list one by one, /healthz waiting behind them.
MAX_UNKNOWN_FIELDS = 16


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

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
