"""Speed, memory and FLOPs of attention kernels and backbones: the code behind ``tools/benchmark.py``.

The modes, each measured so that the ratios come from one run on one machine:

* ``kernels``: one attention call (B, h, N, d) per kernel and token count: forward (no grad) and forward + backward
  latency (median over repeats, the kernels alternating within each repeat), the peak memory a call adds on top of
  its inputs, the bytes autograd saves for backward, and GFLOP/s from the kernel's own multiply-add declaration
  (``AttentionKernel.flops``). ``matmul`` is a pseudo kernel: the plain ``(q @ k^T) @ v`` of the same size, the
  speed any attention kernel can hope for. Fitted log-log slopes over N and the N where a kernel overtakes softmax.
* ``backbone``: backbones x kernels x image sizes, each point in a fresh subprocess: forward and forward + backward
  latency, images/s, peak memory, parameters and GFLOPs (``analysis/flops.py``).
* ``compare``: our softmax backbones against the reference implementations (mmdet's Swin and PVTv2, timm's XCiT)
  with the same weights, outputs checked equal, the two models alternating in one process.
* ``detector``: one full Mask R-CNN training step (loss, backward, AdamW step) with our backbones (softmax, poly3,
  inline) and with mmdet's own Swin-T / PVTv2-b2 in the same detector, each in a fresh subprocess: images/s and
  peak memory, and the ratios the GPU targets read.

On CUDA, times come from CUDA events around each call; ``device_ceilings`` measures the GPU's own matrix rate
and copy bandwidth, against which the kernels' TFLOP/s and GB/s are reported.

Peak memory: on CUDA the allocator's ``max_memory_allocated``; on CPU the allocations torch's profiler records
(``profile_memory=True``: every allocation and free of the CPU allocator), whose running sum's maximum is the peak.
"""
import contextlib
import json
import math
import os
import statistics
import subprocess
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from ..attention import build_attention

DTYPES = {'fp32': torch.float32, 'bf16': torch.bfloat16, 'fp16': torch.float16, 'fp64': torch.float64}
PASSES = ('fwd', 'fwdbwd')


# ------------------------------------------------------------------------------------------- measurement
def synchronize(device) -> None:
    if torch.device(device).type == 'cuda':
        torch.cuda.synchronize(device)


CLOCKS = ('wall', 'cpu')


def timer(device, clock: str = 'wall') -> str:
    """What :func:`timed` measures with: 'cuda-events' on a CUDA device, else 'process-time' (clock='cpu') or
    'perf-counter'."""
    if clock == 'cpu':
        return 'process-time'
    return 'cuda-events' if torch.device(device).type == 'cuda' else 'perf-counter'


