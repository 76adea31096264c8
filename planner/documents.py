"""Document imbalance across micro-batches (issue 21, fp8a9): packed documents make micro-batches differ in work,
and the pipeline and the data-parallel ranks wait for the slowest.

With ``workload.document_packing`` "dp_balanced" the lengths in ``workload.document_lengths`` are the corpus's
distribution (each one equally likely, drawn independently), and the documents are packed as Megatron-LM d98e8a6
megatron/core/datasets/data_schedule.py ``DpBalancedScheduler.get_groups_and_subsamples`` packs a global batch:
"in their original order until reaching the max limit of sequence length" (next fit: a pack closes when the next
document does not fit; that document opens the next pack), the capacity ``max_seqlen_per_dp_cp_rank`` x cp, here
the sequence; pack i is micro-batch i // dp of DP rank i % dp. A pack's work is its tokens T (the linear layers) and
its query-key pairs W = sum L(L+1)/2 over its documents (each causal within itself: kernels.document_keys).

``pack_moments``: the exact first and second moments of (T, W) of a pack in the long run, by an exact small
computation: from each first document, the fills the pack passes through (each fill a state, documents added while
they fit), which give the pack's (T, W) and the next pack's first document; the first documents form a Markov chain
whose stationary distribution weighs them. ``expected_max``: E[max of n independent standard normals] by quadrature.
``document_wait_s``: what the step takes from the imbalance, over the critical stage's micro-batch as the planner prices
it (b packs of s tokens each: time t_lin in the token work outside the core attention, the host's waits left out, t_attn
in it at the corpus's pairs per token E[W]/E[T]): a pack takes t = (t_lin·T + t_attn·W·E[T]/E[W]) / s, a micro-batch
their mean over its b packs, standard deviation sigma. Megatron does not pad a pack to the sequence:
data_schedule_utils.py build_packed_microbatches / _pack_sequences concatenate the documents at their own padded_seq_len
(cu_seqlens_padded is their cumulative sum; Megatron-LM main 65b9207, the stored copy: not re-read at d98e8a6), so T
varies and its term stays. The planner's mean prices full packs (s, not E[T], tokens): the mean step is not lowered for
the packs' slack (not modelled). The pipeline runs the schedule's own order over the micro-batches' times
(planner/pipeline_jitter.py, docwait10): its makespan's excess over the uniform one, sigma·mean, and its spread,
sigma·sd, per data-parallel replica; the replicas each run their own micro-batches and the gradient reduction waits for
the slowest: sigma·(mean + sd·E[max of dp]), the replicas' makespans taken as normal (with pp 1: mean 0, sd sqrt(m), the
sum of m micro-batches). A schedule whose order is not written out keeps the proportionate flow shop, makespan sum_j t_j
+ (p - 1)·max_j t_j (Pinedo, "Scheduling: Theory, Algorithms, and Systems", 5th ed., §6.2): mean (p - 1)·E[max of m], sd
sqrt(m) (the sum's; the max's own spread not counted); the mean is exact for GPipe (every forward, then every backward:
two proportionate flow shops, the backward one opening on the last rank when its forwards end, the others' forwards done
by then, so (phi + 1 - phi)·(p - 1)·max_j t_j beyond the sum; tests/planner/test_pipeline_jitter.py); ZB-H1, ZBV
and DualPipe(V) run their own orders, the weight gradient split off where they split it (sched11), and past the work
bound 1F1B's, which waits longer (mend11a; the flow shop was 3.6x short at pp 512, review r11a #1). The micro-batches
are taken as independent normals (the packs' dependence through their first documents is not counted)"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from functools import lru_cache
from statistics import NormalDist

from ._errors import SpecError
from .pipeline import Schedule
from .pipeline_jitter import jitter

FIELD = "workload.document_lengths"
# the exact computation visits (fills x distinct lengths) per first document: bounded, a histogram coarser than
# this is the input (a 422 says so)
MAX_PACK_STEPS = 1_000_000
_Z = NormalDist()


@dataclass(frozen=True)
class PackMoments:
    """A pack's tokens T and query-key pairs W in the long run: means, variances and covariance."""

    tokens: float
    pairs: float
    var_tokens: float
    var_pairs: float
    cov: float


