"""GET /v1/presets/{models,clusters,workloads,parallel}: name -> full spec."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from collectives.topology import PRESETS, cluster_preset
from planner import MODEL_PRESETS
from planner.presets import PARALLEL_PRESETS, WORKLOAD_PRESETS

from ..convert import spec_dict

router = APIRouter(prefix="/v1/presets", tags=["presets"])


@router.get(
    "/models", summary="Model presets", description="Full specs with parameter counts (total, active, published)."
)
def models() -> dict[str, dict[str, Any]]:
    return {
        name: spec_dict(m) | {"params_total": m.total_params(), "params_active": m.active_params()}
        for name, m in MODEL_PRESETS.items()
    }


@router.get(
    "/clusters", summary="Cluster presets", description="One node each; set num_nodes in a request. GB/s per direction."
)
def clusters() -> dict[str, dict[str, Any]]:
    return {name: spec_dict(cluster_preset(name)) for name in PRESETS}


@router.get("/workloads", summary="Workload presets")
def workloads() -> dict[str, dict[str, Any]]:
    return WORKLOAD_PRESETS


@router.get("/parallel", summary="Parallel-layout presets", description="dp is derived from the cluster when omitted.")
def parallel() -> dict[str, dict[str, Any]]:
    return PARALLEL_PRESETS
