"""Serving: a deployment's prefill and decode steps, KV cache, TTFT/TPOT/throughput and KV transfer, built
on the planner's own inference plans (docs/serving.md)."""

from .deployment import KVCache, KVTransfer, PoolResult, ServePlan, plan_serving, worker_inputs
from .engines import ENGINES, EngineTraits, engine
from .spec import MTP, Pool, ServeOptions, Traffic, validate_serving, validate_traffic

__all__ = [
    "ENGINES",
    "MTP",
    "EngineTraits",
    "KVCache",
    "KVTransfer",
    "Pool",
    "PoolResult",
    "ServeOptions",
    "ServePlan",
    "Traffic",
    "engine",
    "plan_serving",
    "validate_serving",
    "validate_traffic",
    "worker_inputs",
]
