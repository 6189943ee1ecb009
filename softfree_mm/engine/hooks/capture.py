"""Record what every attention kernel of a model receives, by forward hooks (no backbone changes): one pre-hook per
``AttentionKernel`` (our backbones' and swapped foreign models'), and one on each module that declares the layout of
its kernel's tokens (a ``token_layout`` method, :mod:`softfree_mm.models.utils.token_layout`), so that each call
carries it; a kernel without such an owner gets a global layout when one problem per image over a grid fits.

>>> with AttentionCapture(model.backbone) as cap:
...     model.backbone(images)
>>> for call in cap.calls.values():
...     call.name, call.layout.kind, call.matrix().shape      # explicit A, linear kernels included

The first call of each kernel per capture is kept (gradient checkpointing re-runs a block in the backward pass).
"""
import inspect
import math
from typing import Callable, Dict, Iterable, List, Optional, Tuple, Union

import torch
from torch import nn

from ...attention import AttentionKernel
from ...models.utils.token_layout import TokenLayout

_ARGS = ('q', 'k', 'v', 'hw', 'scale', 'bias', 'mask', 'context')


def attention_layers(module: nn.Module, prefix: str = '') -> List[Tuple[str, AttentionKernel]]:
    """(layer name, kernel) for every attention kernel inside ``module``, in module order. The layer name is the
    kernel's module path without its final ``.kernel``."""
    out = []
    for name, m in module.named_modules():
        if isinstance(m, AttentionKernel):
            out.append((layer_name(prefix + name), m))
    return out


def layer_name(module_path: str) -> str:
    return module_path[:-len('.kernel')] if module_path.endswith('.kernel') else module_path


def _detach(x):
    return x.detach() if isinstance(x, torch.Tensor) else x


class AttentionCall:
    """The inputs of one kernel call (detached) and its layout; ``matrix()`` gives the explicit A on demand."""

    def __init__(self, name: str, kernel: AttentionKernel, inputs: Dict[str, object], layout: Optional[TokenLayout],
                 image_size: Optional[Tuple[int, int]]):
        self.name, self.kernel = name, kernel
        self.q, self.k, self.v = inputs['q'], inputs['k'], inputs['v']
        self.hw, self.scale, self.bias, self.mask = inputs['hw'], inputs['scale'], inputs['bias'], inputs['mask']
        self.context = inputs.get('context')
        self.layout = layout
        self.image_size = image_size

    @property
    def num_heads(self) -> int:
        return self.q.shape[1]

    @property
    def complete(self) -> bool:
        """False when part of the output is not a matrix shared by v's channels (InLine's official per-channel
        residual): then ``out == matrix() @ v + residual()`` and analyses of A see the rest of the attention."""
        return bool(getattr(self.kernel, 'matrix_is_complete', True))

    def residual(self) -> torch.Tensor:
        """``out - A @ v`` (zero for complete kernels)."""
        extra = {} if self.context is None else dict(context=self.context)
        with torch.no_grad():
            return self.kernel.residual_output(self.q, self.k, self.v, hw=self.hw, scale=self.scale, bias=self.bias,
                                               mask=self.mask, **extra)

    def matrix(self, index=None) -> torch.Tensor:
        """A (B', h, Nq, Nk) in float32 (float64 for float64 inputs); ``index`` selects rows of the batch
        dimension (e.g. one image's windows) before computing, to bound memory."""
        q, k, bias, mask, scale = self.q, self.k, self.bias, self.mask, self.scale
        if index is not None:
            q, k = q[index], k[index]
            bias = _select(bias, index, self.q.shape[0])
            mask = _select(mask, index, self.q.shape[0])
            scale = _select(scale, index, self.q.shape[0]) if isinstance(scale, torch.Tensor) else scale
        with torch.no_grad():
            a = self.kernel.attention_matrix(q, k, hw=self.hw, scale=scale, bias=bias, mask=mask)
        return a.float() if a.dtype != torch.float64 else a

    def select(self, index) -> Dict[str, object]:
        """The call's kernel arguments restricted to batch rows ``index``."""
        n = self.q.shape[0]
        scale = _select(self.scale, index, n) if isinstance(self.scale, torch.Tensor) else self.scale
        return dict(q=self.q[index], k=self.k[index], v=self.v[index], hw=self.hw, scale=scale,
                    bias=_select(self.bias, index, n), mask=_select(self.mask, index, n))

    def image_rows(self, image: int) -> slice:
        """Batch rows of the call that belong to image ``image`` (layouts are image-major)."""
        g = self.layout.groups if self.layout is not None else 1
        return slice(image * g, (image + 1) * g)

    def __repr__(self):
        kind = self.layout.kind if self.layout is not None else '?'
        return (f'AttentionCall({self.name!r}, kernel={self.kernel.name!r}, q={tuple(self.q.shape)}, '
                f'k={tuple(self.k.shape)}, layout={kind!r})')


def _select(t, index, n):
    """Rows ``index`` of a tensor broadcast along the batch dimension (size 1 stays as is)."""
    if not isinstance(t, torch.Tensor) or t.dim() < 4 or t.shape[0] == 1:
        return t
    if t.shape[0] != n:
        raise ValueError(f'cannot select batch rows of a tensor with leading dim {t.shape[0]} (batch {n})')
    return t[index]


