"""FLOPs of a model that count its attention (what tools/analysis/get_flops.py prints).

mmengine's counter (fvcore's rules, one multiply-add one flop, as in the papers' tables) sees nothing in
``scaled_dot_product_attention`` or a custom autograd Function, so every kernel would cost the same: forward hooks on
the kernel modules add what each call declares (``AttentionKernel.flops``) instead. Where mmengine's tracer cannot run
a model, torch's ``flop_counter`` (no norms) counts the rest; the result names the counter.
"""
from collections import OrderedDict
from typing import Dict, Sequence, Union

import torch

from ..attention import AttentionKernel, dispatch


def _kernel_modules(model):
    """Names of the outermost attention kernel modules."""
    names = []
    for name, mod in model.named_modules():
        if isinstance(mod, AttentionKernel) and not any(name.startswith(p + '.') for p in names):
            names.append(name)
    return names


def attention_flops(model: torch.nn.Module, inputs) -> Dict[str, int]:
    """Run ``model(*inputs)`` once (no grad) and add up every kernel call's declared multiply-adds, by module."""
    counts: Dict[str, int] = OrderedDict()
    handles = []

    def hook(name):
        def fn(mod, args, kwargs, out):
            q, k, v = (list(args) + [kwargs.get(n) for n in ('q', 'k', 'v')][len(args):])[:3]
            hw = kwargs.get('hw', args[3] if len(args) > 3 else None)
            bias = kwargs.get('bias', args[5] if len(args) > 5 else None)
            mask = kwargs.get('mask', args[6] if len(args) > 6 else None)
            if hw is not None:
                hw = (int(hw[0]), int(hw[1]))
            b, h, nq, d = q.shape
            per_pair = mod.flops(int(nq), int(k.shape[2]), int(d), int(v.shape[3]),
                                 masked=dispatch.general(mask, bias), hw=hw)  # a key mask keeps the order
            counts[name] = counts.get(name, 0) + int(b) * int(h) * int(per_pair)
        return fn

    mods = dict(model.named_modules())
    for name in _kernel_modules(model):
        handles.append(mods[name].register_forward_hook(hook(name), with_kwargs=True))
    try:
        with torch.no_grad():
            model(*inputs)
    finally:
        for hd in handles:
            hd.remove()
    return counts


def count_flops(model: torch.nn.Module, input_shape: Union[Sequence[int], None] = None, inputs=None) -> Dict:
    """Multiply-adds of one forward call of ``model`` on a zero-mean random input of ``input_shape`` (B, C, H, W)
    (or on ``inputs``, a tuple of arguments).

    Returns dict(total, attention, rest, counter, attention_by_module, params): ``rest`` is mmengine's count
    (or torch's, see ``counter``) outside the kernel modules, ``attention`` the kernels' own declarations.
    """
    if inputs is None:
        p = next(model.parameters(), None)
        inputs = (torch.randn(*input_shape, device=p.device if p is not None else 'cpu'),)
    was_training = model.training
    model.eval()
    try:
        attn = attention_flops(model, inputs)
        kernels = _kernel_modules(model)
        try:
            rest, counter = _mmengine_rest(model, inputs, kernels), 'mmengine'
        except Exception:  # mmengine's jit tracer cannot run every model: count the rest at dispatch level
            rest, counter = _torch_rest(model, inputs, kernels), 'torch'
    finally:
        model.train(was_training)
    total_attn = sum(attn.values())
    return dict(total=rest + total_attn, attention=total_attn, rest=rest, counter=counter,
                attention_by_module=attn, params=sum(p.numel() for p in model.parameters()))


def _mmengine_rest(model, inputs, kernels) -> int:
    import warnings

    from mmengine.analysis import FlopAnalyzer

    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        fa = FlopAnalyzer(model, tuple(inputs))
        fa.unsupported_ops_warnings(False)
        fa.uncalled_modules_warnings(False)
        fa.tracer_warnings('none')
        total = fa.total()
        by_module = fa.by_module()
    return int(total - sum(by_module.get(n, 0) for n in kernels))


def _torch_rest(model, inputs, kernels) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as fc, torch.no_grad():
        model(*inputs)
    per_module = fc.get_flop_counts()
    inside = 0
    for name in kernels:
        for key, ops in per_module.items():
            if key.endswith('.' + name) or key == name or key == f'{type(model).__name__}.{name}':
                inside += sum(ops.values())
                break
    # torch counts a multiply-add as 2 flops; mmengine (and the tables people quote) as 1
    return int((fc.get_total_flops() - inside) // 2)
