"""``kernels`` mode: one attention call (B, h, N, d) per kernel and token count, forward and forward + backward,
with the kernels alternating within each repeat; ratios to a reference kernel, log-log slopes over N and the N
from which a kernel overtakes the reference; the device's own matrix rate and copy bandwidth (``--ceilings``)."""
import math
import statistics
import sys
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from ...attention import build_attention, kernel_label
from .timing import PASSES, peak_memory, saved_bytes, timed, timer


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


class _Matmul(torch.nn.Module):
    """``(q @ k^T) @ v``: the two matrix products of attention at the same size, without an activation."""

    def forward(self, q, k, v, hw=None):
        return (q @ k.transpose(-2, -1)) @ v

    @staticmethod
    def flops(nq, nk, d, dv, masked=False):
        return nq * nk * (d + dv)


# peers: other projects' kernels timed beside ours where they are installed (a missing one: its rows are skipped).
# fbi_la: fla-org/flash-bidirectional-linear-attention (Triton, non-causal linear attention with its elu+1
# normaliser; (B, h, N, d) inputs), importable as flash_bla (today) or fbi_la (before)
PEERS = {'fbi_la': (('flash_bla.ops.linear_attn.fused', 'fbi_la.ops.linear_attn.fused'), 'linear_attention')}


class PeerMissing(Exception):
    pass


class _Peer(torch.nn.Module):
    """A peer's function ``fn(q, k, v)`` as a kernel (its cost counted as linear attention's)."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, q, k, v, hw=None):
        return self.fn(q, k, v)

    @staticmethod
    def flops(nq, nk, d, dv, masked=False):
        return (nq + nk) * d * dv + nq * d


def build_peer(name: str):
    import importlib
    if name not in PEERS:
        raise ValueError(f"unknown peer {name!r}; known: {', '.join(PEERS)}")
    modules, fn = PEERS[name]
    for mod in modules:
        try:
            return _Peer(getattr(importlib.import_module(mod), fn))
        except (ImportError, AttributeError):
            continue
    raise PeerMissing(f'peer {name}: none of {", ".join(modules)} imports here (install it, e.g. its wheel in '
                      'the GPU check\'s wheel folder); its rows are skipped')


def build_kernel(cfg, heads: int, head_dim: int):
    if cfg == 'matmul':
        return _Matmul()
    if isinstance(cfg, str) and cfg.startswith('peer:'):
        return build_peer(cfg[len('peer:'):])
    return build_attention(cfg, num_heads=heads, head_dim=head_dim)


def path_taken(kern, q, k, v, launched: Dict[str, int]) -> str:
    """Which path a call took: a fused Triton kernel where one launched in it (``launched``: the launch counts'
    changes), else the kernel's own declaration (its quadratic path, or its association order), 'peer' / 'torch'."""
    if launched.get('linear'):
        return 'fused linear'
    if launched.get('pointwise'):
        return 'fused pointwise'
    if isinstance(kern, _Peer):
        return 'peer'
    n, d, dv = k.shape[2], q.shape[3], v.shape[3]
    if hasattr(kern, 'path'):
        return kern.path(q, k, v)
    order = kern.order(q.shape[2], n, d, dv, False, q.device.type) if hasattr(kern, 'order') else None
    return f'{order} order' if order else 'torch'


def _launches() -> Dict[str, int]:
    from ...attention import fused_linear, fused_pointwise
    return {'linear': fused_linear.LAUNCHES['forward'], 'pointwise': fused_pointwise.LAUNCHES['forward']}


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
    kept = []
    for c in kernels:  # a peer that is not installed: said once, its rows skipped
        try:
            build_kernel(c, heads, head_dim)
            kept.append(c)
        except PeerMissing as e:
            print(f'benchmark: {e}', file=sys.stderr)
    kernels = kept
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
        paths = {}
        try:
            for i, kern in enumerate(kerns):  # warm-up, and which path each kernel takes
                for p in passes:
                    before = _launches()
                    fns[p](kern)
                    after = _launches()
                    paths[i] = path_taken(kern, q, k, v, {x: after[x] - before[x] for x in after})
        except torch.cuda.OutOfMemoryError:  # this N and the larger ones do not fit: the rows so far still come
            print(f'benchmark: {kernel_label(kernels[i])} ({p}) ran out of {device} memory at N={n}; '
                  f'N >= {n} not measured', file=sys.stderr)
            del kerns, q, k, v, leaves
            torch.cuda.empty_cache()
            break
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
                           clock=clock, path=paths.get(i, ''), **{'pass': p}, ms=sec * 1e3, GFLOPs=2 * macs / 1e9 * (1 if p == 'fwd' else 3),
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


KERNEL_COLUMNS = ('kernel', 'N', 'pass', 'ms', 'time_ratio', 'time_ratio_range', 'peak_MiB', 'memory_ratio',
                  'saved_MiB', 'GFLOP_per_s', 'of_matrix_rate', 'GB_per_s', 'of_copy_bandwidth', 'path')