def cuda_event_seconds(fn: Callable, device) -> float:
    """Seconds of the GPU work of one call between two CUDA events on the current stream (the queue is drained
    first, so the start event is not waiting behind earlier work)."""
    synchronize(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def timed(fn: Callable, device, clock: str = 'wall') -> float:
    """Seconds of one call: wall time (device work included; on CUDA between CUDA events), or ``clock='cpu'``:
    this process's CPU time (on a machine shared with other jobs, with one thread, it counts only our own work;
    with several threads it also counts their spinning; CPU devices only)."""
    how = timer(device, clock)
    if how == 'process-time':
        t0 = time.process_time()
        fn()
        return time.process_time() - t0
    if how == 'cuda-events':
        return cuda_event_seconds(fn, device)
    synchronize(device)
    t0 = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - t0


@contextlib.contextmanager
def _quiet_profiler():
    """Kineto writes start/stop lines to stderr (fd 2) on every profile: hide them for the memory runs."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(devnull)
        os.close(saved)


def peak_memory(fn: Callable, device) -> int:
    """Bytes the call holds at its peak beyond what was allocated before it (inputs, weights)."""
    dev = torch.device(device)
    if dev.type == 'cuda':
        synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        base = torch.cuda.memory_allocated(dev)
        fn()
        synchronize(dev)
        return int(torch.cuda.max_memory_allocated(dev) - base)
    from torch.profiler import ProfilerActivity, profile

    with _quiet_profiler(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == '[memory]' and e.device_type() ==
              torch.autograd.DeviceType.CPU]
    current = peak = 0
    for e in sorted(events, key=lambda e: e.start_ns()):
        current += e.nbytes()
        peak = max(peak, current)
    return int(peak)


def saved_bytes(fn: Callable, storages: bool = False, exclude: Sequence[torch.Tensor] = ()) -> int:
    """Bytes of the distinct tensors autograd saves for backward during ``fn``. ``storages=True``: the bytes those
    saved tensors keep allocated until backward, i.e. each distinct storage counted whole (a saved view keeps its
    whole base), leaving out the storages of ``exclude`` (a model's parameters and buffers, allocated anyway)."""
    total, seen = 0, set()
    skip = {t.untyped_storage().data_ptr() for t in exclude}

    def pack(t):
        nonlocal total
        st = t.untyped_storage()
        key = st.data_ptr() if storages else (st.data_ptr(), t.dtype, tuple(t.shape))
        if key not in seen and not (storages and (key in skip or key == 0)):
            seen.add(key)
            total += st.nbytes() if storages else t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return total


def fit_slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope of log(y) against log(x)."""
    lx, ly = [math.log(x) for x in xs], [math.log(max(y, 1e-30)) for y in ys]
    mx, my = statistics.fmean(lx), statistics.fmean(ly)
    den = sum((a - mx) ** 2 for a in lx)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / den if den else float('nan')


def crossover(ns: Sequence[int], ours: Sequence[float], ref: Sequence[float]) -> Optional[float]:
    """The N (log-log interpolated) from which ``ours`` stays below ``ref``: None if it never gets below at the
    largest N, ns[0] if it is below everywhere."""
    if not ns or ours[-1] >= ref[-1]:
        return None
    i = len(ns) - 1
    while i > 0 and ours[i - 1] < ref[i - 1]:
        i -= 1
    if i == 0:
        return float(ns[0])
    r0, r1 = math.log(ours[i - 1] / ref[i - 1]), math.log(ours[i] / ref[i])  # r0 >= 0 > r1
    t = r0 / (r0 - r1)
    return math.exp(math.log(ns[i - 1]) + t * (math.log(ns[i]) - math.log(ns[i - 1])))


# ------------------------------------------------------------------------------------------- kernels
def kernel_label(cfg) -> str:
    if isinstance(cfg, str):
        return cfg
    rest = ','.join(f'{k}={v}' for k, v in cfg.items() if k != 'type')
    return f"{cfg['type']}:{rest}" if rest else cfg['type']


class _Matmul(torch.nn.Module):
    """``(q @ k^T) @ v``: the two matrix products of attention at the same size, without an activation."""

    def forward(self, q, k, v, hw=None):
        return (q @ k.transpose(-2, -1)) @ v

    @staticmethod
    def flops(nq, nk, d, dv, masked=False):
        return nq * nk * (d + dv)


def build_kernel(cfg, heads: int, head_dim: int):
    if cfg == 'matmul':
        return _Matmul()
    return build_attention(cfg, num_heads=heads, head_dim=head_dim)


def _side(n: int) -> Tuple[int, int]:
    """A token grid for N tokens (kernels with a grid need one): the most square factorisation."""
    h = math.isqrt(n)
    while n % h:
        h -= 1
    return h, n // h


# tensors of (B, h, N, d) a pass must read or write at the least: q, k, v, out (forward); then dout, q, k, v in and
# dq, dk, dv out (backward). Their bytes over the time give the kernels' achieved bandwidth (a lower bound).
IO_TENSORS = {'fwd': 4, 'fwdbwd': 11}


def io_bytes(p: str, batch: int, heads: int, n: int, head_dim: int, dtype: torch.dtype) -> int:
    return IO_TENSORS[p] * batch * heads * n * head_dim * torch.empty(0, dtype=dtype).element_size()


def device_ceilings(device, dtype: torch.dtype = torch.bfloat16, n: int = 8192, copy_mib: int = 1024,
                    repeats: int = 10) -> Dict:
    """The device's own ceilings, measured here: the dense matrix rate of an n x n x n product in ``dtype``
    (TFLOP/s, 2 n^3 flops) and the bandwidth of a device-to-device copy of ``copy_mib`` MiB (GB/s, bytes read
    and written), each the median of ``repeats`` timed calls after two warm-ups."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    src = torch.empty(copy_mib * 2 ** 20, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)

    def best(fn):
        for _ in range(2):
            fn()
        return statistics.median(timed(fn, device) for _ in range(repeats))

    mm = best(lambda: a @ b)
    cp = best(lambda: dst.copy_(src))
    return dict(device=str(device), dtype=str(dtype).replace('torch.', ''), matrix_n=n,
                matrix_TFLOP_per_s=2 * n ** 3 / mm / 1e12, copy_MiB=copy_mib,
                copy_GB_per_s=2 * src.numel() / cp / 1e9, timer=timer(device))


def run_kernels(kernels: Sequence, tokens: Sequence[int], heads: int = 1, head_dim: int = 64, batch: int = 1,
                dtype: torch.dtype = torch.float32, device='cpu', repeats: int = 3, passes=PASSES,
                memory: bool = True, reference='softmax', log=None, clock: str = 'wall',
                ceilings: Optional[Dict] = None) -> List[Dict]:
    """Rows of {kernel, N, pass, ms, peak_MiB, saved_MiB, GFLOPs, GFLOP_per_s, TFLOP_per_s, GB_per_s,
    time_ratio, memory_ratio}; with ``ceilings`` (:func:`device_ceilings`) also ``of_matrix_rate`` and
    ``of_copy_bandwidth``: the fractions of the device's measured matrix rate and copy bandwidth reached.

    At each N every kernel is warmed up, then timed ``repeats`` times with the kernels alternating (the order
    rotates every repeat); memory is measured once (it is deterministic). Ratios are against ``reference`` at the
    same N and pass when it is among ``kernels``: ``time_ratio`` is the median over the repeats of the kernel's time
    over the reference's time in the same repeat (a slow phase of the machine that spans a repeat moves both), and
    ``time_ratio_range`` the lowest and highest of those per-repeat ratios.
    """
    rows = []
    for n in tokens:
        torch.manual_seed(0)
        hw = _side(n)
        kerns = [build_kernel(c, heads, head_dim).to(device) for c in kernels]
        q, k, v = (torch.randn(batch, heads, n, head_dim, device=device, dtype=dtype) for _ in range(3))
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]

        def fwd(kern):
            with torch.no_grad():
                kern(q, k, v, hw=hw)

        def fwdbwd(kern):
            for t in leaves:
                t.grad = None
            kern(*leaves, hw=hw).float().sum().backward()

        fns = {'fwd': fwd, 'fwdbwd': fwdbwd}
        times = {(i, p): [] for i in range(len(kerns)) for p in passes}
        for i, kern in enumerate(kerns):  # warm-up
            for p in passes:
                fns[p](kern)
        for r in range(repeats):
            for step in range(len(kerns)):
                i = (step + r) % len(kerns)
                for p in passes:
                    times[(i, p)].append(timed(lambda: fns[p](kerns[i]), device, clock))
        for i, (cfg, kern) in enumerate(zip(kernels, kerns)):
            macs = batch * heads * kern.flops(n, n, head_dim, head_dim)
            for p in passes:
                sec = statistics.median(times[(i, p)])
                row = dict(kernel=kernel_label(cfg), N=n, heads=heads, head_dim=head_dim, batch=batch,
                           dtype=str(dtype).replace('torch.', ''), device=str(device), threads=torch.get_num_threads(),
                           clock=clock, **{'pass': p}, ms=sec * 1e3, GFLOPs=2 * macs / 1e9 * (1 if p == 'fwd' else 3),
                           _times=times[(i, p)])
                row['GFLOP_per_s'] = row['GFLOPs'] / sec
                row['TFLOP_per_s'] = row['GFLOP_per_s'] / 1e3
                row['GB_per_s'] = io_bytes(p, batch, heads, n, head_dim, dtype) / sec / 1e9
                if ceilings:
                    row['of_matrix_rate'] = row['TFLOP_per_s'] / ceilings['matrix_TFLOP_per_s']
                    row['of_copy_bandwidth'] = row['GB_per_s'] / ceilings['copy_GB_per_s']
                row['timer'] = timer(device, clock)
                if memory:
                    row['peak_MiB'] = peak_memory(lambda: fns[p](kern), device) / 2 ** 20
                    if p == 'fwdbwd':
                        row['saved_MiB'] = saved_bytes(lambda: kern(*leaves, hw=hw)) / 2 ** 20
                rows.append(row)
                if log:
                    log(row)
        del kerns, q, k, v, leaves
        if torch.device(device).type == 'cuda':
            torch.cuda.empty_cache()  # the next N starts from the allocator's base again
    _add_ratios(rows, reference)
    for r in rows:
        del r['_times']
    return rows


def _add_ratios(rows: List[Dict], reference) -> None:
    ref = {(r['N'], r['pass']): r for r in rows if r['kernel'] == kernel_label(reference)}
    for r in rows:
        base = ref.get((r['N'], r['pass']))
        if base is None:
            continue
        per_repeat = [t / b for t, b in zip(r['_times'], base['_times'])]
        r['time_ratio'] = statistics.median(per_repeat)
        r['time_ratio_range'] = f'{min(per_repeat):.2f}..{max(per_repeat):.2f}'
        if 'peak_MiB' in r and base.get('peak_MiB'):
            r['memory_ratio'] = r['peak_MiB'] / base['peak_MiB']


def scaling(rows: List[Dict], reference='softmax') -> List[Dict]:
    """Per kernel and pass: log-log slope of latency and of peak memory over N, and the N from which the kernel
    is faster than ``reference`` (None: not within the measured range)."""
    out = []
    keys = []
    for r in rows:  # kernels in the order measured, forward before forward + backward
        if (r['kernel'], r['pass']) not in keys:
            keys.append((r['kernel'], r['pass']))
    keys.sort(key=lambda kp: ([r['kernel'] for r in rows].index(kp[0]), PASSES.index(kp[1])))
    ref_label = kernel_label(reference)
    for kernel, p in keys:
        pts = sorted((r for r in rows if r['kernel'] == kernel and r['pass'] == p), key=lambda r: r['N'])
        ns = [r['N'] for r in pts]
        row = dict(kernel=kernel, **{'pass': p}, N_min=ns[0], N_max=ns[-1],
                   time_slope=fit_slope(ns, [r['ms'] for r in pts]) if len(ns) > 1 else float('nan'))
        if all('peak_MiB' in r for r in pts) and len(ns) > 1:
            row['memory_slope'] = fit_slope(ns, [r['peak_MiB'] for r in pts])
        ref = {r['N']: r['ms'] for r in rows if r['kernel'] == ref_label and r['pass'] == p}
        if kernel != ref_label and all(n in ref for n in ns):
            row['faster_than_' + ref_label + '_from_N'] = crossover(ns, [r['ms'] for r in pts], [ref[n] for n in ns])
        out.append(row)
    return out


# ------------------------------------------------------------------------------------------- tables and files
def markdown(rows: List[Dict], columns: Sequence[str]) -> str:
    def fmt(v):
        if v is None:
            return '-'
        if isinstance(v, float):
            if math.isnan(v):
                return '-'
            return f'{v:.3g}' if abs(v) < 100 else f'{v:.0f}'
        return str(v)

    cols = [c for c in columns if any(c in r for r in rows)]
    lines = ['| ' + ' | '.join(cols) + ' |', '|' + '---|' * len(cols)]
    for r in rows:
        lines.append('| ' + ' | '.join(fmt(r.get(c)) for c in cols) + ' |')
    return '\n'.join(lines)


KERNEL_COLUMNS = ('kernel', 'N', 'pass', 'ms', 'time_ratio', 'time_ratio_range', 'peak_MiB', 'memory_ratio', 'saved_MiB',
                  'GFLOP_per_s', 'of_matrix_rate', 'GB_per_s', 'of_copy_bandwidth')


def write_csv(rows: List[Dict], path: str) -> None:
    import csv

    cols: List[str] = []
    for r in rows:
        cols += [c for c in r if c not in cols]
    with open(path, 'w', newline='') as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)


