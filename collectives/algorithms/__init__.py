"""Every algorithm module registers its (algorithm, op) pairs on import."""

from . import (  # noqa: F401  (imported for registration)
    alltoall,
    binomial_tree,
    bruck,
    direct,
    double_binary_tree,
    halving_doubling,
    hierarchical,
    in_network,
    recursive_doubling,
    ring,
    swing,
)
from ._base import (
    Cost,
    Implementation,
    Request,
    allreduce_lower_bound,
    implementations,
    lookup,
    validate,
)

__all__ = [
    "Cost",
    "Implementation",
    "Request",
    "allreduce_lower_bound",
    "implementations",
    "lookup",
    "validate",
]
