"""Search: the fastest layout of a model on a cluster that fits (DESIGN.md §10; docs/search.md).

Public surface::

    Problem(model, workload, cluster_spec, Constraints.of({...}, memory_headroom), top_k)
    search(problem, progress=None, cancelled=None, workers=None) -> SearchResult
    evaluate_shapes(problem, shapes) -> Outcome      the pure per-chunk function (sweeps run it on Ray)
    Space, Layout, Shape, Constraints, Pruned        the space and its counts
"""

from .engine import MAX_LAYOUTS, Cancelled, Ranked, SearchResult, search, step_time
from .evaluate import Outcome, Problem, evaluate_shape, evaluate_shapes, space_of
from .space import Constraints, Layout, Pruned, Shape, Space

__all__ = [
    "MAX_LAYOUTS",
    "Cancelled",
    "Constraints",
    "Layout",
    "Outcome",
    "Problem",
    "Pruned",
    "Ranked",
    "SearchResult",
    "Shape",
    "Space",
    "evaluate_shape",
    "evaluate_shapes",
    "search",
    "space_of",
    "step_time",
]
