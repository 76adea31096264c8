"""Compute slowed by the communication it overlaps (issue 20, overlap7).

A call that hides behind compute is not free: its kernel holds streaming multiprocessors and moves bytes through
HBM while the compute runs. Two mechanisms, no constant fitted:

- **SMs held.** An NCCL collective launches one CTA per channel and each CTA stays resident on its SM for the
  whole call (NCCL src/enqueue.cc: ``grid = {nChannels, 1, 1}``, the channels the pricer already chooses:
  ``Price.channels``, collectives/topology/library/model.py ``channels_used``). A compute-bound kernel (GEMM,
  attention) beside it runs on the SMs that are left: rate (S - c) / S of its full-GPU rate. TransformerEngine's
  userbuffers TP overlap sets its own (``Flavour.tp_overlap_sms``: TE pytorch/module/base.py initialize_ub,
  ``get_default_config``: ``num_sm = 1 if method == "ring_exchange" else 16``, ``use_ce = True``: the ring
  exchange's all-gathers move by copy engine, the pipelined reduce-scatters hold 16 SMs and the GEMM is
  launched with ``set_sm_margin`` on the rest).
- **HBM shared.** A memory-bound kernel (norms, activations, casts, copies) shares HBM with the call's copies:
  each byte a rank sends is read from its HBM, each byte it receives is written into its buffer by the peer and
  read back by its kernel (NCCL prims_simple.h: a peer writes into the receiver's FIFO, the receiver's
  recvReduceSend / recvCopySend reads it): ``sent + 2 x received`` bytes over the call's time. What is left,
  at least half (a fair share of the memory controllers), is the memory-bound kernel's rate.

Over a window where h seconds of communication run behind compute, the compute does h x r of work in h
seconds, so it ends h x (1 - r) later, r the harmonic mix of the two rates by the window's time shares of
compute-bound and memory-bound work. Where the call itself outlasts the compute (some of it exposed), the
longer compute only hides more of it: the pass grows by max(0, h x (1 - r) - exposed).

Checked, not fitted: Lee et al. 2025 (arXiv 2507.03114, "Characterizing Compute-Communication Overlap in
GPU-Accelerated Distributed Deep Learning") measure a mean 18.9% (max 40.0%) slowdown of overlapped compute on
4 x A100 / H100; NCCL's 24 channels on an H100's 132 SMs give 1/r - 1 = 22% for a GEMM here, on an A100's 108
SMs 29%. Not modelled: the wave tail when a GEMM's tiles were exactly one wave on the whole GPU (NVIDIA
developer forum "Compute-Communication Overlap Causes Severe GEMM Performance Degradation because of Tail
Effect": 132 tiles beside a 24-CTA all-gather nearly double), NCCL slowed by the compute, copy-engine-only
calls' SMs (0 here), and calls priced without a channel count (the schedule pricer's off NVIDIA fabrics).

**Point-to-point calls and all-to-alls (p2psm).** NCCL runs sends, recvs and all-to-alls on its p2p channels, one
CTA each: collectives/topology/library/p2p.py gives the grid of one kernel (p2pnChannels, channels per peer by
path, the size rule of enqueue.cc, the rounds' channel bases), which ``select.price_call`` sets as
``Price.channels`` on every send/recv and all-to-all NCCL runs (the schedule pricer still gives their time). How
many such kernels run at once is the framework's:

- the CP ring's KV exchange (TransformerEngine v2.9 context_parallel.py lines 1125-1127 and 1872-1873):
  ``batch_p2p_comm = NVTE_BATCH_MHA_P2P_COMM or (sm < 10.0 and cp == 2)``, one batched send/recv, one kernel;
  else ``flash_attn_p2p_communicate`` (lines 86-93) issues an isend and an irecv, which torch runs as two
  kernels on two-rank communicators of their own (ProcessGroupNCCL::pointToPoint: a single p2p op outside a
  batch gets the ``getKeySendRecv`` comm and its stream): ``ring_p2p_kernels``;
- the pipeline's sends under --overlap-p2p-communication (Megatron-LM 92c8482e6d arguments.py line 1328
  ``batch_p2p_comm = not overlap_p2p_comm``; p2p_communication.py ``_p2p_ops``: separate isend / irecv): a send
  and a recv kernel per pass, ``PP_OVERLAP_KERNELS``; the steady state hides them (planner/pipeline.py), so
  each pass of each model chunk runs beside one boundary send's time of them (step._pp_contention);
- the EP all-to-alls hidden by --overlap-moe-expert-parallel-comm / DualPipe or the shared experts: one
  ``all_to_all_single`` each, one kernel; DeepEP's and HybridEP's kernels hold their own SMs instead
  (``Call.sms``: rules/deepep.py KERNEL_SMS, Megatron's defaults 20 and 16).

Not modelled here: torch's eager-init mode, where single p2p ops reuse the group's communicator (more ranks,
fewer channels per plan: enqueue.cc nChannelsMin), and the middle stages' four concurrent pipeline transfers of
Megatron's combined interleaved step (two counted per pass).
"""