def plot(rows: List[Dict], path: str, reference='softmax') -> None:
    """Latency and peak memory against N, log-log, one line per kernel (forward + backward where measured),
    the fitted slope in the legend."""
    import matplotlib

    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    p = 'fwdbwd' if any(r['pass'] == 'fwdbwd' for r in rows) else 'fwd'
    fits = {s['kernel']: s for s in scaling(rows, reference) if s['pass'] == p}
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    for kernel, s in fits.items():
        pts = sorted((r for r in rows if r['kernel'] == kernel and r['pass'] == p), key=lambda r: r['N'])
        ns = [r['N'] for r in pts]
        axes[0].loglog(ns, [r['ms'] for r in pts], 'o-', label=f"{kernel} (slope {s['time_slope']:.2f})")
        if 'memory_slope' in s:
            axes[1].loglog(ns, [max(r['peak_MiB'], 1e-3) for r in pts], 'o-',
                           label=f"{kernel} (slope {s['memory_slope']:.2f})")
    what = 'forward + backward' if p == 'fwdbwd' else 'forward'
    axes[0].set(xlabel='tokens N', ylabel=f'{what} ms', title='latency')
    axes[1].set(xlabel='tokens N', ylabel='peak MiB beyond the inputs', title='memory')
    for ax in axes:
        ax.grid(True, which='both', alpha=0.3)
        ax.legend(fontsize=7)
    r0 = rows[0]
    fig.suptitle(f"B={r0['batch']} heads={r0['heads']} head_dim={r0['head_dim']} {r0['dtype']} {r0['device']} "
                 f"threads={r0['threads']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ------------------------------------------------------------------------------------------- backbones
BN = dict(type='BN')
BACKBONES = {
    'swin_t': ('SoftFreeSwin', dict(arch='tiny')),
    'swin_s': ('SoftFreeSwin', dict(arch='small')),
    'pvt_v2_b0': ('SoftFreePVTv2', dict(arch='b0')),
    'pvt_v2_b2': ('SoftFreePVTv2', dict(arch='b2')),
    'pvt_s': ('SoftFreePVT', dict(arch='small')),
    'xcit_s12': ('SoftFreeXCiT', dict(arch='s12', patch_size=16, norm_cfg=BN)),
    'xcit_t12': ('SoftFreeXCiT', dict(arch='t12', patch_size=16, norm_cfg=BN)),
    'cswin_t': ('SoftFreeCSWin', dict(arch='tiny')),
}


def build_backbone(name: str, kernel='softmax', extra: Optional[dict] = None):
    """A backbone preset with ``kernel`` in every attention layer. Where the backbone's own layout refuses the
    kernel, the set-up that fits it (analysis/support.py) is used; returns (model, set-up label)."""
    from .. import models
    from .support import FITS

    if name not in BACKBONES:
        raise ValueError(f'unknown backbone {name!r}; valid: {", ".join(BACKBONES)}')
    cls_name, kw = BACKBONES[name]
    cls = getattr(models, cls_name)
    kw = dict(kw, attn_cfg=kernel, drop_path_rate=0.0, **(extra or {}))
    try:
        return cls(**kw), 'own layout'
    except ValueError:
        if cls_name not in FITS:
            raise
        label, fit = FITS[cls_name]
        return cls(**dict(kw, **fit)), label


def _step_fns(model, x, device):
    def fwd():
        with torch.no_grad():
            model(x)

    def fwdbwd():
        model.zero_grad(set_to_none=True)
        outs = model(x)
        sum(o.float().sum() for o in (outs if isinstance(outs, (tuple, list)) else [outs])).backward()

    return dict(fwd=fwd, fwdbwd=fwdbwd)


def backbone_point(name: str, kernel, size: Tuple[int, int], batch: int = 1, dtype='fp32', device='cpu',
                   repeats: int = 3, flops: bool = True, clock: str = 'wall') -> Dict:
    """One backbone x kernel x image size, measured in this process (``backbone`` mode runs each in a fresh
    one): ms, images/s and peak MiB for forward and forward + backward, parameters (M), GFLOPs."""
    import softfree_mm  # noqa: F401  (registers, applies compat)

    torch.manual_seed(0)
    model, setup = build_backbone(name, kernel)
    model = model.to(device).train()  # train mode: drop path is 0, BN uses batch statistics as in training
    dt = DTYPES[dtype]
    x = torch.randn(batch, 3, *size, device=device)
    ctx = (torch.autocast(torch.device(device).type, dtype=dt) if dt in (torch.bfloat16, torch.float16)
           else contextlib.nullcontext())
    fns = _step_fns(model, x, device)
    row = dict(backbone=name, kernel=kernel_label(kernel), setup=setup, size=f'{size[0]}x{size[1]}', batch=batch,
               dtype=dtype, device=str(device), threads=torch.get_num_threads(), clock=clock,
               params_M=sum(p.numel() for p in model.parameters()) / 1e6)
    with ctx:
        for p, fn in fns.items():
            fn()  # warm-up
            row[f'{p}_ms'] = statistics.median(timed(fn, device, clock) for _ in range(repeats)) * 1e3
            row[f'{p}_peak_MiB'] = peak_memory(fn, device) / 2 ** 20
    row['images_per_s'] = batch / row['fwd_ms'] * 1e3
    if flops:
        from .flops import count_flops

        model.eval()
        row['GFLOPs'] = count_flops(model, (1, 3, *size))['total'] / 1e9
    return row


def run_backbones(backbones: Sequence[str], kernels: Sequence, sizes: Sequence[Tuple[int, int]], batch=1,
                  dtype='fp32', device='cpu', repeats=3, flops=True, log=None, clock='wall') -> List[Dict]:
    """Every point in a fresh Python process (peak memory and caches of one point do not leak into the next)."""
    rows = []
    for name in backbones:
        for kernel in kernels:
            for size in sizes:
                spec = dict(name=name, kernel=kernel, size=list(size), batch=batch, dtype=dtype, device=str(device),
                            repeats=repeats, flops=flops, clock=clock)
                proc = subprocess.run([sys.executable, '-m', 'softfree_mm.analysis.benchmark', 'point',
                                       json.dumps(spec)], capture_output=True, text=True,
                                      env=dict(os.environ, PYTHONWARNINGS='ignore'))
                lines = [ln for ln in proc.stdout.splitlines() if ln.startswith('{')]
                if proc.returncode != 0 or not lines:
                    err = (proc.stderr.strip().splitlines() or ['no output'])[-1]
                    row = dict(backbone=name, kernel=kernel_label(kernel), size=f'{size[0]}x{size[1]}', error=err)
                else:
                    row = json.loads(lines[-1])
                rows.append(row)
                if log:
                    log(row)
    return rows


def flops_table(backbones: Sequence[str], kernels: Sequence, sizes: Sequence[Tuple[int, int]], log=None) -> List[Dict]:
    """GFLOPs (attention included; multiply-adds) and parameters of every backbone x kernel x size."""
    import softfree_mm  # noqa: F401
    from .flops import count_flops

    rows = []
    for name in backbones:
        for kernel in kernels:
            torch.manual_seed(0)
            model, setup = build_backbone(name, kernel)
            for size in sizes:
                res = count_flops(model, (1, 3, *size))
                row = dict(backbone=name, kernel=kernel_label(kernel), setup=setup, size=f'{size[0]}x{size[1]}',
                           GFLOPs=res['total'] / 1e9, attention_GFLOPs=res['attention'] / 1e9,
                           params_M=res['params'] / 1e6, counter=res['counter'])
                rows.append(row)
                if log:
                    log(row)
    return rows


BACKBONE_COLUMNS = ('backbone', 'kernel', 'setup', 'size', 'fwd_ms', 'fwdbwd_ms', 'images_per_s', 'fwd_peak_MiB',
                    'fwdbwd_peak_MiB', 'params_M', 'GFLOPs', 'error')


# ------------------------------------------------------------------------------------------- compare
def _randomize_norms(model) -> None:
    with torch.no_grad():
        for name, p in model.named_parameters():
            if 'norm' in name or name.endswith(('ln.weight', 'ln.bias')):
                p.normal_(1.0 if name.endswith('weight') else 0.0, 0.1)


REFERENCES = {'swin_t': "mmdet's SwinTransformer (Swin-T)", 'pvt_v2_b2': "mmdet's PyramidVisionTransformerV2 (b2)",
              'xcit_s12': "timm's xcit_small_12_p16_224 features (blocks 3, 5, 7, 11) through the same "
                          "stride-fixing adapter as ours (official form: nn.ConvTranspose2d layers)"}
# a size where each reference computes exactly our function (mmdet's Swin attends to pad tokens and shifts a stage
# that is one window: at 448 every stage grid is a window multiple larger than a window)
PARITY_SIZE = (448, 448)


def reference_pair(name: str):
    """(ours, reference) with the same weights, both softmax, both returning the four stride 4-32 maps:
    swin_t vs mmdet's SwinTransformer, pvt_v2_b2 vs mmdet's PyramidVisionTransformerV2, xcit_s12 vs timm's
    xcit_small_12_p16_224 features (blocks 3, 5, 7, 11) put through a copy of our stride-fixing adapter in the
    official form, with ``nn.ConvTranspose2d`` layers (the work a detector on timm's XCiT needs too; timm has
    none)."""
    import copy

    import softfree_mm  # noqa: F401
    from ..models.backbones.pvt import convert_pvt_v2
    from ..models.backbones.swin import convert_swin
    from ..models.backbones.xcit import convert_xcit

    if name not in REFERENCES:
        raise ValueError(f"compare: unknown pair {name!r}; valid: {', '.join(REFERENCES)}")
    torch.manual_seed(0)
    if name == 'swin_t':
        from mmdet.models.backbones.swin import SwinTransformer

        ref = SwinTransformer(embed_dims=96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24), drop_path_rate=0.0)
        _randomize_norms(ref)
        ours, _ = build_backbone('swin_t')
        ours.load_state_dict(convert_swin(ref.state_dict()), strict=True)
        return ours, ref
    if name == 'pvt_v2_b2':
        from mmdet.models.backbones.pvt import PyramidVisionTransformerV2

        ref = PyramidVisionTransformerV2(embed_dims=64, num_layers=[3, 4, 6, 3], drop_path_rate=0.0)
        _randomize_norms(ref)
        ours, _ = build_backbone('pvt_v2_b2')
        ours.load_state_dict(convert_pvt_v2(mmdet_pvt_to_official(ref.state_dict())), strict=True)
        return ours, ref
    import timm

    timm_model = timm.create_model('xcit_small_12_p16_224', pretrained=False, drop_path_rate=0.0)
    _randomize_norms(timm_model)
    ours, _ = build_backbone('xcit_s12')
    missing, _ = ours.load_state_dict(convert_xcit(timm_model.state_dict()), strict=False)
    if not all(k.startswith('fpn') for k in missing):
        raise RuntimeError(f'compare: XCiT weights did not all convert: {missing}')
    adapter = copy.deepcopy([ours.fpn1, ours.fpn2, ours.fpn3, ours.fpn4])
    return ours, _TimmXCiTFeatures(timm_model, [official_deconvs(m) for m in adapter])


