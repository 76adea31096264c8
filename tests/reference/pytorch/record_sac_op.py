"""Records which tensor-parallel collectives torchtitan's per-op selective activation checkpointing issues again
in the backward: one Llama block (RMSNorm, q/k/v/o, SwiGLU; h 64, 8 heads, 16 tokens, fp32) on 2 CPU ranks with
gloo and DTensor, torchtitan's TP plan (colwise q, k, v, w1, w3; rowwise o, w2; SequenceParallel norms with
sequence parallelism), checkpointed as torchtitan b5bcd76 distributed/activation_checkpoint.py wraps a block:
``op`` its SelectiveAC policy (save the compute-intensive ops but every second mm, and reduce_scatter_tensor /
all_to_all_single; early_stop=False), ``full`` FullAC (early_stop=False), ``none`` no checkpoint. The c10d calls
of the forward and of the backward are counted with torch.profiler.

Run (needs torch; not part of the suite): for sp in 1 0; for mode in none op full:
``SP=$sp MODE=$mode python -m torch.distributed.run --nproc-per-node 2 record_sac_op.py`` prints one JSON line
per run; sac_op_tp2.json holds them.
"""

import collections
import json
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from torch.profiler import ProfilerActivity, profile
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

SP = os.environ.get("SP", "1") == "1"
MODE = os.environ.get("MODE", "op")
H, HEADS, TOKENS = 64, 8, 16


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(H, H, bias=False) for _ in range(4))

    def forward(self, x):
        q, k, v = (w(x) for w in (self.wq, self.wk, self.wv))
        b, t, _ = q.shape
        q, k, v = (z.view(b, t, -1, H // HEADS).transpose(1, 2) for z in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, t, -1))


class FeedForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1, self.w3 = nn.Linear(H, 4 * H, bias=False), nn.Linear(H, 4 * H, bias=False)
        self.w2 = nn.Linear(4 * H, H, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention_norm, self.attention = nn.RMSNorm(H), Attention()
        self.ffn_norm, self.feed_forward = nn.RMSNorm(H), FeedForward()

    def forward(self, x):
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


def op_policy():
    """torchtitan SelectiveAC._get_custom_policy with its save list (get_save_ops) as it applies on CPU."""
    mm = (torch.ops.aten.mm.default, torch.ops.aten.linear.default)
    save = {
        *mm,
        torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
        torch.ops.aten._scaled_dot_product_attention_math.default,
        torch.ops.aten.max.default,
        torch.ops._c10d_functional.reduce_scatter_tensor.default,
        torch.ops._c10d_functional.all_to_all_single.default,
    }
    counts = {"forward": 0, "recompute": 0}

    def policy(ctx, func, *args, **kwargs):
        mode = "recompute" if ctx.is_recompute else "forward"
        if func in mm:
            counts[mode] += 1
        if func in save:
            if func in mm and counts[mode] % 2 == 0:
                return CheckpointPolicy.PREFER_RECOMPUTE
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def c10d_calls(prof) -> dict:
    return dict(sorted(collections.Counter(e.name for e in prof.events() if e.name.startswith("c10d::")).items()))


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (2,))
    torch.manual_seed(0)
    block = Block()
    seq = Shard(1) if SP else Replicate()
    plan = {
        "attention": PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),)),
        "attention.wq": ColwiseParallel(),
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=seq),
        "feed_forward": PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),)),
        "feed_forward.w1": ColwiseParallel(),
        "feed_forward.w3": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(output_layouts=seq),
    }
    if SP:
        plan |= {"attention_norm": SequenceParallel(), "ffn_norm": SequenceParallel()}
    parallelize_module(block, mesh, plan)
    x = torch.randn(1, TOKENS, H)
    x = (x.chunk(2, dim=1)[rank] if SP else x).requires_grad_()
    if MODE == "op":
        policy = op_policy()
        run = lambda: checkpoint(  # noqa: E731
            block, x, use_reentrant=False, early_stop=False,
            context_fn=lambda: create_selective_checkpoint_contexts(policy),
        )  # fmt: skip
    elif MODE == "full":
        run = lambda: checkpoint(block, x, use_reentrant=False, early_stop=False)  # noqa: E731
    else:
        run = lambda: block(x)  # noqa: E731
    with profile(activities=[ProfilerActivity.CPU]) as forward:
        out = run()
    with profile(activities=[ProfilerActivity.CPU]) as backward:
        out.pow(2).sum().backward()
    if rank == 0:
        record = {"sequence_parallel": SP, "mode": MODE, "torch": torch.__version__}
        print(json.dumps(record | {"forward": c10d_calls(forward), "backward": c10d_calls(backward)}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
