"""``backbone`` and ``flops`` modes: backbones x kernels x image sizes, each timed point in a fresh process
(latency, images/s, peak memory, parameters, GFLOPs), and the backbone presets the other modes build."""
import contextlib
import statistics
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from ...attention import kernel_label
from .timing import DTYPES, in_fresh_process, peak_memory, timed


def backbone_presets() -> Dict[str, Tuple[type, dict]]:
    """Preset name (``--backbones``) -> (backbone class, build arguments): what every family declares
    (``Family.benchmark``)."""
    from ...models.family import FAMILIES
    return {name: (cls, kw) for cls in FAMILIES.values() for name, kw in cls.family.benchmark.items()}


def build_backbone(name: str, kernel='softmax', extra: Optional[dict] = None):
    """A backbone preset with ``kernel`` in every attention layer. Where the backbone's own layout refuses the
    kernel, the set-up its family declares for that (``Family.fit``) is used; returns (model, set-up label)."""
    presets = backbone_presets()
    if name not in presets:
        raise ValueError(f'unknown backbone {name!r}; valid: {", ".join(sorted(presets))}')
    cls, kw = presets[name]
    kw = dict(kw, attn_cfg=kernel, drop_path_rate=0.0, **(extra or {}))
    try:
        return cls(**kw), 'own layout'
    except ValueError:
        if cls.family.fit is None:
            raise
        label, fit = cls.family.fit
        return cls(**dict(kw, **fit)), label


def step_fns(model, x, device):
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
    fns = step_fns(model, x, device)
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
        from ..flops import count_flops

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
                row = in_fresh_process('point', spec, dict(backbone=name, kernel=kernel_label(kernel),
                                                           size=f'{size[0]}x{size[1]}'))
                rows.append(row)
                if log:
                    log(row)
    return rows


def flops_table(backbones: Sequence[str], kernels: Sequence, sizes: Sequence[Tuple[int, int]], log=None) -> List[Dict]:
    """GFLOPs (attention included; multiply-adds) and parameters of every backbone x kernel x size."""
    import softfree_mm  # noqa: F401
    from ..flops import count_flops

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

