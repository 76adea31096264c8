"""The one shape of a heavy POST route: parse the body, run ``work(body, settings)`` in a worker thread under
the request's deadline among the bounded work slots (app/limits.run_bounded), encode its result against the
response model. The routes that are only that declare themselves here instead of restating the shape."""

# no `from __future__ import annotations`: FastAPI reads the endpoint's body type from its real annotation

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from ..errors import BAD_INPUT
from ..limits import encode, run_bounded


def bounded_post(
    router: APIRouter,
    path: str,
    body_type: type,
    out: type,
    work: Callable[[Any, Any], Any],
    encoded: bool = False,
    **docs: str,
) -> None:
    """POST ``path`` on ``router``: ``work(body, settings)`` encoded as ``out`` (``encoded``: ``work`` returns the
    body's bytes itself, from its own serializer); ``docs``: the endpoint's name, summary and description
    (OpenAPI)."""

    async def endpoint(body, request: Request) -> Response:
        settings = request.app.state.settings
        if encoded:
            return await run_bounded(request, lambda: work(body, settings))
        return await run_bounded(request, lambda: encode(work(body, settings), out))

    endpoint.__annotations__["body"] = body_type
    endpoint.__name__ = endpoint.__qualname__ = docs.pop("name")
    router.post(path, responses=BAD_INPUT, response_model=out, **docs)(endpoint)
