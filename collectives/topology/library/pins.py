"""NCCL_ALGO / NCCL_PROTO as NCCL parses them (src/graph/tuning.cc:parseList, v2.30.7-1).

``"Ring"`` or ``"ring,nvls"`` enables those for every function; ``"^LL"`` enables everything but LL;
``"ring;allreduce:tree,nvls"`` sets allreduce apart (every entry after the first needs a function prefix).
Names are case-insensitive. The result is, per function, the set that stays enabled (``None``: all).
"""

from __future__ import annotations

from functools import lru_cache

from ..._errors import CollectiveError
from ...primitives import Op
from . import tables as T

NCCL_NAMES = {
    "ring": "Ring",
    "tree": "Tree",
    "nvls": "NVLS",
    "nvls_tree": "NVLSTree",
    "collnet_direct": "CollNetDirect",
    "collnet_chain": "CollNetChain",
    "pat": "PAT",
}
ALGO_ALIASES = {k.lower(): k for k in T.ALGORITHMS} | {v.lower(): k for k, v in NCCL_NAMES.items()}
PROTO_ALIASES = {p.lower(): p for p in T.PROTOCOLS}
FUNCTIONS = {
    "broadcast": Op.BROADCAST,
    "reduce": Op.REDUCE,
    "allgather": Op.ALLGATHER,
    "reducescatter": Op.REDUCESCATTER,
    "allreduce": Op.ALLREDUCE,
}  # ncclFuncStr


@lru_cache(maxsize=256)
def parse(text: str, kind: str) -> tuple[tuple[Op | None, frozenset[str]], ...]:
    """((function or None for all, enabled names), ...) in order; ``kind`` is 'algo' or 'proto'."""
    field = f"nccl_{kind}"
    aliases, known = (ALGO_ALIASES, NCCL_NAMES.values()) if kind == "algo" else (PROTO_ALIASES, T.PROTOCOLS)
    if text.strip().lower() in ("", "auto"):
        return ()
    out = []
    for i, token in enumerate(text.split(";")):
        prefix, _, items = token.rpartition(":")
        func = None
        if prefix:
            func = FUNCTIONS.get(prefix.strip().lower())
            if func is None:
                raise CollectiveError(field, f"unknown function prefix {prefix!r}; known: {', '.join(FUNCTIONS)}")
        elif i:
            raise CollectiveError(field, f"every entry after the first needs a function prefix: {text!r}")
        negate = items.strip().startswith("^")
        names = set()
        for item in items.strip().lstrip("^").split(","):
            name = aliases.get(item.strip().lower())
            if name is None:
                what = "algorithm" if kind == "algo" else "protocol"
                raise CollectiveError(field, f"unknown NCCL {what} {item.strip()!r}; known: {', '.join(known)}")
            names.add(name)
        every = set(aliases.values())
        out.append((func, frozenset(every - names if negate else names)))
    return tuple(out)


def enabled(rules: tuple[tuple[Op | None, frozenset[str]], ...], op: Op) -> frozenset[str] | None:
    """The names enabled for ``op``: the last rule naming it (or naming every function) wins."""
    got = None
    for func, names in rules:
        if func is None or func is op:
            got = names
    return got
