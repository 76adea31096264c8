"""The commplan web service: thin assembly of routers, error handlers, limits and the static page."""

from __future__ import annotations

import gc
import importlib
import multiprocessing
import re
import sys
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
from fastapi import FastAPI
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response
from fastapi.routing import APIRoute
from fastapi.staticfiles import StaticFiles
from uvicorn.protocols.http import flow_control

from planner.search.engine import young_threshold

from . import errors, runner
from .limits import BodyLimit
from .routers import calibrate, collectives, export, health, plan, presets, search, serve, topology
from .settings import Settings
from .threads import in_thread

FRONTEND = Path(__file__).resolve().parent.parent / "frontend"
SWAGGER = "/static/vendor/swagger-ui-5.35.0"  # npm swagger-ui-dist 5.35.0 (Apache-2.0), LICENSE beside it
REDOC = "/static/vendor/redoc-2.5.4"  # npm redoc 2.5.4 (MIT), LICENSE beside it

DESCRIPTION = """What goes over the wire in a distributed transformer job, over which links, and what it costs.

Units: bytes are integers; seconds are floats; bandwidth is GB/s = 1e9 bytes/s per direction.
Message bytes follow nccl-tests (allgather: gathered output; reducescatter: full input; alltoall: the
whole per-rank send buffer). Counts are per rank per iteration. Bad input is a 422 whose `msg` names the
rule and the numbers, and so is work over a budget (docs/hardening.md); bodies over the limit are a 413."""

# The page loads only its own files (script-src 'self': no inline script, no CDN). Styles may be inline
# (ECharts and Cytoscape set style attributes), images may be data:/blob: URIs (the favicon, chart
# exports); nothing may frame the page.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data: blob:; "
    "font-src 'self' data:; connect-src 'self'; worker-src 'self' blob:; object-src 'none'; base-uri 'none'; "
    "form-action 'self'; frame-ancestors 'none'"
)
HEADERS = [
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"cross-origin-opener-policy", b"same-origin"),
]

SWAGGER_PAGE = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>commplan API</title>
<link rel="icon" href="{SWAGGER}/favicon-32x32.png"><link rel="stylesheet" href="{SWAGGER}/swagger-ui.css">
</head><body><div id="swagger-ui"></div>
<script src="{SWAGGER}/swagger-ui-bundle.js"></script><script src="/docs/init.js"></script></body></html>"""
SWAGGER_INIT = """SwaggerUIBundle({url: "/openapi.json", dom_id: "#swagger-ui", deepLinking: true,
  presets: [SwaggerUIBundle.presets.apis], layout: "BaseLayout"});"""
REDOC_PAGE = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>commplan API</title></head>
<body><redoc spec-url="/openapi.json"></redoc><script src="{REDOC}/redoc.standalone.js"></script></body></html>"""


