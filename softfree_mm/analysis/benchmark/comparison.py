"""``compare`` mode: our softmax backbones against the reference implementations with the same weights, outputs
checked equal, the two models alternating in one process (speed, peak memory, what autograd keeps for backward)."""
import statistics
from typing import Dict, List, Sequence, Tuple

import torch

from .backbones import step_fns
from .references import PARITY_SIZE, REFERENCES, reference_pair
from .timing import PASSES, peak_memory, saved_bytes, timed


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
        fo, fr = step_fns(ours, x, device), step_fns(ref, x, device)
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

