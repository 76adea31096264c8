"""DeepEP-style expert dispatch and combine (``parallel.ep_dispatch: "deepep"``), as DeepSeek-V3 trains
(DeepSeek-V3 technical report §3.2.2; github.com/deepseek-ai/DeepEP README, normal kernels
``Buffer.dispatch``/``Buffer.combine``; Megatron-Core MoEFlexTokenDispatcher with --moe-enable-deepep).

Routing is node-limited: each token's k experts lie on at most M nodes (``model.moe.node_limit``, M = 4 in
DeepSeek-V3). A token leaves its GPU once per target *node* over RDMA, to the GPU with the same in-node
index there (inter-node leg, one copy per node however many experts it hits on that node), and that GPU
forwards it over NVLink once per target *GPU* of the node (intra-node leg). Combine runs the legs in reverse
(in bf16: DeepEP combines in the activation dtype); backward swaps dispatch and combine. When the EP group
fits in one node only the NVLink leg exists (DeepEP intranode kernels), one copy per target GPU.

Under uniform routing the expected number of distinct targets when k picks fall on n equally likely bins is
n(1 - (1 - 1/n)^k): nodes per token with n = min(M, EP nodes); GPUs per token and node with n = EP GPUs per
node and k/(nodes per token) picks. The per-rank message (all-to-all convention: local input) is the
tokens times those counts times the row bytes (fp8 rows carry their 1x128 scales). DeepEP's layout
notification (per-rank token counts, in-kernel) is not listed.

HybridEP (``ep_dispatch: "hybridep"``; Megatron-Core --moe-token-dispatcher-type flex
--moe-flex-dispatcher-backend hybridep; DeepEP's hybrid-ep branch 94a9f8f) moves the same legs: "Similar to
DeepEP, Hybrid-EP first performs IB communication between peer GPUs [same local rank in other NVLink
domains], then each rank distributes the received inter-node data locally" (docs/Hybrid-EP_Implementation.md
§8); its dispatch kernel sends a token once per remote domain (``attn_to_rdma_map``: tokens x (nodes - 1)
bools, csrc/hybrid_ep/backend/hybrid_ep_backend.cuh) and each rank's expert buffer holds a token once
however many of its experts it hits; the combine pre-reduces within the domain before the RDMA leg (§8.2).
Its "node" is the NVLink domain (deep_ep/hybrid_ep_buffer.py ``num_of_hybrid_ep_ranks_per_nvlink_domain``,
detected): the cluster's devices per node here, which the GB200 NVL72 preset sets to the 72-GPU domain.
Megatron runs it in the activation dtype only (fused_a2a.py ``init_hybrid_ep_buffer``: assert not
fp8_dispatch; a 422 here). What differs from DeepEP is kernel efficiency (TMA, fewer SMs), not bytes, with
one exception, the NVLink peer limit below.

DeepEP's normal kernels see at most 8 NVLink peers (DeepEP 4e38d1d csrc/kernels/configs.cuh
``NUM_MAX_NVL_PEERS 8``, ``NUM_MAX_RDMA_PEERS 20``; at dd758ca csrc/kernels/legacy/compiled.cuh
``LEGACY_NUM_MAX_NVL_PEERS 8``, static-asserted in internode.cu). csrc/deep_ep.cpp Buffer::Buffer splits the
EP group by rank: ``rdma_rank = rank / NUM_MAX_NVL_PEERS, nvl_rank = rank % NUM_MAX_NVL_PEERS``,
``num_rdma_ranks = max(1, num_ranks / 8)``, and asserts ``num_ranks < 8 or num_ranks % 8 == 0`` and
``num_ranks <= 8 * 20`` (normal mode). The inter-group leg is ``nvshmemi_ibgda_put_nbi_warp`` (internode.cu
dispatch/combine): InfiniBand GPUDirect Async through the NIC, whatever links the GPUs share; buffer.py's
``allow_mnnvl`` only stops NVSHMEM disabling multi-node NVLink, which the IBGDA puts do not use. So on a GB200
NVL72 rack an EP group of 16-72 runs as groups of 8 with an RDMA leg over the NICs between them, where
HybridEP uses the whole NVLink domain. ``ep_per_node`` caps DeepEP's "node" at 8 (HybridEP reads the
cluster's), and the RDMA leg's calls carry ``Call.network`` so that the plan prices them on the NICs
(planner/plan.py ``_price``) even where the graph joins the GPUs by NVLink.
"""

