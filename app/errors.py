"""Bad input is a 422 in FastAPI's shape, naming the field and the rule; nothing becomes a 500."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException

from collectives import CollectiveError
from planner import SpecError

log = logging.getLogger("commplan")


def detail(field: str, message: str, kind: str) -> list[dict]:
    return [{"loc": ["body", *[part for part in field.split(".") if part]], "msg": message, "type": kind}]


def error_detail(err: Exception, prefix: str = "") -> list[dict]:
    """The 422 detail of a SpecError or CollectiveError (``prefix`` places a collectives field in its block)."""
    if isinstance(err, SpecError):
        return detail(err.field, err.rule, "value_error.spec")
    if isinstance(err, CollectiveError):
        return detail(prefix + err.field, err.rule, "value_error.collective")
    raise TypeError(err)


class ErrorList(BaseModel):
    """FastAPI's error shape: one entry per problem, loc the path of the field in the body."""

    detail: list[dict]


BAD_INPUT = {
    413: {"model": ErrorList, "description": "Body over COMMPLAN_MAX_BODY_BYTES"},
    422: {"model": ErrorList, "description": "Invalid input: msg names the rule and the numbers"},
}


def install(app: FastAPI) -> None:
    @app.exception_handler(HTTPException)
    async def unreadable_body(request: Request, err: HTTPException):
        # FastAPI answers a body it cannot decode with a bare 400; bad input is a 422 here, always.
        if err.status_code == 400:
            return JSONResponse(
                status_code=422,
                content={
                    "detail": detail(
                        "", "the body could not be read as JSON (not UTF-8, or nested too deeply)", "json_invalid"
                    )[:1]
                },
            )
        return await http_exception_handler(request, err)

    @app.exception_handler(SpecError)
    async def spec_error(_: Request, err: SpecError):
        return JSONResponse(status_code=422, content={"detail": error_detail(err)})

    @app.exception_handler(CollectiveError)
    async def collective_error(_: Request, err: CollectiveError):
        return JSONResponse(status_code=422, content={"detail": error_detail(err)})
