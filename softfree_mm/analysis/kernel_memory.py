"""What an attention kernel's call creates, measured, beside what the kernel declares (``AttentionKernel.memory``).

Forward hooks on every ``AttentionKernel`` of a model (never on the backbone, whose MLPs dominate small presets):
between a kernel's pre-hook and its hook, a torch dispatch mode records every tensor storage an op allocates (an
output that aliases an input, as a view or an in-place op gives, is not new) and a saved-tensors hook records what
autograd keeps for backward. Per call:

* ``largest``: the largest storage created inside the call, in elements;
* ``saved``: the elements of the distinct storages created inside the call that autograd keeps for backward (the
  call's inputs, which the layer holds anyway, are not counted);

both divided by the call's (batch, head) pairs, beside the kernel's ``memory(nq, nk, d, dv, masked, hw)`` for the
call's shapes (``masked``: a general mask or a bias, ``dispatch.general``; a key-only mask counts as none, as the
kernels' declarations read it). :func:`problems` holds a call to its declaration: within ``FACTOR`` either way, give
or take the size of the call's inputs (copies of q, k, v that a caller's memory layout may or may not force: a
permuted v made contiguous), a margin linear in the tokens, so a kernel that keeps an Nq x Nk or an N x N matrix it
does not declare fails once N exceeds a few times the head width.

>>> with KernelMemory(model) as probe:
...     model(x)
>>> for call in probe.calls:
...     call['name'], call['saved'], call['declared_saved']
"""
from typing import Dict, List

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from ..attention import AttentionKernel, dispatch


FACTOR = 2


def slack(call: dict) -> int:
    """Elements per (batch, head) of the call's inputs q, k, v (the margin of :func:`problems`)."""
    return (call['nq'] + 2 * call['nk']) * max(call['d'], call['dv'])


def problems(call: dict) -> List[str]:
    """What in ``call`` (a row of ``KernelMemory.calls``) breaks its declaration; [] when nothing does."""
    out, s = [], slack(call)
    for what, key in (('keeps for backward', 'saved'), ('holds in its largest tensor', 'largest')):
        got, declared = call[key], call[f'declared_{key}']
        if not (got <= FACTOR * declared + s and declared <= FACTOR * got + s):
            out.append(f"{call['type']} ({call['name']}: Nq={call['nq']} Nk={call['nk']} d={call['d']} "
                       f"dv={call['dv']} masked={call['masked']}) {what} {got:.0f} elements a (batch, head), "
                       f'declares {declared}')
    return out


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
            q, k, v = given['q'], given['k'], given['v']
            masked = dispatch.general(given.get('mask'), given.get('bias'))  # a key-only mask counts as none
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
                dv=v.shape[3], masked=masked, hw=tuple(int(x) for x in hw) if hw is not None else None,
                saved_map=saved))
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
            dec = kernel.memory(call['nq'], call['nk'], call['d'], call['dv'], masked=call['masked'], hw=call['hw'])
            call.update(declared_saved=dec[0], declared_largest=dec[1])
            self.calls.append(call)
        return hook
