"""Kernel speed and memory, as ratios to softmax measured in the same run.

Time: median wall time of forward + backward over ``repeats`` runs after a warm-up.
Memory: bytes of the tensors autograd saves for backward (the activation memory a layer holds during training),
counted exactly with ``torch.autograd.graph.saved_tensors_hooks``; on CUDA, also the peak allocated memory.
"""
import statistics
import time
from typing import Dict, List, Sequence

import torch

from ..attention import build_attention


def _saved_bytes(fn) -> int:
    total = 0
    seen = set()

    def pack(t):
        nonlocal total
        key = (t.untyped_storage().data_ptr(), t.dtype, tuple(t.shape))
        if key not in seen:
            seen.add(key)
            total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return total, out


def measure(cfg, n_side: int, heads: int = 4, head_dim: int = 32, batch: int = 1, repeats: int = 5,
            device: str = 'cpu', dtype=torch.float32) -> Dict[str, float]:
    """One kernel at an (n_side x n_side) token grid: seconds for forward+backward and saved bytes."""
    torch.manual_seed(0)
    kern = build_attention(cfg, num_heads=heads, head_dim=head_dim).to(device)
    n = n_side * n_side
    q, k, v = (torch.randn(batch, heads, n, head_dim, device=device, dtype=dtype, requires_grad=True)
               for _ in range(3))

    def step():
        return kern(q, k, v, hw=(n_side, n_side))

    saved, out = _saved_bytes(step)
    out.float().sum().backward()
    times = []
    for _ in range(repeats):
        if device == 'cuda':
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        step().float().sum().backward()
        if device == 'cuda':
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return dict(seconds=statistics.median(times), saved_bytes=float(saved))


def compare(kernels: Sequence, sides: Sequence[int], reference='softmax', **kw) -> List[Dict]:
    """Rows of {kernel, N, seconds, time_ratio, saved_MiB, memory_ratio} against ``reference``."""
    rows = []
    for side in sides:
        ref = measure(reference, side, **kw)
        for cfg in kernels:
            m = ref if cfg == reference else measure(cfg, side, **kw)
            name = cfg if isinstance(cfg, str) else ','.join(f'{k}={v}' for k, v in cfg.items()).replace('type=', '')
            rows.append(dict(kernel=name, N=side * side, seconds=m['seconds'],
                             time_ratio=m['seconds'] / ref['seconds'], saved_MiB=m['saved_bytes'] / 2 ** 20,
                             memory_ratio=m['saved_bytes'] / max(ref['saved_bytes'], 1.0)))
    return rows


def markdown(rows: List[Dict]) -> str:
    lines = ['| kernel | N | fwd+bwd ms | time / softmax | saved MiB | memory / softmax |', '|---|---|---|---|---|---|']
    for r in rows:
        lines.append(f"| {r['kernel']} | {r['N']} | {r['seconds'] * 1e3:.1f} | {r['time_ratio']:.2f} | "
                     f"{r['saved_MiB']:.1f} | {r['memory_ratio']:.2f} |")
    return '\n'.join(lines)
