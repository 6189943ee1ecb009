"""What an attention kernel's call creates, measured, beside what the kernel declares (``AttentionKernel.memory``).

Forward hooks on every ``AttentionKernel`` of a model (never on the backbone, whose MLPs dominate small presets):
between a kernel's pre-hook and its hook, a torch dispatch mode records every tensor storage an op allocates (an
output that aliases an input, as a view or an in-place op gives, is not new) and a saved-tensors hook records what
autograd keeps for backward. Per call:

* ``largest``: the largest storage created inside the call, in elements;
* ``saved``: the elements of the distinct storages created inside the call that autograd keeps for backward (the
  call's inputs, which the layer holds anyway, are not counted);

both divided by the call's (batch, head) pairs, beside the kernel's ``memory(nq, nk, d, dv, masked, hw)`` for the
call's shapes (``masked``: a general mask or a bias, ``dispatch.general``; a key-only mask counts as none there, and
``key_mask`` says it to a declaration that takes that keyword; ``scale`` likewise hands over the call's score scale).

What a call copies depends on the memory layout of its q, k, v (a permuted view must be made contiguous, a matmul over
(B, h) folds the batch or copies): the probe hands every call its q, k, v in one layout (:func:`_strided`), made
before the call and not counted, so that a call's figures are the same for every caller with the same shapes.

:func:`problems` holds a call to its declaration: within ``FACTOR`` either way, give or take ``SLACK`` elements (for
calls of a few dozen elements a pair). ``FACTOR`` ** 2 < 4: whatever a declaration's ratio to the measurement within
the tolerance, the same declaration 4 times too large or too small is outside it.

>>> with KernelMemory(model) as probe:
...     model(x)
>>> for call in probe.calls:
...     call['name'], call['saved'], call['declared_saved']
"""
import inspect
from typing import Dict, List

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from ..attention import AttentionKernel, dispatch


FACTOR = 1.75
SLACK = 16  # elements a (batch, head): the declarations leave out counters and scalars (a key count, a max)


def problems(call: dict) -> List[str]:
    """What in ``call`` (a row of ``KernelMemory.calls``) breaks its declaration; [] when nothing does."""
    out = []
    for what, key in (('keeps for backward', 'saved'), ('holds in its largest tensor', 'largest')):
        got, declared = call[key], call[f'declared_{key}']
        if not (got <= FACTOR * declared + SLACK and declared <= FACTOR * got + SLACK):
            out.append(f"{call['type']} ({call['name']}: Nq={call['nq']} Nk={call['nk']} d={call['d']} "
                       f"dv={call['dv']} masked={call['masked']} key_mask={call.get('key_mask', False)}) {what} "
                       f'{got:.0f} elements a (batch, head), declares {declared}')
    return out


def declared(kernel: AttentionKernel, call: dict):
    """``kernel.memory`` for the call's shapes: ``(saved, largest)``; ``key_mask`` and ``scale`` go to a declaration
    that takes them."""
    takes = inspect.signature(kernel.memory).parameters
    extra = {k: call[k] for k in ('key_mask', 'scale') if k in takes}
    return kernel.memory(call['nq'], call['nk'], call['d'], call['dv'], masked=call['masked'], hw=call['hw'],
                         **extra)


def _strided(t: torch.Tensor) -> torch.Tensor:
    """``t`` (B, h, N, c) with the same values, tokens outermost with a gap between them (a (N, 2, B, h, c) tensor's
    first halves): its rows are never adjacent, so a copy a kernel asks for (``contiguous()``, a ``reshape`` merging
    tokens and channels) is made for every caller alike, while (B, h) fold into one matmul batch and (h, c) into
    conv channels without a copy, whatever B and h."""
    if not isinstance(t, torch.Tensor) or t.dim() != 4:
        return t
    tokens_first = t.permute(2, 0, 1, 3)
    return torch.stack([tokens_first, tokens_first], dim=1)[:, 0].permute(1, 2, 0, 3)


