"""Model + workload + parallel layout -> the per-call ledger of one iteration, placed and priced.

Public surface::

    ModelSpec, MoESpec, MLASpec, WorkloadSpec, ParallelSpec   the specs (validated in build_plan)
    MODEL_PRESETS, model_preset, from_hf_config                 models
    build_plan(model, workload, parallel, cluster, Options())   -> Plan (.to_dict() is the HTTP response)
    SpecError                                                   bad input: .field and .rule
"""

from ._errors import SpecError
from .model import MLASpec, ModelSpec, MoESpec
from .parallel import ParallelSpec
from .plan import Options, Plan, build_plan, cluster_for
from .presets import MODEL_PRESETS, from_hf_config, model_preset
from .workload import WorkloadSpec

__all__ = [
    "MODEL_PRESETS",
    "MLASpec",
    "MoESpec",
    "ModelSpec",
    "Options",
    "ParallelSpec",
    "Plan",
    "SpecError",
    "WorkloadSpec",
    "build_plan",
    "cluster_for",
    "from_hf_config",
    "model_preset",
]
