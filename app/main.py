"""The commplan web service: thin assembly of routers, error handlers, limits and the static page."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

from . import errors
from .limits import BodyLimit
from .routers import collectives, export, health, plan, presets, search
from .settings import Settings

FRONTEND = Path(__file__).resolve().parent.parent / "frontend"

DESCRIPTION = """What goes over the wire in a distributed transformer job, over which links, and what it costs.

Units: bytes are integers; seconds are floats; bandwidth is GB/s = 1e9 bytes/s per direction.
Message bytes follow nccl-tests (allgather: gathered output; reducescatter: full input; alltoall: the
whole per-rank send buffer). Counts are per rank per iteration. Bad input is a 422 whose `msg` names the
rule and the numbers; bodies over the limit are a 413."""


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings.from_env()
    app = FastAPI(title="commplan", version="0.1.0", description=DESCRIPTION)
    app.state.settings = settings
    errors.install(app)
    for router in (health.router, plan.router, collectives.router, presets.router, search.router):
        app.include_router(router)
    app.include_router(export.router)  # exports of a plan (docs/exports.md)
    if FRONTEND.is_dir():
        app.mount("/static", StaticFiles(directory=FRONTEND), name="static")

        @app.get("/", include_in_schema=False)
        def index() -> FileResponse:
            return FileResponse(FRONTEND / "index.html")

    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    return app


app = create_app()
