"""Pipeline parallelism traffic (megatron/core/pipeline_parallel/schedules.py, p2p_communication.py;
torch.distributed.pipelining).

Per micro-batch each chunk boundary between two ranks (``boundary_sends``: the layout's chunks, planner/
parallel.py) carries the activations forward and their gradient backward, one
tensor of b·s/c·h·x (divided by tp with sequence parallelism: Megatron sends the sequence-sharded tensor,
get_tensor_shapes), in the pipeline dtype: bf16 under an fp8 recipe (Megatron-LM 92c8482e6d
p2p_communication.py allocates its receive buffers with config.pipeline_dtype, which megatron/training/arguments.py
core_transformer_config_from_args sets to args.params_dtype (kw_args['pipeline_dtype']); the fp8 casts happen
inside TE's linears; Context.activation).
GPipe and 1F1B send the same tensors, only the order differs. The interleaved schedule
gives every rank v model chunks, so a micro-batch crosses p·v - 1 boundaries: each rank sends v times
forward (the last rank v-1) and v times backward (the first rank v-1), the last rank's chunk j feeding
the first rank's chunk j+1. Tied input/output embeddings on different stages have their gradients
all-reduced between the first and the last stage once per iteration (finalize_model_grads.py
_allreduce_word_embedding_grads).
"""

from __future__ import annotations

from collectives import Op

from ..context import Context
from ..layout import Group
from ..ledger import Call
from ..parallel import rank_of


def calls(ctx: Context) -> list[Call]:
    if ctx.par.pp == 1:
        return []
    p, m = ctx.par.pp, ctx.passes
    gather = scatter_gather(ctx)
    message = ctx.activation // (ctx.par.tp if ctx.par.sp or gather else 1)
    src = ctx.par.schedule.source or ctx.flavour.pp_source
    out = []
    # m: a rank's passes over its chunks (Context.passes, m / 2 under DualPipe; Context.micro_batches is m);
    # DualPipe's pass is one micro-batch each way, each crossing each boundary once (dualpipe.py num_chunks // 2 a
    # direction), its chunks' sends one of each
    shapes = mtp_standalone(ctx)
    for stage, (fwd, bwd) in enumerate(boundary_sends(ctx)):
        for phase, sends, name in (("forward", fwd, "pp.activation"), ("backward", bwd, "pp.activation_grad")):
            if phase == "backward" and not ctx.training:
                continue
            for (pairs, width), count in sorted(sends.items()):
                tensor = name + (".mtp" if width > 1 else "")  # in the hidden states' dtype (Context.activation)
                out.append(_send(tensor, phase, message * width, count * m, pairs, src, stage, ctx.hidden_dtype))
            if shapes:
                out += _shape_sends(ctx, stage, phase, sends, m)
            if gather:
                out += _gathers(ctx, stage, phase, sends, message, m)
            if gather and phase == "forward" and ctx.training and ctx.flavour.pp_regathers_output:
                out += _regathers(ctx, stage, sends, message, m)
    # MTP modules read the word embedding on the last stage too: Megatron-Core finalize_model_grads.py
    # _get_shared_word_embedding_weight reduces it "if share_embeddings_and_output_weights or mtp_num_layers"
    shared = ctx.model.tied_embeddings or ctx.model.mtp_layers > 0
    ends_apart = not (ctx.is_first(0) and ctx.is_last(0))  # a V holds the embedding and the output layer on rank 0
    if ctx.training and shared and ctx.flavour.tied_embedding_allreduce and ends_apart:
        vocab = ctx.model.padded_vocab(ctx.par.tp) // ctx.par.tp
        grads = vocab * ctx.model.hidden_size * ctx.grad_bytes
        out.append(
            Call(
                name="embedding.tied_grads",
                op=Op.ALLREDUCE,
                phase="optimizer",
                message_bytes=grads,
                calls_per_iteration=1,
                group=Group(("pp",), pairs="ends"),
                source="megatron/core/distributed/finalize_model_grads.py _allreduce_word_embedding_grads",
                stages=(0, p - 1),
                dtype=ctx.grad_dtype,
            )
        )
    return out