class SecurityHeaders:
    """Pure ASGI: CSP, nosniff, DENY framing and no referrer on every response. The same CSP serves /docs
    and /redoc (checked in Chromium: both render with no violation; ReDoc's remote logo is replaced in the vendored
    bundle by an inline SVG, frontend/vendor/redoc-2.5.4/PATCHED.md)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def with_headers(message):
            if message["type"] == "http.response.start":
                message["headers"] = security_headers(message.get("headers", []))
            await send(message)

        return await self.app(scope, receive, with_headers)


def security_headers(headers: list) -> list:
    """``headers`` with the CSP and the other security headers every response carries."""
    return [*headers, (b"content-security-policy", CSP.encode()), *HEADERS]


async def service_unavailable(scope, receive, send):
    """uvicorn's own 503 at its connection limit (``limit_concurrency``), with the security headers: uvicorn
    answers it from the protocol without running the app, so no middleware adds them (issue 26 item 6)."""

    async def with_headers(message):
        if message["type"] == "http.response.start":
            message = {**message, "headers": security_headers(list(message.get("headers", [])))}
        await send(message)

    await flow_control.service_unavailable(scope, receive, with_headers)


def install_busy_headers() -> None:
    """Points uvicorn's HTTP protocols at :func:`service_unavailable`: each looks the name up in its module
    when a request arrives over the limit (uvicorn 0.54 h11_impl.py / httptools_impl.py handle_events)."""
    for name in ("h11_impl", "httptools_impl"):
        try:
            module = importlib.import_module(f"uvicorn.protocols.http.{name}")
        except ImportError:  # httptools not installed
            continue
        module.service_unavailable = service_unavailable


def stop_worker_processes(timeout_s: float = 2.0) -> list[int]:
    """Kills the processes this one forked (the search's worker pool, app/runner.py's pool) and returns their
    ids. They inherit uvicorn's SIGTERM handler, which only flags a server they do not run, so a terminated
    service used to leave them orphaned, holding its listening socket: the port then accepted connections nobody
    answered and a restart on it failed. SIGKILL is the one signal their copied handler cannot take."""
    children = multiprocessing.active_children()
    for child in children:
        child.kill()
    for child in children:
        child.join(timeout_s)
    return [child.pid for child in children] + runner.pool().close()


def warm_requests(routes) -> list[tuple[str, str]]:
    """(method, path) of one request per API route, path parameters filled with a placeholder."""
    return [
        (method, re.sub(r"\{[^}]*\}", "json", route.path))
        for route in routes
        if isinstance(route, APIRoute) and route.path != "/openapi.json"  # built in a thread when first asked
        for method in sorted(route.methods)
    ]


async def warm_up(app: FastAPI) -> None:
    """Pays FastAPI's once-per-process costs at start-up, before uvicorn listens, instead of on the event loop
    of a server already computing (issue 26 item 4). FastAPI 0.165 builds an included router's route table on
    the first request that reaches it (routing.py ``_IncludedRouter.effective_candidates``, ``create_model_field``
    per route) and reads an endpoint's source file on its first call (``_extract_endpoint_context``:
    ``inspect.getsourcelines`` tokenizes the router's module). Each is 10-40 ms of CPU on an idle core, on the
    loop; with nine work threads sharing the GIL the loop gets about a tenth of it, so the first plan and the
    first calibrate held /healthz for 0.15-0.6 s (docs/hardening.md "Steady under load"). One request per
    route through the whole stack: GETs answer (they are cheap), POSTs carry a body that is not JSON, a 422
    before any work."""
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://warm-up") as client:
        for method, path in app.state.warm_requests:
            await client.request(method, path, content=b"\x00" if method == "POST" else None,
                                 headers={"content-type": "application/json"})  # fmt: skip


def openapi_bytes(app: FastAPI) -> bytes:
    """The OpenAPI document, built once (about 0.85 s of CPU on an idle core: FastAPI walks every model) and
    encoded once, in the thread that asks first, not on the event loop (FastAPI's own /openapi.json route
    builds and encodes it on the loop, 8 ms a request after the first)."""
    if getattr(app.state, "openapi_bytes", None) is None:
        app.state.openapi_bytes = JSONResponse(app.openapi()).body
    return app.state.openapi_bytes


def freeze_start_up() -> int:
    """Moves every object the process holds once started (modules, classes, functions, schemas, the warm-up's
    routes: about 120,000) out of the garbage collector's reach, once per process; returns how many. A full
    collection walks every tracked object with the GIL held (a C pass: the switch interval does not apply), so the
    event loop waits for it whole: 80-120 ms of CPU on this machine with these objects, 108-262 ms late ticks
    seen while a calibrate ran (docs/hardening.md). ``gc.freeze`` (CPython 3.7+, the gc module's docs) puts them in
    a permanent generation that collections skip; they are the server's own for its whole life. What is garbage
    already is collected first, so nothing is frozen that should have been freed."""
    if gc.get_freeze_count():
        return 0
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


# The server's young generation (planner/search/engine.py young_threshold): collected every 2,000 net new container
# objects while it runs, not CPython's 700. A plan of Llama 3 405B on 16,384 H100 peaks at ~1,800 such objects,
# freed by reference counting once answered: at 700 each request ran 2.6 young and 0.2 middle collections over
# them, 0.6-0.7 ms of its CPU (bench/plan_http.py with gc.callbacks); at 2,000, 24 collections in 62 requests,
# 0.2 ms a request, the same peak memory (106.5 MiB against 106.0). Not the search workers' 10,000: each plan
# leaves some cyclic garbage, and at 5,000-10,000 it piled up to a peak of 118.5-119.0 MiB.
GC_YOUNG_SERVICE = 2_000


@asynccontextmanager
async def lifespan(app: FastAPI):
    # process-wide, set when a server starts (not on import): the event loop's share of the GIL (Settings) and the
    # collector's young threshold (GC_YOUNG_SERVICE); both given back when it stops
    previous, collector = sys.getswitchinterval(), gc.get_threshold()
    sys.setswitchinterval(app.state.settings.switch_interval_s)
    young_threshold(GC_YOUNG_SERVICE)
    try:  # a start-up that raises still gives both back and stops any worker already forked
        runner.configure(app.state.settings)
        runner.release_sockets_on_fork()  # a forked process must not keep the server's connections open
        await warm_up(app)
        freeze_start_up()  # before any pool worker is forked: each inherits the frozen start-up objects
        if runner.LIMITS.pooled and app.state.settings.work_in_process:
            await runner.pool().start(app.state.settings.worker_processes)
        yield
    finally:
        sys.setswitchinterval(previous)
        gc.set_threshold(*collector)
        stop_worker_processes()


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings.from_env()
    install_busy_headers()
    app = FastAPI(
        title="commplan", version="0.1.0", description=DESCRIPTION, lifespan=lifespan,
        docs_url=None, redoc_url=None, openapi_url=None,  # all three served below
    )  # fmt: skip
    app.state.settings = settings
    errors.install(app)
    routers = (health, plan, export, search, serve, collectives, calibrate, presets, topology)
    for module in routers:
        app.include_router(module.router)
    if FRONTEND.is_dir():
        app.mount("/static", StaticFiles(directory=FRONTEND), name="static")

        @app.get("/", include_in_schema=False)
        def index() -> FileResponse:
            return FileResponse(FRONTEND / "index.html")

    @app.get("/openapi.json", include_in_schema=False)
    async def openapi() -> Response:
        return Response(await in_thread(openapi_bytes, app), media_type="application/json")

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return HTMLResponse(SWAGGER_PAGE)

    @app.get("/docs/init.js", include_in_schema=False)
    async def docs_init() -> Response:
        return Response(SWAGGER_INIT, media_type="text/javascript")

    @app.get("/redoc", include_in_schema=False)
    async def redoc() -> HTMLResponse:
        return HTMLResponse(REDOC_PAGE)

    app.state.warm_requests = warm_requests([r for module in routers for r in module.router.routes] + app.routes)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes, timeout_s=settings.body_timeout_s)
    app.add_middleware(SecurityHeaders)
    app.add_middleware(errors.SafetyNet)
    return app


app = create_app()