def official_deconvs(module: torch.nn.Module) -> torch.nn.Module:
    """``module`` with every subclass of ``nn.ConvTranspose2d`` in it (our ``BlockDeconv``) replaced by a plain
    ``nn.ConvTranspose2d`` holding the same weights: the official adapter's layers."""
    base = torch.nn.ConvTranspose2d

    def plain(m):
        new = base(m.in_channels, m.out_channels, m.kernel_size, stride=m.stride, padding=m.padding,
                   output_padding=m.output_padding, groups=m.groups, bias=m.bias is not None, dilation=m.dilation,
                   padding_mode=m.padding_mode)
        new.load_state_dict(m.state_dict())
        return new.to(m.weight.device, m.weight.dtype)

    if isinstance(module, base) and type(module) is not base:
        return plain(module)
    for name, child in module.named_children():
        setattr(module, name, official_deconvs(child))
    return module


class _TimmXCiTFeatures(torch.nn.Module):
    def __init__(self, model, adapter):
        super().__init__()
        self.model = model
        self.adapter = torch.nn.ModuleList(adapter)

    def forward(self, x):
        feats = self.model.forward_intermediates(x, indices=[3, 5, 7, 11], intermediates_only=True)
        return tuple(op(f) for op, f in zip(self.adapter, feats))