from __future__ import annotations

from collectives import Op

from .._errors import SpecError
from ..context import Context
from ..layout import Group, RankLayout
from ..ledger import Call, equal_blocks

SOURCE = "DeepEP normal kernels (Buffer.dispatch/combine); DeepSeek-V3 report §3.2.2"
NUM_MAX_NVL_PEERS = 8  # DeepEP 4e38d1d csrc/kernels/configs.cuh (LEGACY_NUM_MAX_NVL_PEERS at dd758ca)
NUM_MAX_RDMA_PEERS = 20  # DeepEP 4e38d1d csrc/kernels/configs.cuh
# ep_dispatch -> the source its legs cite: one count (``legs``), two backends
# ep_dispatch -> the SMs its dispatch and combine kernels hold (Call.sms), Megatron-LM 92c8482e6d's defaults:
# transformer_config.py line 228 ``moe_deepep_num_sms = 20`` (token_dispatcher.py line 1163 set_deepep_num_sms ->
# DeepEP Buffer.set_num_sms; DeepEP 4e38d1d deep_ep/buffer.py line 31 ``num_sms = 20``: the normal kernels launch
# num_channels x 2 = num_sms blocks, csrc/kernels/intranode.cu / internode.cu SETUP_LAUNCH_CONFIG) and line 231
# ``moe_hybridep_num_sms = 16`` (token_dispatcher.py lines 1051-1052: num_sms_dispatch_api / num_sms_combine_api)
KERNEL_SMS = {"deepep": 20, "hybridep": 16}
# ep_dispatch -> the fraction of its legs' priced rate (NCCL's all-to-all on the same links, plan._price) the backend's
# own kernels achieve (Call.achieved; ledger.kernel_time divides each leg's time by it). One global constant, fitted
# on kernel-level data only: DeepEP's normal-kernel table (docs/legacy.md at dd758ca, first published 3b1045d
# README 2025-04-22; tests/reference/deepep/normal_h800.json: H800, EP 8/16/32/64, dispatch and combine, 8 rows, now
# fit, not held out). The value is the median over those rows of (the slower leg's price / DeepEP's time):
#
# | constant             | value | meaning                                              | source                       |
# |----------------------|-------|------------------------------------------------------|------------------------------|
# | ACHIEVED["deepep"]   | 0.897 | DeepEP's normal dispatch/combine move their legs'    | fitted: the 8 rows of        |
# |                      |       | bytes at 0.897 of NCCL's all-to-all rate on those    | DeepEP's H800 table; the     |
# |                      |       | links (the slower leg's price is 0.80-0.94 of        | test reproduces it to 3      |
# |                      |       | DeepEP's time, median 0.897)                         | decimals                     |
# | ACHIEVED["hybridep"] | 1.0   | not fitted                                           | no HybridEP kernel table     |
#
# What the fit holds, from DeepEP's source (tests/test_intranode.py / test_internode.py at 3b1045d, the version that
# printed the table): the tuning loop times ``buffer.dispatch(x, handle=..., config)`` with CUDA events (tests/utils.py
# ``bench``: 30 calls, the first dropped), so each time is the cached notify kernel (intranode
# ``cached_notify_dispatch``, internode ``cached_notify``: a barrier and buffer cleaning) plus the data kernel at the
# best NVL/RDMA chunk sizes the test sweeps, at 24 SMs (``num_sms = 24``: 12 channels; internode even SMs forward
# RDMA to NVLink, odd SMs send RDMA and receive NVLink, csrc/kernels/legacy/internode.cu ``is_forwarder``). Its
# time holds no ``notify_dispatch`` and no host wait (a cached handle skips both): the non-cached dispatch that
# Megatron's fused_a2a and SGLang's normal dispatcher run pays the notify kernel and the CPU's busy-wait on
# ``moe_recv_counter`` besides, which no controlled measurement gives a number for (DeepEP issue #94's ~1 ms
# notify includes the wait for the slowest rank): not priced. The 20 SMs the planner's calls hold (KERNEL_SMS) are
# priced at the table's rate: the DeepSeek-V3 report (§3.2.2, its cross-node all-to-all kernels) says 20 SMs
# suffice to saturate both the IB and the NVLink bandwidth, so 20 against the table's 24 moves no price.
ACHIEVED = {"deepep": 0.897, "hybridep": 1.0}
# fitted on H800 only (NVLink ~160 GB/s, CX7 400 Gb/s; DeepEP's one kept table) and applied to every GPU: on H100,
# H200, B200 and GB200 no DeepEP table was read. Held out by row (8 refits at the other 7 rows' median, review r14e
# finding 5): median |error| 3.8%, worst -10.9% (EP16 combine), against in-sample 3.1% / -10.3%
# (tests/planner/test_deepep_normal.py test_leave_one_row_out)
ACHIEVED_NOTE = "fitted on DeepEP's H800 table only (8 rows; held out by row: median 3.8%, worst -10.9%)"
BACKENDS = {
    "deepep": SOURCE,
    "hybridep": "HybridEP (DeepEP hybrid-ep 94a9f8f HybridEPBuffer.dispatch/combine, docs/Hybrid-EP_Implementation.md "
    "§8: RDMA to the peer in each remote NVLink domain, then NVLink); Megatron-Core fused_a2a.py HybridEPDispatch",
}


