"""How the heavy routes read their JSON bodies: a large body is decoded and validated in a thread (issue 26 item 4).

FastAPI decodes a JSON body (``json.loads``) and validates it against the endpoint's model on the event loop
(fastapi 0.165 routing.py ``get_request_handler``, then dependencies/utils.py ``request_body_to_args``), about 100
ns per byte on this machine: 1.5 ms for 13 kB, 50 ms for 0.5 MB, and about 1 s each for the decoding and the
validation of a 5.5 MB body of 300,000 unknown keys, all of it time in which /healthz is not answered.
:class:`OffLoopBody` routes run that same code (``_validate_value_with_model_field``, what ``request_body_to_args``
calls for a single body model) in a thread behind the compute gate (app/threads.py) when the body is over
:data:`OFF_LOOP_BYTES`, and hand FastAPI the validated model, which it validates again as itself (pydantic returns
a model instance unchanged: 13 us for a plan, 25 us for a 1,000-plan batch). A body at or under the threshold
(every plan, price or search body written by hand) is read as FastAPI reads it: a thread costs more than that.

The answers are FastAPI's own, byte for byte: the same 422 errors at the same ``loc`` (``["body", pos]`` with
``json_invalid`` for JSON that does not decode; the path, query, header and cookie errors first, as
``solve_dependencies`` lists them), and anything else (a form, a content type FastAPI does not read as JSON,
several body parameters, a body nested too deeply to decode) is left to FastAPI's handler
(tests/app/test_health_body.py sends each error both ways).

What a thread does not buy: CPython's JSON decoder is one C call that holds the GIL from the first byte to the
last (the switch interval does not apply to it), so the decoding blocks the loop in a thread as on it (5.5 MB of
unknown keys: 1.2 s either way, measured); pydantic's validation gives the GIL up at the models' Python
validators (the same body's validation: 1.0 s on the loop, ticks at most 134 ms late from a thread).
"""

from __future__ import annotations

import email.message
import json
from typing import Any

import anyio
from fastapi import params
from fastapi.dependencies.utils import (
    _should_embed_body_fields,
    _validate_value_with_model_field,
    request_params_to_args,
)
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from starlette.requests import Request

from .limits import Busy
from .threads import gate, in_thread

# Bodies over this are decoded and validated in a thread: about 0.8 ms of the loop's CPU at ~100 ns a byte, under
# the 1 ms switch interval (app/settings.py), which is what a thread's round trip to the loop costs it anyway.
OFF_LOOP_BYTES = 8192


def _is_json(request: Request) -> bool:
    """Whether FastAPI would decode this body as JSON: a content type application/json or application/*+json
    (get_request_handler's test, with its email.message parsing); a body without one is FastAPI's to handle."""
    value = request.headers.get("content-type")
    if not value:
        return False
    message = email.message.Message()
    message["content-type"] = value
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (subtype == "json" or subtype.endswith("+json"))


def decode(raw: bytes, field) -> tuple[Any, list[dict]] | None:
    """(the validated body, []) or (what was decoded, FastAPI's errors for it); None where FastAPI's own handler
    must answer (a body that raises anything but a JSON decode error, e.g. nested past the recursion limit)."""
    try:
        body = json.loads(raw)
    except json.JSONDecodeError as err:  # fastapi routing.py get_request_handler: the same error, field for field
        error = {"type": "json_invalid", "loc": ("body", err.pos), "msg": "JSON decode error", "input": {},
                 "ctx": {"error": err.msg}}  # fmt: skip
        return err.doc, [error]
    except Exception:
        return None
    try:
        value, errors = _validate_value_with_model_field(field=field, value=body, values={}, loc=("body",))
    except Exception:
        return None
    return (body, errors) if errors else (value, [])


class OffLoopBody(APIRoute):
    """An APIRoute whose JSON body, when over :data:`OFF_LOOP_BYTES`, is decoded and validated in a thread behind
    the compute gate; routers that run heavy work name it as their ``route_class``."""

    def get_route_handler(self):
        handler = super().get_route_handler()
        fields = self.dependant.body_params
        single = (
            len(fields) == 1
            and not self._embed_body_fields
            and not _should_embed_body_fields(fields)
            and not isinstance(fields[0].field_info, params.Form)
        )
        if not single:
            return handler
        field, dependant = fields[0], self.dependant

        async def read_body_off_loop(request: Request):
            raw = await request.body()
            if len(raw) > OFF_LOOP_BYTES and _is_json(request):
                # waits for a compute thread as a request waits for a work slot: at most queue_s, else Busy
                outcome = None
                with anyio.move_on_after(request.app.state.settings.queue_s) as waited:
                    outcome = await in_thread(decode, raw, field, gate=gate(request.app))
                if waited.cancelled_caught:
                    raise Busy()
                if outcome is not None:
                    value, errors = outcome
                    if errors:
                        raise RequestValidationError(_parameter_errors(dependant, request) + errors, body=value)
                    request._json = value  # what Request.json() returns (starlette 1.10 requests.py caches it there)
            return await handler(request)

        return read_body_off_loop


def _parameter_errors(dependant, request: Request) -> list:
    """The errors FastAPI lists before the body's (dependencies/utils.py solve_dependencies): path, query, header
    and cookie parameters, in that order."""
    errors: list = []
    for fields, values in (
        (dependant.path_params, request.path_params),
        (dependant.query_params, request.query_params),
        (dependant.header_params, request.headers),
        (dependant.cookie_params, request.cookies),
    ):
        errors += request_params_to_args(fields, values)[1]
    return errors


__all__ = ["OFF_LOOP_BYTES", "OffLoopBody", "decode"]
