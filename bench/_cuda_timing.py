"""What the kernel-measurement scripts share (bench/measure_dropout.py, bench/measure_attention_dropout.py): the SM
clock nvidia-smi reads, and a call's time from CUDA events around back-to-back calls lasting about ``burst_ms``
(one call sizes the burst). Needs torch and a CUDA GPU; the product and its tests never import it."""

from __future__ import annotations

import math
import subprocess

import torch


def sm_clock_mhz() -> float:
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=clocks.sm", "--format=csv,noheader,nounits"], capture_output=True, text=True
    )
    return float(out.stdout.split()[0])


def burst_s(fn, start, end, burst_ms: float, max_reps: int) -> float:
    """Seconds per call of ``fn`` (already warmed up), timed with the CUDA events ``start`` and ``end``."""
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    reps = max(3, min(max_reps, math.ceil(burst_ms / start.elapsed_time(end))))
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / reps
