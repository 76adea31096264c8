"""Model + workload + parallel layout -> the per-call ledger of one iteration, placed and priced.

Public surface::

    ModelSpec, MoESpec, MLASpec, WorkloadSpec, ParallelSpec   the specs (validated in build_plan)
    MODEL_PRESETS, model_preset, from_hf_config                 models
    build_plan(model, workload, parallel, cluster, Options())   -> Plan (typed; app/serialize.py writes it as JSON)
    step_time(Context(m, w, p), priced_calls, gpu, Overlap())  -> StepTime (planner/step.py)
    memory(Context(m, w, p), gpu, calls)                        -> Memory (fits, per stage)
    SpecError                                                   bad input: .field and .rule
"""

from ._errors import SpecError, shown
from .context import Context
from .model import MLASpec, ModelSpec, MoESpec
from .parallel import ParallelSpec
from .plan import Options, Plan, build_plan, cluster_for
from .presets import MODEL_PRESETS, from_hf_config, model_preset
from .step import Overlap, StepTime, memory, step_time
from .workload import WorkloadSpec

__all__ = [
    "MODEL_PRESETS",
    "Context",
    "MLASpec",
    "MoESpec",
    "ModelSpec",
    "Options",
    "Overlap",
    "ParallelSpec",
    "Plan",
    "SpecError",
    "StepTime",
    "WorkloadSpec",
    "build_plan",
    "cluster_for",
    "from_hf_config",
    "memory",
    "model_preset",
    "shown",
    "step_time",
]
