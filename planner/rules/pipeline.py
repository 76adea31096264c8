"""Pipeline parallelism traffic (megatron/core/pipeline_parallel/schedules.py, p2p_communication.py;
torch.distributed.pipelining).

Per micro-batch each stage boundary carries the activations forward and their gradient backward, one
tensor of b·s/c·h·x (divided by tp with sequence parallelism: Megatron sends the sequence-sharded tensor,
get_tensor_shapes). GPipe and 1F1B send the same tensors, only the order differs. The interleaved schedule
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

SOURCE = "megatron/core/pipeline_parallel/schedules.py, p2p_communication.py"
TORCH = "torch.distributed.pipelining; reference/pytorch/pp2_1f1b.json"


def calls(ctx: Context) -> list[Call]:
    if ctx.par.pp == 1:
        return []
    p, v, m = ctx.par.pp, ctx.par.chunks_per_rank, ctx.micro_batches
    message = ctx.activation // (ctx.par.tp if ctx.par.sp else 1)
    src = TORCH if ctx.flavour == "torch" else SOURCE
    out = []
    for stage in range(p):
        forward_sends = v - (1 if stage == p - 1 else 0)
        backward_sends = v - (1 if stage == 0 else 0)
        if forward_sends:
            out.append(
                Call(
                    name="pp.activation",
                    op=Op.SENDRECV,
                    phase="forward",
                    message_bytes=message,
                    calls_per_iteration=forward_sends * m,
                    group=Group(("pp",), pairs="pp+1"),
                    source=src,
                    stages=(stage,),
                    dtype=ctx.work.activation_dtype,
                )
            )
        if backward_sends and ctx.training:
            out.append(
                Call(
                    name="pp.activation_grad",
                    op=Op.SENDRECV,
                    phase="backward",
                    message_bytes=message,
                    calls_per_iteration=backward_sends * m,
                    group=Group(("pp",), pairs="pp-1"),
                    source=src,
                    stages=(stage,),
                    dtype=ctx.work.activation_dtype,
                )
            )
    # MTP modules read the word embedding on the last stage too: Megatron-Core finalize_model_grads.py
    # _get_shared_word_embedding_weight reduces it "if share_embeddings_and_output_weights or mtp_num_layers"
    shared = ctx.model.tied_embeddings or ctx.model.mtp_layers > 0
    if ctx.training and shared and ctx.flavour != "torch":
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
