"""Liveness: answered on the event loop, never queued behind the work slots or the thread pool."""

from fastapi import APIRouter

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="Liveness")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.head("/healthz", include_in_schema=False)
async def healthz_head() -> None:
    return None
