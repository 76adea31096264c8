"""POST /v1/calibrate: fit the few global pricing constants to the user's own nccl-tests logs (the procedure
is collectives/topology/calibrate.py; app/calibration.py makes its JSON, which the CLI prints too)."""

from __future__ import annotations

from fastapi import APIRouter

from ..body import OffLoopBody
from ..calibration import calibration_response
from ..schemas.calibrate import MAX_ROWS, CalibrateOut, CalibrateRequest
from ._bounded import bounded_post

router = APIRouter(prefix="/v1", tags=["calibration"], route_class=OffLoopBody)


# A fit at the row limit takes seconds: like every heavy endpoint it runs in a worker thread under the request's
# deadline, among the bounded work slots, and stops when the client goes away.
bounded_post(
    router,
    "/calibrate",
    CalibrateRequest,
    CalibrateOut,
    calibration_response,
    name="calibrate",
    summary="Fit the pricing constants to nccl-tests logs",
    description="Each log is nccl-tests output as printed (all_reduce_perf, all_gather_perf, reduce_scatter_perf, "
    "alltoall_perf, broadcast_perf, reduce_perf, sendrecv_perf; NCCL_DEBUG=INFO lines may be mixed in) with the "
    "number of nodes it ran on. Fits link efficiencies on rows >= 256 MiB, latency scales and the network's per-hop "
    f"latency on rows <= 64 KiB; at most {MAX_ROWS} rows in all. A malformed log is a 422 naming the line.",
)