SHAPE_BYTES = 3 * 8  # torch.tensor(tensor.size(), dtype=torch.int64) of an [s, b, h] activation
# the shape exchange's rows (forward, backward): the step time adds their price to each boundary's send
# (step.stream_totals), as they are waited on before the tensor goes
SHAPE_CALLS = ("pp.shape", "pp.shape_grad")
SHAPE_SOURCE = (
    "Megatron-LM d98e8a6 megatron/core/pipeline_parallel/p2p_communication.py _communicate -> _communicate_shapes "
    "(config.mtp_standalone, set by pipeline_parallel_layer_layout.py validate_layer_layout)"
)


# Megatron-LM's scatter/gather (Flavour.pp_scatter_gather): the receiver's TP all-gather of the 1/t chunks (forward,
# backward); the step time adds its price to each boundary's send (step.stream_totals), as the receive returns
# only after it (p2p_communication.py _communicate at 6985e58: gather_split_1d_tensor after the requests' wait);
# DeepSpeed's sender re-gathers its own output before the backward (Flavour.pp_regathers_output, _regathers)
GATHER_CALLS = ("pp.gather", "pp.gather_grad", "pp.gather_output")
REGATHER_SOURCE = (
    "DeepSpeed edaa722 (and cd7967d6b, 2021-10) deepspeed/runtime/pipe/engine.py: _exec_forward_pass partitions the "
    "output it sends (PartitionedTensor over the slice-parallel group, first_output.data = torch.zeros(1)); "
    "_exec_backward_pass rebuilds it, part_output.full() (dist.all_gather), when pipe_partitioned and "
    "grad_partitioned (runtime/config.py defaults True)"
)
_RECEIVER = {"pp+1": 1, "pp-1": -1}  # the boundary_sends direction -> the receiving stage's offset


def scatter_gather(ctx: Context) -> bool:
    """Whether each TP rank sends 1/t of the boundary tensor and the receiver all-gathers it: the flavour's
    scatter/gather, without sequence parallelism (which already sends the sequence shard), with tp > 1."""
    return ctx.flavour.pp_scatter_gather and not ctx.par.sp and ctx.par.tp > 1


def _gathers(ctx: Context, stage: int, phase: str, sends: dict, chunk: int, per_send: int) -> list[Call]:
    """The TP all-gathers that rebuild the tensors ``stage`` sends, on the stages that receive them
    (gather_split_1d_tensor: torch.distributed.all_gather of the 1/t chunks into the whole tensor, the message
    its gathered output)."""
    p, tp = ctx.par.pp, ctx.par.tp
    counts: dict[tuple[int, int], int] = {}
    for (pairs, width), count in sends.items():
        key = ((stage + _RECEIVER[pairs]) % p, width)
        counts[key] = counts.get(key, 0) + count
    return [
        Call(
            name=GATHER_CALLS[phase != "forward"],
            op=Op.ALLGATHER,
            phase=phase,
            message_bytes=chunk * tp * width,
            calls_per_iteration=count * per_send,
            group=Group(("tp",)),
            source=ctx.flavour.pp_source,
            stages=(receiver,),
            dtype=ctx.hidden_dtype,
        )
        for (receiver, width), count in sorted(counts.items())
    ]


def _regathers(ctx: Context, stage: int, sends: dict, chunk: int, per_send: int) -> list[Call]:
    """The TP all-gathers with which a DeepSpeed stage rebuilds, before each micro-batch's backward, the output it
    sent forward as 1/t partitions and freed (``REGATHER_SOURCE``): one per forward send, on the sender, in the
    backward (the last stage sends none and runs its backward from the loss)."""
    counts: dict[int, int] = {}
    for (_pairs, width), count in sends.items():
        counts[width] = counts.get(width, 0) + count
    return [
        Call(
            name=GATHER_CALLS[2],
            op=Op.ALLGATHER,
            phase="backward",
            message_bytes=chunk * ctx.par.tp * width,
            calls_per_iteration=count * per_send,
            group=Group(("tp",)),
            source=REGATHER_SOURCE,
            stages=(stage,),
            dtype=ctx.hidden_dtype,
        )
        for width, count in sorted(counts.items())
    ]