from __future__ import annotations

from typing import NamedTuple

from collectives.topology.gpu import GPUSpec

# the least of HBM a memory-bound kernel keeps beside a copy-heavy call: an even share of the memory controllers
# between the two streams' requests (an assumption, stated; the NVLink rates of today's GPUs stay under it)
HBM_FLOOR = 0.5


def hbm_bytes(price) -> int:
    """HBM bytes one rank moves for one call: what it sends read once, what it receives written by the peer and
    read back by its own kernel (module docstring)."""
    return int(price.bytes_sent_per_rank) + 2 * int(price.bytes_received_per_rank)


class Share(NamedTuple):
    """What one stream's calls take from the compute beside them while they run: ``sms`` held on average (SM-
    seconds / seconds) and ``hbm_Bps`` HBM bytes per second. (A named tuple: built per stage and stream of every
    layout the search times.)"""

    sms: float = 0.0
    hbm_Bps: float = 0.0


def compute_rate(gpu: GPUSpec, share: Share) -> float:
    """A compute-bound kernel's rate beside the call, as a fraction of its own: the SMs left (1 when the GPU's
    SM count is unknown)."""
    if not gpu.sms or share.sms <= 0:
        return 1.0
    return max(0.0, gpu.sms - share.sms) / gpu.sms


def memory_rate(gpu: GPUSpec, hbm_eff: float, share: Share) -> float:
    """A memory-bound kernel's rate beside the call: the achievable HBM bandwidth less the call's traffic, never
    under HBM_FLOOR."""
    peak = gpu.hbm_GBps * 1e9 * hbm_eff
    if peak <= 0 or share.hbm_Bps <= 0:
        return 1.0
    return max(HBM_FLOOR, 1.0 - share.hbm_Bps / peak)


def window_rate(gpu: GPUSpec, hbm_eff: float, share: Share, compute_bound: float) -> float:
    """The rate of a window's compute whose time is ``compute_bound`` compute-bound and the rest memory-bound:
    the harmonic mix (a unit of work takes f_c / r_c + f_m / r_m)."""
    f_c = min(1.0, max(0.0, compute_bound))
    r_c, r_m = compute_rate(gpu, share), memory_rate(gpu, hbm_eff, share)
    if r_c <= 0:
        return 0.0
    return 1.0 / (f_c / r_c + (1.0 - f_c) / r_m)


def slowdown_s(hidden_s: float, exposed_s: float, rate: float) -> float:
    """How much later the compute ends when ``hidden_s`` of communication ran behind it at ``rate``: h x (1 - r),
    less what of the call was exposed anyway (the longer compute hides that)."""
    if hidden_s <= 0:
        return 0.0
    return max(0.0, hidden_s * (1.0 - rate) - exposed_s)


# the pipeline's send and recv kernels beside each pass under --overlap-p2p-communication (module docstring)
PP_OVERLAP_KERNELS = 2


def ring_p2p_kernels(sm: int, cp: int) -> int:
    """The CP ring's concurrent p2p kernels per KV exchange: 1 batched (TE v2.9 ``batch_p2p_comm``: compute
    capability below 10.0 and cp 2), else an isend and an irecv kernel (module docstring)."""
    return 1 if sm < 100 and cp == 2 else 2


def kernels_share(channels: int, kernels: int, moved: float, seconds: float) -> Share:
    """What ``kernels`` concurrent p2p kernels of ``channels`` CTAs each hold over ``seconds``, moving ``moved``
    HBM bytes between them."""
    if seconds <= 0:
        return Share()
    return Share(float(channels * kernels), moved / seconds)