def _storage(t: torch.Tensor):
    s = t.untyped_storage()
    return s.data_ptr(), s.nbytes() // max(1, t.element_size())


class _Allocations(TorchDispatchMode):
    """Every storage an op allocates while active: pointer -> elements; the largest one."""

    def __init__(self):
        super().__init__()
        self.created: Dict[int, int] = {}
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        ins = {_storage(t)[0] for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
        out = func(*args, **kwargs)
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type != 'meta':
                ptr, n = _storage(t)
                if ptr and ptr not in ins:
                    self.created[ptr] = n
                    self.largest = max(self.largest, n)
        return out


class KernelMemory:
    """Context manager: hooks on every attention kernel inside ``model``; ``calls`` holds one dict per kernel call
    (name, shapes, masked, measured and declared elements per (batch, head) pair)."""

    def __init__(self, model: nn.Module):
        self.kernels = [(n, m) for n, m in model.named_modules() if isinstance(m, AttentionKernel)]
        self.calls: List[dict] = []
        self._handles = []
        self._active = None

    def __enter__(self):
        for name, kernel in self.kernels:
            self._handles.append(kernel.register_forward_pre_hook(self._pre(name), with_kwargs=True))
            self._handles.append(kernel.register_forward_hook(self._post(name), with_kwargs=True))
        return self

    def __exit__(self, *exc):
        for h in self._handles:
            h.remove()
        self._handles = []
        if self._active is not None:  # an exception inside a call
            self._close()

    def _close(self):
        mode, saved_hooks, _ = self._active
        saved_hooks.__exit__(None, None, None)
        mode.__exit__(None, None, None)
        self._active = None

    def _pre(self, name):
        def hook(module, args, kwargs):
            if self._active is not None:  # a kernel inside a kernel: the outer call counts
                return
            names = ('q', 'k', 'v', 'hw', 'scale', 'bias', 'mask')
            given = dict(zip(names, args), **{k: v for k, v in kwargs.items() if k in names})
            # q, k, v in one memory layout for every caller (see the module doc): made before the call, not counted
            args = tuple(_strided(a) if i < 3 else a for i, a in enumerate(args))
            kwargs = {n: _strided(t) if n in ('q', 'k', 'v') else t for n, t in kwargs.items()}
            given.update({n: t for n, t in zip(names, args)}, **{n: t for n, t in kwargs.items() if n in names})
            q, k, v = given['q'], given['k'], given['v']
            masked = dispatch.general(given.get('mask'), given.get('bias'))  # a key-only mask counts as none
            scale = given.get('scale')
            saved: Dict[int, int] = {}
            mode = _Allocations()

            def pack(t):
                ptr, n = _storage(t)
                saved[ptr] = n
                return t

            saved_hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
            mode.__enter__()
            saved_hooks.__enter__()
            hw = given.get('hw')
            self._active = (mode, saved_hooks, dict(
                name=name, kernel=module, pairs=q.shape[0] * q.shape[1], nq=q.shape[2], nk=k.shape[2], d=q.shape[3],
                dv=v.shape[3], masked=masked, key_mask=dispatch.key_only(given.get('mask')),
                scale=scale.detach() if isinstance(scale, torch.Tensor) else scale if scale is None else float(scale),
                hw=tuple(int(x) for x in hw) if hw is not None else None, saved_map=saved))
            return args, kwargs
        return hook

    def _post(self, name):
        def hook(module, args, kwargs, out):
            if self._active is None or self._active[2]['kernel'] is not module:
                return
            mode, _, call = self._active
            self._close()
            saved = call.pop('saved_map')
            kernel = call.pop('kernel')
            pairs = call['pairs']
            kept = sum(n for ptr, n in saved.items() if ptr in mode.created)
            call.update(type=kernel.name, saved=kept / pairs, largest=mode.largest / pairs)
            dec = declared(kernel, call)
            call.update(declared_saved=dec[0], declared_largest=dec[1])
            self.calls.append(call)
        return hook