def mtp_standalone(ctx: Context) -> bool:
    """Megatron's ``mtp_standalone``: the layout puts the MTP layers on a rank other than the last
    (pipeline_parallel_layer_layout.py validate_layer_layout: ``LayerType.mtp in self.layout[pp_rank][-1] and
    pp_rank != pipeline_model_parallel_size - 1``), under a flavour whose p2p then exchanges shapes and a
    schedule run by the framework's own p2p (``ScheduleTraits.source`` empty; DualPipe's and the zero-bubble
    schedules' p2p send fixed shapes)."""
    if not ctx.flavour.mtp_standalone_shapes or ctx.par.schedule.source or not ctx.model.mtp_layers:
        return False
    return any(c.mtp and c.rank != ctx.par.pp - 1 for chunks in ctx.chunks for c in chunks)


def _shape_sends(ctx: Context, stage: int, phase: str, sends: dict, per_send: int) -> list[Call]:
    """With ``mtp_standalone`` every ``_communicate`` sends each tensor's shape (3 int64) before it, on every
    rank (the flag is global): one shape send per activation (or gradient) send, to the same peer, waited on and
    followed by a torch.cuda.synchronize() before the tensor goes (so it adds a round trip to each boundary;
    the step time adds the largest shape send to the largest tensor send of every boundary:
    step.stream_totals)."""
    counts: dict[str, int] = {}
    for (pairs, _width), count in sends.items():
        counts[pairs] = counts.get(pairs, 0) + count
    name = SHAPE_CALLS[phase != "forward"]
    return [
        _send(name, phase, SHAPE_BYTES, count * per_send, pairs, SHAPE_SOURCE, stage, "int64")
        for pairs, count in sorted(counts.items())
    ]


def _send(name: str, phase: str, message: int, count: int, pairs: str, source: str, stage: int, dtype: str) -> Call:
    """A send across ``stage``'s pipeline boundaries: a SendRecv of ``message`` bytes over the pp pairs ``pairs``
    (boundary_sends' direction, "pp+1" / "pp-1"), issued on that stage alone: the activation (or gradient) sends
    and, with mtp_standalone, their shape sends."""
    return Call(
        name=name,
        op=Op.SENDRECV,
        phase=phase,
        message_bytes=message,
        calls_per_iteration=count,
        group=Group(("pp",), pairs=pairs),
        source=source,
        stages=(stage,),
        dtype=dtype,
    )


def boundary_sends(ctx: Context) -> list[tuple[dict[tuple[str, int], int], dict[tuple[str, int], int]]]:
    """Per pipeline rank, the chunk boundaries it sends across per micro-batch, forward and backward, by
    (direction "pp+1" / "pp-1", width): chunk k sends its output to the rank of chunk k + 1 and its input
    gradient to the rank of chunk k - 1, unless that is the rank itself (the turn of a V). An empty chunk
    still passes the tensor on (Megatron builds it as an identity stage). The width is 1 but after a
    training MTP chunk that is not the loss's: MultiTokenPredictionBlock.forward returns the main hidden
    states concatenated with each module's (torch.cat(hidden_states_list, dim=0), Megatron-LM d98e8a6
    multi_token_prediction.py), so that boundary carries 1 + mtp tensors each way (and then every send of the
    step is preceded by its shape: ``mtp_standalone``, ``_shape_sends``)."""
    par, p = ctx.par, ctx.par.pp
    n = p * par.chunks_per_rank
    mtp_chunk = {c.index: c.mtp for chunks in ctx.chunks for c in chunks if c.mtp} if ctx.training else {}
    out = []
    for stage, chunks in enumerate(ctx.chunks):
        fwd: dict[tuple[str, int], int] = {}
        bwd: dict[tuple[str, int], int] = {}
        for c in chunks:
            for other, sends, step in ((c.index + 1, fwd, 1), (c.index - 1, bwd, -1)):
                if 0 <= other < n and (dest := rank_of(par, other)) != stage:
                    # the direction of travel, unless the V turns back (with pp 2 both reach the same rank)
                    ahead = dest == (stage + step) % p
                    pairs = ("pp+1" if step == 1 else "pp-1") if ahead else ("pp-1" if step == 1 else "pp+1")
                    width = 1 + mtp_chunk.get(min(c.index, other), 0)  # the boundary after an MTP chunk
                    sends[pairs, width] = sends.get((pairs, width), 0) + 1
        out.append((fwd, bwd))
    return out