def mmdet_pvt_to_official(sd: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """mmdet's PyramidVisionTransformerV2 names -> the official release names (which our converter reads);
    the inverse of mmdet's own ``pvt_convert``."""
    import re

    out = {}
    for k, v in sd.items():
        m = re.match(r'layers\.(\d+)\.(\d+)\.(.*)', k)
        if not m:
            raise KeyError(f'mmdet_pvt_to_official: unexpected key {k}')
        s, part, rest = int(m.group(1)) + 1, int(m.group(2)), m.group(3)
        if part == 0:  # patch embedding
            rest = rest.replace('projection.', 'proj.')
            out[f'patch_embed{s}.{rest}'] = v
        elif part == 2:  # stage norm
            out[f'norm{s}.{rest}'] = v
        else:  # blocks
            b, tail = rest.split('.', 1)
            tail = (tail.replace('attn.attn.in_proj_weight', 'attn.in_proj_weight')
                    .replace('attn.attn.in_proj_bias', 'attn.in_proj_bias')
                    .replace('attn.attn.out_proj.', 'attn.proj.')
                    .replace('ffn.layers.0.', 'mlp.fc1.').replace('ffn.layers.1.', 'mlp.dwconv.dwconv.')
                    .replace('ffn.layers.4.', 'mlp.fc2.'))
            if tail.startswith('attn.in_proj_'):
                kind = tail.rsplit('_', 1)[-1]
                q, kv = v[:v.shape[0] // 3], v[v.shape[0] // 3:]
                out[f'block{s}.{b}.attn.q.{kind}'] = q
                out[f'block{s}.{b}.attn.kv.{kind}'] = kv
                continue
            if tail.startswith(('mlp.fc1.', 'mlp.fc2.')) and v.dim() == 4:
                v = v.flatten(1)  # mmdet's 1x1 convs -> the official linear layers
            out[f'block{s}.{b}.{tail}'] = v
    return out


def compare(names: Sequence[str], size: Tuple[int, int] = (512, 768), batch: int = 1, repeats: int = 5,
            device='cpu', log=None, clock: str = 'wall') -> List[Dict]:
    """Ours against the reference with the same weights: outputs checked at ``PARITY_SIZE`` (the largest absolute
    difference is reported), then forward and forward + backward at ``size`` timed with the two models
    alternating (the order swapped every repeat), and the peak memory of each. ``*_ms_*`` are the medians of each
    side's times; ``*_speed_ratio`` is the median over repeats of reference time / ours within the repeat, and
    ``*_ratio_range`` the lowest and highest of those per-repeat ratios."""
    rows = []
    for name in names:
        ours, ref = reference_pair(name)
        ours.to(device).eval()  # (mmdet's Swin.train() returns None: no chaining)
        ref.to(device).eval()
        with torch.no_grad():
            xp = torch.randn(1, 3, *PARITY_SIZE, device=device)
            diff = max(float((a - b).abs().max()) for a, b in zip(ours(xp), ref(xp)))
        ours.train()
        ref.train()
        x = torch.randn(batch, 3, *size, device=device)
        fo, fr = _step_fns(ours, x, device), _step_fns(ref, x, device)
        row = dict(backbone=name, reference=REFERENCES[name], size=f'{size[0]}x{size[1]}', batch=batch,
                   device=str(device), threads=torch.get_num_threads(), clock=clock, max_abs_diff=diff)
        for p in PASSES:
            fo[p]()
            fr[p]()
            to, tr = [], []
            for r in range(repeats):
                pair = [(fo[p], to), (fr[p], tr)]
                for fn, acc in (pair if r % 2 == 0 else pair[::-1]):
                    acc.append(timed(fn, device, clock))
            row[f'{p}_ms_ours'] = statistics.median(to) * 1e3
            row[f'{p}_ms_ref'] = statistics.median(tr) * 1e3
            # >= 1: ours at least as fast. Each repeat times the two back to back, so the ratio is taken per repeat
            # and the median of those reported: a slow phase of a shared machine hits both sides of a pair
            pairs = sorted(r_ / o_ for o_, r_ in zip(to, tr))
            row[f'{p}_speed_ratio'] = statistics.median(pairs)
            row[f'{p}_ratio_range'] = f'{pairs[0]:.2f}..{pairs[-1]:.2f}'
            mo, mr = peak_memory(fo[p], device), peak_memory(fr[p], device)
            row[f'{p}_peak_MiB_ours'], row[f'{p}_peak_MiB_ref'] = mo / 2 ** 20, mr / 2 ** 20
            row[f'{p}_memory_ratio'] = mo / max(mr, 1)  # <= 1: ours holds no more
        # what autograd keeps for backward after the forward (activations only: the storages of the saved tensors,
        # not the weights), read from the tensors themselves rather than from the allocator
        ko, kr = (kept_for_backward(m, x) for m in (ours, ref))
        row['kept_MiB_ours'], row['kept_MiB_ref'], row['kept_ratio'] = ko / 2 ** 20, kr / 2 ** 20, ko / max(kr, 1)
        rows.append(row)
        if log:
            log(row)
    return rows


COMPARE_COLUMNS = ('backbone', 'size', 'max_abs_diff', 'fwd_ms_ours', 'fwd_ms_ref', 'fwd_speed_ratio',
                   'fwd_ratio_range', 'fwdbwd_ms_ours', 'fwdbwd_ms_ref', 'fwdbwd_speed_ratio', 'fwdbwd_ratio_range',
                   'fwd_peak_MiB_ours', 'fwd_peak_MiB_ref', 'fwd_memory_ratio', 'fwdbwd_peak_MiB_ours',
                   'fwdbwd_peak_MiB_ref', 'fwdbwd_memory_ratio', 'kept_MiB_ours', 'kept_MiB_ref', 'kept_ratio')


def kept_for_backward(model: torch.nn.Module, x: torch.Tensor) -> int:
    """Bytes of activations that a training forward of ``model`` on ``x`` leaves for backward (the distinct
    storages of the tensors autograd saves, the model's parameters and buffers left out)."""
    was = model.training
    model.train()
    try:
        return saved_bytes(lambda: model(x), storages=True,
                           exclude=list(model.parameters()) + list(model.buffers()))
    finally:
        model.train(was)


# ------------------------------------------------------------------------------------------- detector
# Mask R-CNN + FPN as configs/maskrcnn_*.py build it; 'mmdet' is the same detector (neck, heads, recipe) with
# mmdet's own backbone in place of ours, so the ratios compare backbones only. mmdet's Swin-T is its config's
# (mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py) backbone; its PVTv2-b2 is PyramidVisionTransformerV2 with b2's layers.
MMDET_BACKBONES = {
    'swin_t': dict(type='mmdet.SwinTransformer', embed_dims=96, depths=[2, 2, 6, 2], num_heads=[3, 6, 12, 24],
                   window_size=7, mlp_ratio=4, qkv_bias=True, qk_scale=None, drop_rate=0.0, attn_drop_rate=0.0,
                   drop_path_rate=0.2, patch_norm=True, out_indices=(0, 1, 2, 3), with_cp=False,
                   convert_weights=True, init_cfg=None),
    'pvt_v2_b2': dict(type='mmdet.PyramidVisionTransformerV2', embed_dims=64, num_layers=[3, 4, 6, 3],
                      drop_path_rate=0.1, init_cfg=None),
}
DETECTOR_KERNELS = ('softmax', 'poly3', 'inline')
DETECTORS = tuple(f'{b}:{k}' for b in MMDET_BACKBONES for k in DETECTOR_KERNELS + ('mmdet',))
DETECTOR_SIZE = (800, 1216)  # the official Mask R-CNN scale (1333 x 800) as the pipelines pad it, landscape


def detector_config(name: str):
    """The model config of a ``backbone:kernel`` detector (one of DETECTORS), without pretrained weights, with
    BatchNorm in place of SyncBN (one process)."""
    import os.path as osp

    from ..engine.launch import load_config

    backbone, _, kernel = name.partition(':')
    if name not in DETECTORS:
        raise ValueError(f"detector: unknown detector {name!r}; valid: {', '.join(DETECTORS)}")
    root = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
    own = 'softmax' if kernel == 'mmdet' else kernel
    cfg = load_config(osp.join(root, 'configs', f'maskrcnn_{backbone}_{own}.py'))
    if kernel == 'mmdet':
        cfg.model.backbone = dict(MMDET_BACKBONES[backbone])
    else:
        cfg.model.backbone.pop('init_cfg', None)

    def no_sync(node):
        if isinstance(node, dict):
            for key, val in node.items():
                if key == 'norm_cfg' and isinstance(val, dict) and val.get('type') == 'SyncBN':
                    node[key] = dict(val, type='BN')
                else:
                    no_sync(val)
        elif isinstance(node, (list, tuple)):
            for val in node:
                no_sync(val)

    no_sync(cfg.model)
    return cfg


def detector_batch(size: Tuple[int, int], batch: int, seed: int = 0):
    """``batch`` random images of ``size`` (uint8, as the pipelines give them) with 5 ground-truth boxes each and
    masks that do not fill their boxes."""
    import numpy as np
    from mmdet.structures import DetDataSample
    from mmdet.structures.mask import BitmapMasks
    from mmengine.structures import InstanceData

    g = torch.Generator().manual_seed(seed)
    h, w = size
    inputs, samples = [], []
    for _ in range(batch):
        inputs.append(torch.randint(0, 256, (3, h, w), generator=g, dtype=torch.uint8))
        s = DetDataSample(metainfo=dict(img_shape=(h, w), ori_shape=(h, w), scale_factor=(1.0, 1.0),
                                        pad_shape=(h, w), batch_input_shape=(h, w)))
        xy = torch.rand(5, 2, generator=g) * torch.tensor([w * 0.6, h * 0.6])
        wh = (0.1 + 0.3 * torch.rand(5, 2, generator=g)) * torch.tensor([w, h])
        boxes = torch.cat([xy, xy + wh], 1)
        masks = np.zeros((5, h, w), np.uint8)
        for i, (x1, y1, x2, y2) in enumerate(boxes.round().int().tolist()):
            masks[i, y1:y2, x1:(x1 + x2) // 2 + 1] = 1
        s.gt_instances = InstanceData(bboxes=boxes, labels=torch.randint(0, 80, (5,), generator=g),
                                      masks=BitmapMasks(masks, h, w))
        samples.append(s)
    return dict(inputs=inputs, data_samples=samples)


def detector_point(name: str, size: Tuple[int, int] = DETECTOR_SIZE, batch: int = 2, dtype: str = 'fp32',
                   device='cpu', repeats: int = 3, warmup: int = 2) -> Dict:
    """One training step of a detector, measured in this process (``detector`` mode runs each in a fresh one):
    data preprocessing, the loss, backward and an AdamW step (lr 1e-4, wd 0.05), ``warmup`` steps first;
    the median step time over ``repeats``, images/s, and the allocator's peak over the timed steps (weights,
    optimizer state and activations: everything the step holds; CPU: the profiler's peak of one step beyond what
    was allocated before it)."""
    import importlib

    import softfree_mm  # noqa: F401  (registers, applies compat)

    cfg = detector_config(name)
    importlib.import_module('mmdet.utils').register_all_modules(init_default_scope=True)
    from mmdet.registry import MODELS

    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    model.init_weights()
    model = model.to(device).train()
    optim = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.05)
    dt = DTYPES[dtype]
    amp = (torch.autocast(torch.device(device).type, dtype=dt) if dt in (torch.bfloat16, torch.float16)
           else contextlib.nullcontext())
    raw = detector_batch(size, batch)
    last = [float('nan')]

    def step():
        data = model.data_preprocessor(raw, True)
        with amp:
            losses = model(**data, mode='loss')
        total = sum(v.sum() if torch.is_tensor(v) else sum(x.sum() for x in v)
                    for k, v in losses.items() if 'loss' in k)
        optim.zero_grad(set_to_none=True)
        total.float().backward()
        optim.step()
        last[0] = float(total.detach())

    for _ in range(warmup):
        step()
    dev = torch.device(device)
    if dev.type == 'cuda':
        synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
    times = [timed(step, device) for _ in range(repeats)]
    if dev.type == 'cuda':
        peak = torch.cuda.max_memory_allocated(dev)
    else:
        peak = peak_memory(step, device)
    backbone, _, kernel = name.partition(':')
    sec = statistics.median(times)
    return dict(detector=name, backbone=backbone, kernel=kernel, impl='mmdet' if kernel == 'mmdet' else 'ours',
                size=f'{size[0]}x{size[1]}', batch=batch, dtype=dtype, device=str(device), timer=timer(device),
                step_ms=sec * 1e3, images_per_s=batch / sec, peak_MiB=peak / 2 ** 20,
                params_M=sum(p.numel() for p in model.parameters()) / 1e6, loss=last[0])


def run_detectors(names: Sequence[str], size: Tuple[int, int] = DETECTOR_SIZE, batch: int = 2, dtype='fp32',
                  device='cpu', repeats: int = 3, log=None) -> List[Dict]:
    """Every detector in a fresh Python process (one's peak memory and caches do not reach the next), then the
    ratios (:func:`detector_ratios`)."""
    rows = []
    for name in names:
        spec = dict(name=name, size=list(size), batch=batch, dtype=dtype, device=str(device), repeats=repeats)
        proc = subprocess.run([sys.executable, '-m', 'softfree_mm.analysis.benchmark', 'detector',
                               json.dumps(spec)], capture_output=True, text=True,
                              env=dict(os.environ, PYTHONWARNINGS='ignore'))
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith('{')]
        if proc.returncode != 0 or not lines:
            err = (proc.stderr.strip().splitlines() or ['no output'])[-1]
            row = dict(detector=name, size=f'{size[0]}x{size[1]}', error=err)
        else:
            row = json.loads(lines[-1])
        rows.append(row)
        if log:
            log(row)
    return detector_ratios(rows)


def detector_ratios(rows: List[Dict]) -> List[Dict]:
    """Per row: ``speed_vs_mmdet`` (its images/s over mmdet's backbone's in the same detector) and
    ``memory_vs_mmdet`` (its peak over mmdet's); ``speed_vs_softmax`` (over our softmax backbone's). The targets:
    softmax >= 1.0 of mmdet with no more memory; poly3 >= 0.8 of our softmax."""
    by = {r['detector']: r for r in rows if 'images_per_s' in r}
    for r in rows:
        if 'images_per_s' not in r:
            continue
        backbone = r['detector'].split(':')[0]
        ref, soft = by.get(f'{backbone}:mmdet'), by.get(f'{backbone}:softmax')
        if ref is not None and r is not ref:
            r['speed_vs_mmdet'] = r['images_per_s'] / ref['images_per_s']
            r['memory_vs_mmdet'] = r['peak_MiB'] / ref['peak_MiB']
        if soft is not None and r is not soft and r['kernel'] != 'mmdet':
            r['speed_vs_softmax'] = r['images_per_s'] / soft['images_per_s']
    return rows


DETECTOR_COLUMNS = ('detector', 'size', 'batch', 'dtype', 'step_ms', 'images_per_s', 'peak_MiB', 'speed_vs_mmdet',
                    'memory_vs_mmdet', 'speed_vs_softmax', 'params_M', 'error')


if __name__ == '__main__':  # python -m softfree_mm.analysis.benchmark point|detector '{json}' (one point)
    if len(sys.argv) != 3 or sys.argv[1] not in ('point', 'detector'):
        sys.exit('usage: python -m softfree_mm.analysis.benchmark point|detector JSON')
    spec = json.loads(sys.argv[2])
    if sys.argv[1] == 'detector':
        res = detector_point(spec['name'], tuple(spec['size']), spec['batch'], spec['dtype'], spec['device'],
                             spec['repeats'])
    else:
        res = backbone_point(spec['name'], spec['kernel'], tuple(spec['size']), spec['batch'], spec['dtype'],
                             spec['device'], spec['repeats'], spec['flops'], spec.get('clock', 'wall'))
    print(json.dumps(res))
