"""A pool's engine rules that the launch command would otherwise be the first to meet: plain data parallelism (a
pool's dp without attention DP: EngineTraits.plain_dp) and a MoE dispatcher asked for where the engine runs no MoE
exchange (EngineTraits.moe_exchange_needs_attention_dp). One home: deployment.check_deployment calls
``check_pool_rules``, so /v1/serve, /v1/serve/calibrate, the SLA search (a refused layout counted in ``rejected``)
and /v1/serve/export give the same 422 (review r15a #1, #6)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from .._errors import SpecError
from .spec import Pool


@dataclass(frozen=True)
class PlainDP:
    """How an engine runs a pool of dp > 1 without attention DP: ``replicas`` dp whole tensor-parallel replicas in
    one server (False: it runs none: its data parallelism is attention DP only); ``one_node``: only where the worker
    fits one node; ``moe``: False where its replicas of an MoE model would each hold every expert over their own tp
    ranks, not the plan's split over tp*dp; ``source``: the engine file that says so."""

    replicas: bool
    source: str
    one_node: bool = False
    moe: bool = True
    moe_source: str = ""


NO_PLAIN_DP = PlainDP(False, "no plain data-parallel replicas stated")  # EngineTraits.plain_dp's default


def replicas_hint(pool: Pool) -> str:
    """What serves the same plain replicas as separate servers: the pool's dp as workers, an MoE worker's ep within
    its own tp ranks (gcd(ep, tp): it divides the tp ranks, and is tp itself where ep was tp*dp), a layout that
    plans."""
    ep = f", ep {math.gcd(pool.ep, pool.tp)}" if pool.ep > 1 else ""
    return f"serve the replicas as workers ({pool.workers * pool.dp} workers of tp {pool.tp}, pp {pool.pp}, dp 1{ep})"


def check_plain_dp(traits, pool: Pool, where: str, per_node: int, num_experts: int) -> None:
    """A 422 at ``where``.attention_dp or .dp where the engine cannot run the pool's plain data parallelism as
    planned (EngineTraits.plain_dp)."""
    rule: PlainDP = traits.plain_dp
    if pool.dp == 1 or pool.attention_dp:
        return
    hint = replicas_hint(pool)
    if not rule.replicas:
        raise SpecError(
            f"{where}.attention_dp",
            f"{traits.label} runs no plain data-parallel replicas in one server ({rule.source}): dp {pool.dp} without "
            f"attention_dp would launch --tp_size {pool.tp * pool.dp}, one tensor-parallel group of "
            f"{pool.tp * pool.dp}; set attention_dp, or {hint}",
        )
    if num_experts and not rule.moe:
        raise SpecError(
            f"{where}.attention_dp",
            f"{traits.label}'s plain data-parallel replicas each hold the {num_experts} experts over their own tp "
            f"{pool.tp} ranks ({rule.moe_source}), and the plan splits them over the worker's tp*dp = "
            f"{pool.tp * pool.dp} ranks, which {traits.label} runs with attention DP: set attention_dp, or {hint}",
        )
    if rule.one_node and pool.worker_gpus > per_node:
        raise SpecError(
            f"{where}.dp",
            f"{traits.label} runs plain data parallelism inside one node only ({rule.source}); a worker of "
            f"tp*pp*dp = {pool.tp}*{pool.pp}*{pool.dp} = {pool.worker_gpus} GPUs spans "
            f"{-(-pool.worker_gpus // per_node)} nodes of {per_node}: {hint}, or set attention_dp",
        )


def check_moe_exchange(traits, pool: Pool, where: str) -> None:
    """A 422 at ``where``.ep_dispatch where the pool asks for a MoE dispatcher that the engine does not run: without
    attention DP (dp 1, or no attention_dp) an engine with ``moe_exchange_needs_attention_dp`` creates no MoE
    communication, every EP rank holding every token (deployment._moe_dispatch plans that, "replicated")."""
    source = traits.moe_exchange_needs_attention_dp
    if source is None or pool.ep_dispatch is None or pool.ep == 1 or (pool.attention_dp and pool.dp > 1):
        return
    raise SpecError(
        f"{where}.ep_dispatch",
        f"{traits.label} runs no MoE exchange without attention DP ({source}): ep_dispatch {pool.ep_dispatch!r} on a "
        f"pool of dp {pool.dp}{'' if pool.attention_dp else ' without attention_dp'} would not be run; set "
        f"attention_dp with dp > 1, or leave ep_dispatch out",
    )


def check_post_quant_rows(traits, pool: Pool, where: str, hidden: int, weights: str) -> None:
    """A 422 at ``where``.ep_dispatch where the engine's post-quant dispatch (EngineTraits.post_quant_dispatches) of
    ``weights`` rows needs a hidden size it does not have (EngineTraits.post_quant_hidden_multiple)."""
    multiple, source = traits.post_quant_hidden_multiple
    dispatch = pool.ep_dispatch or traits.ep_dispatch
    if dispatch not in traits.post_quant_dispatches or pool.ep == 1 or hidden % multiple == 0:
        return
    raise SpecError(
        f"{where}.ep_dispatch",
        f"{traits.label}'s post-quant {dispatch} dispatch of {weights} rows needs hidden_size % {multiple} == 0 "
        f"({source}); the model's hidden_size {hidden:,} leaves {hidden % multiple}: leave ep_dispatch out "
        f"(the engine's default {traits.ep_dispatch!r}) or use another weight_dtype",
    )


def check_pool_rules(model, traits, pools: tuple[Pool, ...], per_node: int, weights: str, post_quant_formats) -> None:
    """Every pool's rules above, each at its own field."""
    experts = model.moe.num_experts if model.moe else 0
    for i, pool in enumerate(pools):
        where = f"deployment.pools.{i}"
        check_plain_dp(traits, pool, where, per_node, experts)
        check_moe_exchange(traits, pool, where)
        if weights in post_quant_formats:
            check_post_quant_rows(traits, pool, where, model.hidden_size, weights)


__all__ = [
    "NO_PLAIN_DP",
    "PlainDP",
    "check_moe_exchange",
    "check_plain_dp",
    "check_pool_rules",
    "check_post_quant_rows",
    "replicas_hint",
]
