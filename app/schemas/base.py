"""The one base of every request schema: unknown fields rejected, no type coercion (``true`` is not 1,
``"8"`` is not 8, ``8.0`` is not an integer), no NaN or Infinity in float fields. The body filter
(app/limits.BodyLimit) already refuses NaN, Infinity and overflowing literals at parse time; this config
keeps the rule if a model is validated from Python (the CLI, the batch endpoint's items)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

MAX_DEVICES = 1 << 17  # the largest cluster a request can describe (Settings.max_devices is the served limit)
MAX_MESSAGE = 1 << 46  # 64 TiB: above any collective's buffer, products stay inside int64

DeviceId = Annotated[int, Field(ge=0, lt=MAX_DEVICES)]
MessageBytes = Annotated[int, Field(ge=0, le=MAX_MESSAGE)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