class AttentionCapture:
    """Context manager that hooks every kernel of ``module`` (or those named in ``layers``).

    Args:
        module: the model (or backbone) to watch.
        layers: layer names (see :func:`attention_layers`) or a predicate on the name; None = all.
        on_call: called with each :class:`AttentionCall` as it happens (before the kernel runs).
        store: keep the calls in ``self.calls`` (name -> call). Set False with ``on_call`` to keep nothing.
        prefix: prepended to layer names (e.g. 'backbone.').
    """

    def __init__(self, module: nn.Module, layers: Union[None, Iterable[str], Callable[[str], bool]] = None,
                 on_call: Optional[Callable[[AttentionCall], None]] = None, store: bool = True, prefix: str = ''):
        self.module, self.on_call, self.store, self.prefix = module, on_call, store, prefix
        found = attention_layers(module, prefix)
        if not found:
            raise ValueError(f'{type(module).__name__} holds no softfree_mm attention kernel: nothing to capture')
        names = [n for n, _ in found]
        if layers is None:
            keep = set(names)
        elif callable(layers):
            keep = {n for n in names if layers(n)}
        else:
            keep = set(layers)
            bad = sorted(keep - set(names))
            if bad:
                raise ValueError(f'unknown attention layer(s) {bad}; layers: {", ".join(names)}')
        self.layers = [(n, k) for n, k in found if n in keep]
        self.calls: Dict[str, AttentionCall] = {}
        self.image_size: Optional[Tuple[int, int]] = None
        self.batch: Optional[int] = None
        self._handles = []
        self._owner_ctx: Dict[int, tuple] = {}
        self._owners: Dict[int, Tuple[nn.Module, Callable]] = {}
        self._seen = set()

    # ------------------------------------------------------------------ hooks
    def __enter__(self):
        by_path = dict(self.module.named_modules())
        path_of = {id(m): p for p, m in by_path.items()}
        self._handles.append(self.module.register_forward_pre_hook(self._root_hook, with_kwargs=True))
        owner_ids = set()
        for name, kernel in self.layers:
            path = path_of[id(kernel)]
            owner = None
            parts = path.split('.') if path else []
            for i in range(len(parts) - 1, -1, -1):  # the nearest ancestor that declares its layout
                m = by_path.get('.'.join(parts[:i]))
                if callable(getattr(m, 'token_layout', None)):
                    owner = m
                    break
            self._owners[id(kernel)] = owner
            if owner is not None and id(owner) not in owner_ids:
                owner_ids.add(id(owner))
                self._handles.append(owner.register_forward_pre_hook(self._owner_hook, with_kwargs=True))
            self._handles.append(kernel.register_forward_pre_hook(
                self._make_kernel_hook(name, kernel), with_kwargs=True))
        return self

    def __exit__(self, *exc):
        self.remove()
        return False

    def remove(self):
        for h in self._handles:
            h.remove()
        self._handles = []

    def reset(self):
        self.calls = {}
        self._seen = set()
        self._owner_ctx = {}
        self.image_size = self.batch = None

    def _root_hook(self, module, args, kwargs):
        x = args[0] if args else next(iter(kwargs.values()), None)
        if isinstance(x, torch.Tensor) and x.dim() == 4 and self.image_size is None:
            self.image_size = (int(x.shape[-2]), int(x.shape[-1]))
            self.batch = int(x.shape[0])

    def _owner_hook(self, module, args, kwargs):
        self._owner_ctx.setdefault(id(module), (args, kwargs))

    def _make_kernel_hook(self, name, kernel):
        sig = inspect.signature(type(kernel).forward)

        def hook(module, args, kwargs):
            if name in self._seen:
                return None
            self._seen.add(name)
            bound = sig.bind(module, *args, **kwargs)
            bound.apply_defaults()
            inputs = {a: _detach(bound.arguments.get(a)) for a in _ARGS}
            call = AttentionCall(name, kernel, inputs, None, self.image_size)
            call.layout = self._layout(kernel, call)
            if self.on_call is not None:
                self.on_call(call)
            if self.store:
                self.calls[name] = call
            return None
        return hook

    def _layout(self, kernel, call) -> TokenLayout:
        m = self._owners.get(id(kernel))
        ctx = None if m is None else self._owner_ctx.get(id(m))
        if ctx is None:
            return default_layout(call, self.batch)
        try:
            layout = m.token_layout(call.q.shape[2], call.k.shape[2], *ctx[0], **ctx[1])
        except (KeyError, IndexError, AttributeError, TypeError, ValueError) as e:
            return TokenLayout('unknown', note=f'the layout of {type(m).__name__} could not be read: {e}')
        if layout.groups and self.batch and call.q.shape[0] != self.batch * layout.groups \
                and layout.kind != 'unknown':
            return TokenLayout('unknown', note=f'{layout.note}; but the call has {call.q.shape[0]} problems for '
                                               f'{self.batch} images x {layout.groups} groups')
        return layout


def default_layout(call, batch: Optional[int]) -> TokenLayout:
    """No module declares the layout: one problem per image over the call's grid (``hw``, else a square grid) when
    that fits."""
    nq, nk = call.q.shape[2], call.k.shape[2]
    if batch is not None and call.q.shape[0] != batch:
        return TokenLayout('unknown', note=f'{call.q.shape[0]} attention problems for {batch} images, and no module '
                                           'above this kernel declares its token layout')
    hw = call.hw
    if hw is None:
        r = math.isqrt(nq)
        if r * r != nq or nq != nk:
            return TokenLayout('unknown', note=f'no token grid (Nq={nq}, Nk={nk}, no hw) and no declared layout')
        hw = (r, r)
    return TokenLayout.over_grid(tuple(hw), nq, nk, f'global over the {hw[0]}x{hw[1]} grid (no declared layout: '
                                                    'assumed)')