@lru_cache(maxsize=64)  # keyed by value: a search asks once per layout
def pack_moments(histogram: tuple[tuple[int, int], ...], capacity: int) -> PackMoments:
    """Exact stationary moments of next-fit packs of documents drawn from ``histogram``, (length, count) pairs by
    length (WorkloadSpec.document_histogram: the corpus counted once, so the key hashes the distinct lengths, not
    every document; module docstring)."""
    sizes = [n for n, _ in histogram]
    if sizes[-1] > capacity:
        raise SpecError(FIELD, f"a document of {sizes[-1]} tokens does not fit a packed sequence of {capacity}")
    total = sum(c for _, c in histogram)
    q = [c / total for _, c in histogram]
    pairs = [n * (n + 1) / 2 for n in sizes]
    k = len(sizes)
    steps = k * k * (capacity // math.gcd(*sizes, capacity) + 1)
    if steps > MAX_PACK_STEPS:
        raise SpecError(
            FIELD,
            f"{k} distinct lengths over a {capacity}-token pack are {steps:,} steps of the exact packing "
            f"computation (at most {MAX_PACK_STEPS:,}): give a coarser histogram (fewer distinct lengths, or "
            "lengths on a common multiple)",
        )
    moments, chain = [], []
    for first in range(k):
        m, nxt = _from_first(sizes, q, pairs, first, capacity)
        moments.append(m)
        chain.append(nxt)
    pi = _stationary(chain)
    e = [sum(p * m[i] for p, m in zip(pi, moments, strict=True)) for i in range(5)]
    t, w, tt, ww, tw = e
    return PackMoments(t, w, tt - t * t, ww - w * w, tw - t * w)


def _from_first(sizes, q, pairs, first: int, capacity: int) -> tuple[tuple[float, ...], list[float]]:
    """(E[T], E[W], E[T²], E[W²], E[TW]) of a pack opened by document ``first``, and the distribution of the
    next pack's first document. A state is a fill f with (probability, E[W; f], E[W²; f]); fills only grow."""
    states = {sizes[first]: [1.0, pairs[first], pairs[first] ** 2]}
    heap = [sizes[first]]
    out = [0.0] * 5
    nxt = [0.0] * len(sizes)
    while heap:
        f = heapq.heappop(heap)
        p, a, b = states.pop(f)
        for j, n in enumerate(sizes):
            pj, c = p * q[j], pairs[j]
            if f + n <= capacity:
                g = f + n
                if g not in states:
                    states[g] = [0.0, 0.0, 0.0]
                    heapq.heappush(heap, g)
                s = states[g]
                s[0] += pj
                s[1] += q[j] * a + pj * c
                s[2] += q[j] * (b + 2 * a * c) + pj * c * c
            else:  # document j does not fit: the pack closes at fill f and j opens the next
                out[0] += pj * f
                out[1] += q[j] * a
                out[2] += pj * f * f
                out[3] += q[j] * b
                out[4] += q[j] * a * f
                nxt[j] += pj
    return tuple(out), nxt


def _stationary(chain: list[list[float]]) -> list[float]:
    """The stationary distribution of the first documents' chain (rows sum to 1), by power iteration of the lazy
    chain (P + I) / 2 (the same stationary distribution, never periodic) from the uniform one until it moves less
    than 1e-15."""
    k = len(chain)
    pi = [1.0 / k] * k
    for _ in range(100_000):
        new = [(pi[j] + sum(pi[i] * chain[i][j] for i in range(k))) / 2 for j in range(k)]
        if max(abs(x - y) for x, y in zip(new, pi, strict=True)) < 1e-15:
            return new
        pi = new
    return pi


@lru_cache(maxsize=256)
def expected_max(n: int) -> float:
    """E[max of n independent standard normals]: 0 for n = 1, 1/sqrt(pi) for 2, 3/(2 sqrt(pi)) for 3; by the
    midpoint rule on [-10, 10] (step 1e-3) of x·n·phi(x)·Phi(x)^(n-1)."""
    if n <= 1:
        return 0.0
    h = 1e-3
    total = 0.0
    for i in range(20_000):
        x = -10.0 + (i + 0.5) * h
        total += x * n * _Z.pdf(x) * _Z.cdf(x) ** (n - 1)
    return total * h


def micro_batch_sigma(moments: PackMoments, packs: int, tokens: int, linear_s: float, attention_s: float) -> float:
    """Standard deviation of a micro-batch of ``packs`` independent packs, priced (the planner's mean micro-batch)
    at ``tokens`` tokens a pack (the sequence: the step prices every pack full) with ``linear_s`` outside the core
    attention and ``attention_s`` in it. The linear work is per token: a = linear_s / tokens a token. The core
    attention is priced at the corpus's pairs per token, E[W]/E[T] (kernels.document_keys: sum L(L+1)/2 / sum L, the
    renewal-reward ratio of a pack's means), times the tokens: c = attention_s·E[T] / (tokens·E[W]) a pair. The
    micro-batch takes the mean over its packs of a·T + c·W: standard deviation sqrt(Var(a·T + c·W) / packs)."""
    a = linear_s / tokens
    c = attention_s * moments.tokens / (tokens * moments.pairs)
    var = a * a * moments.var_tokens + c * c * moments.var_pairs + 2 * a * c * moments.cov
    return math.sqrt(max(0.0, var) / packs)


def document_wait_s(
    ctx, sched: Schedule, pass_s: tuple[float, float], linear_s: float, attention_s: float, weight_s: float = 0.0
) -> float:
    """Seconds the step waits for the slowest packed micro-batch (module docstring): sigma·(mean + sd·E[max of
    dp]) with the pipeline's excess and spread from ``sched``'s order (pipeline_jitter.jitter; past the work bound
    a cheaper stand-in order's, 1F1B's, which waits longer: ScheduleTraits.wait_stand_ins; the flow shop's
    (p - 1)·E[max of m] and sqrt(m) where the order is not written out or every run is over pipeline_jitter's work
    bound, said by pipeline_jitter.method); 0 without "dp_balanced" packing.
    ``pass_s``: the critical stage's mean micro-batch, (forward, backward) seconds, whose shares and spread the
    order runs over; ``linear_s``, ``attention_s``: its token work (ctx.b packs of ctx.s tokens), forward and
    backward (the host's waits do not scale with a pack's tokens); ``weight_s``: the weight-gradient GEMMs of its
    backward, which the zero-bubble and DualPipe orders run apart (pipeline.StagePass.weight_s)."""
    work = ctx.work
    if not (ctx.training and work.document_packing == "dp_balanced" and work.document_lengths):
        return 0.0
    moments = pack_moments(work.document_histogram, ctx.s)
    sigma = micro_batch_sigma(moments, ctx.b, ctx.s, linear_s, attention_s)
    total = sum(pass_s)
    if sigma <= 0.0 or total <= 0.0:
        return 0.0
    m, p, dp = sched.microbatches, sched.stages, ctx.par.dp
    got = jitter(sched, pass_s[0] / total, sigma / total, weight_s / total)
    mean, sd = (got.mean, got.sd) if got else ((p - 1) * expected_max(m), math.sqrt(m))
    return sigma * (mean + sd * expected_max(dp))


__all__ = ["PackMoments", "document_wait_s", "expected_max", "micro_batch_sigma", "pack_moments"]