def distinct(bins: int, picks: float) -> float:
    """Expected distinct bins hit by ``picks`` uniform picks among ``bins``."""
    return bins * (1 - (1 - 1 / bins) ** picks) if bins > 1 else 1.0


def ep_per_node(ctx: Context) -> int:
    """EP ranks that share a node, from the rank order (expert grid) and the cluster's devices per node."""
    par, per_node = ctx.par, ctx.devices_per_node
    if per_node is None:
        raise SpecError("parallel.ep_dispatch", "deepep needs the cluster (devices per node) to split its legs")
    stride = RankLayout(par).stride("ep", expert=True)
    if stride >= per_node:
        if stride % per_node:
            raise SpecError(
                "parallel.ep_dispatch",
                f"EP ranks {stride} apart do not align with nodes of {per_node} devices (DeepEP)",
            )
        local = 1
    elif per_node % stride:
        raise SpecError(
            "parallel.ep_dispatch",
            f"EP ranks {stride} apart do not tile nodes of {per_node} devices (DeepEP)",
        )
    else:
        local = min(par.ep, per_node // stride)
    if par.ep_dispatch == "deepep":
        _check_deepep_ranks(par.ep)
        # DeepEP's buffer joins its group's ranks by rank % 8. Megatron's flex dispatcher builds it over the expert-TP x
        # EP group (Megatron-LM 60e039626 token_dispatcher.py ``_DeepepManager(group=self.tp_ep_group, ...)``, top-k and
        # experts folded by tp), whose etp x ep ranks lie together when EP ranks are etp apart: that group is checked
        if par.etp > 1 and stride == par.etp:
            _check_nvlink_group(par.etp * par.ep, min(par.etp * par.ep, per_node), per_node)
        else:
            _check_nvlink_group(par.ep, local, per_node)
        local = min(local, NUM_MAX_NVL_PEERS)  # DeepEP's "node": 8 consecutive EP ranks at most
    if par.ep % local:
        raise SpecError("parallel.ep_dispatch", f"ep {par.ep} does not split into nodes of {local} EP ranks (DeepEP)")
    return local


def _check_nvlink_group(ep: int, local: int, per_node: int) -> None:
    """DeepEP's normal kernels join min(ep, NUM_MAX_NVL_PEERS) consecutive EP ranks by NVLink (csrc/deep_ep.cpp
    Buffer::Buffer: ``rdma_rank = rank / NUM_MAX_NVL_PEERS, nvl_rank = rank % NUM_MAX_NVL_PEERS``, the NVLink peers'
    buffers opened by CUDA IPC handles; an EP group under 8 is one intranode group of all its ranks). TensorRT-LLM's
    wrapper states the same feasible set (communication/deep_ep.py ``_is_deepep_feasible``: "Intranode: Single node
    with 2, 4, or 8 ranks; Internode: ... with 8 ranks per node"). A node holding fewer of the group's ranks than
    that cannot run them (review r14e finding 9: EP 16 on 4-GPU nodes, EP 4 over 2-GPU nodes planned before)."""
    group = min(ep, NUM_MAX_NVL_PEERS)
    if local < group:
        raise SpecError(
            "parallel.ep_dispatch",
            f"DeepEP's normal kernels join {group} consecutive EP ranks by NVLink (min(ep {ep}, NUM_MAX_NVL_PEERS "
            f"{NUM_MAX_NVL_PEERS}), csrc/deep_ep.cpp rank % {NUM_MAX_NVL_PEERS}), but a node of {per_node} devices "
            f"holds {local} of this layout's EP ranks; use nodes of at least {group} GPUs, EP ranks adjacent in "
            "the order, or ep_dispatch 'alltoall' / 'deepep_ll'",
        )


def _check_deepep_ranks(ep: int) -> None:
    """DeepEP 4e38d1d csrc/deep_ep.cpp Buffer::Buffer: ``num_ranks < NUM_MAX_NVL_PEERS or num_ranks %
    NUM_MAX_NVL_PEERS == 0`` and, in normal mode, ``num_ranks <= NUM_MAX_NVL_PEERS * NUM_MAX_RDMA_PEERS``."""
    if ep > NUM_MAX_NVL_PEERS and ep % NUM_MAX_NVL_PEERS:
        raise SpecError(
            "parallel.ep_dispatch",
            f"DeepEP's normal kernels need ep < {NUM_MAX_NVL_PEERS} or a multiple of {NUM_MAX_NVL_PEERS} "
            f"(NUM_MAX_NVL_PEERS, csrc/deep_ep.cpp), got ep {ep}",
        )
    if ep > NUM_MAX_NVL_PEERS * NUM_MAX_RDMA_PEERS:
        raise SpecError(
            "parallel.ep_dispatch",
            f"DeepEP's normal kernels take at most {NUM_MAX_NVL_PEERS} x {NUM_MAX_RDMA_PEERS} = "
            f"{NUM_MAX_NVL_PEERS * NUM_MAX_RDMA_PEERS} ranks (NUM_MAX_NVL_PEERS x NUM_MAX_RDMA_PEERS), got ep {ep}",
        )


def destinations(ctx: Context) -> tuple[float, float]:
    """(nodes, ranks) one token is sent to under uniform routing of its top-k picks: the distinct nodes of the EP
    group it reaches, at most the model's node limit (DeepSeek-V3's node-limited routing, ``MoESpec.node_limit``),
    and the distinct EP ranks, its picks spread over the local ranks of each node it reaches. The one home of the
    (token, destination rank) count: DeepEP's legs (the NVLink rows) and the tokens a rank receives
    (kernels.deepep_received_tokens) read it (review r15a #3: the two disagreed by 3.0% at EP32)."""
    moe, par = ctx.model.moe, ctx.par
    local = ep_per_node(ctx)
    nodes = par.ep // local
    k = moe.top_k
    if nodes == 1:
        return 1.0, distinct(local, k)
    nodes_per_token = distinct(min(moe.node_limit or nodes, nodes), k)
    return nodes_per_token, nodes_per_token * distinct(local, k / nodes_per_token)


def legs(ctx: Context, tokens: int, row_bytes: int, combine_bytes: int) -> tuple[list[tuple], list[tuple]]:
    """(dispatch legs, combine legs) as (leg, group, message bytes per row kind) for one MoE layer."""
    par = ctx.par
    local = ep_per_node(ctx)
    nodes = par.ep // local
    nodes_per_token, ranks_per_token = destinations(ctx)
    if nodes == 1:
        rows = round(tokens * ranks_per_token)
        group = Group(("ep",), expert=True)
        return [("nvlink", group, equal_blocks(rows * row_bytes, par.ep))], [
            ("nvlink", group, equal_blocks(rows * combine_bytes, par.ep))
        ]
    rdma_rows = round(tokens * nodes_per_token)
    nvlink_rows = round(tokens * ranks_per_token)
    inter = Group(("ep_node",), expert=True, split=local)
    intra = Group(("ep_local",), expert=True, split=local)
    # each leg's send buffer in equal blocks over its group (ledger.equal_blocks): fp8 rows with their scales
    # (2,972 B at h 2,880) over 8 ranks were priced by no schedule, a 422 (hostile10)
    rdma, nvlink = (rdma_rows, nodes), (nvlink_rows, local)
    dispatch = [
        ("rdma", inter, equal_blocks(rdma[0] * row_bytes, rdma[1])),
        ("nvlink", intra, equal_blocks(nvlink[0] * row_bytes, nvlink[1])),
    ]
    combine = [
        ("nvlink", intra, equal_blocks(nvlink[0] * combine_bytes, nvlink[1])),
        ("rdma", inter, equal_blocks(rdma[0] * combine_bytes, rdma[1])),
    ]
    return dispatch, combine  # fmt: skip


def calls(ctx: Context, layers: int, tokens: int, row_bytes: int, phase: str) -> list[Call]:
    """Forward: dispatch (activation or fp8 rows) then combine; backward: the combine's gradient goes out
    the dispatch way and the dispatch's gradient comes back the combine way, both in the hidden states' dtype
    (Context.hidden_dtype: bf16 under a training fp8 recipe)."""
    h, x = ctx.model.hidden_size, ctx.hidden_bytes
    if phase == "forward":
        dispatch, combine = legs(ctx, tokens, row_bytes, h * x)
        named = [("ep.dispatch", dispatch, ctx.work.moe_dispatch_dtype), ("ep.combine", combine, None)]
    else:
        dispatch, combine = legs(ctx, tokens, h * x, h * x)
        named = [("ep.combine.bwd", dispatch, None), ("ep.dispatch.bwd", combine, None)]
    out = []
    for name, path, dtype in named:
        for leg, group, message in path:
            out.append(
                Call(
                    name=f"{name}.{leg}",
                    op=Op.ALLTOALL,
                    phase=phase,
                    message_bytes=message,
                    calls_per_iteration=layers,
                    group=group,
                    source=BACKENDS[ctx.par.ep_dispatch] + (" inter-node RDMA leg" if leg == "rdma" else " NVLink leg"),
                    dtype=dtype or ctx.hidden_dtype,
                    parallelism="ep",
                    kernel=name if len(path) > 1 else "",  # two legs pipelined in one kernel (Call.kernel)
                    # DeepEP's RDMA leg goes through the NICs between its groups of 8 (module docstring)
                    nvlink_peers=NUM_MAX_NVL_PEERS if leg == "rdma" and ctx.par.ep_dispatch == "deepep" else 0,
                    sms=KERNEL_SMS[ctx.par.ep_dispatch],
                    achieved=ACHIEVED[ctx.par.ep_dispatch],
                )
            )
    return out
