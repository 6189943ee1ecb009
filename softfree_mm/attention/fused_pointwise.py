"""Fused pointwise attention for GPUs (Triton): ``out = (coef * g(alpha q k^T + bias + shift) * keep) @ v``.

One program per block of query rows walks the key blocks (scores -> activation -> weights @ v, fp32 accumulation);
the backward pass runs one program per key block (dk, dv) and one per row block (dq), recomputing each block's
scores from q and k as FlashAttention does, so nothing of size Nq x Nk is ever stored. ``g``: signed ``s^p``
(p = 1..4), relu, sigmoid; ``coef``: a float or one number per row (1/sqrt(N_valid), 1/N_valid); ``shift``: one
number per row (sigmoid's -log N_valid); ``bias`` and ``keep`` (bool): any tensors broadcastable to (B, h, Nq, Nk),
read with their own strides (a key-padding mask (B, 1, 1, Nk) costs no copy). Inputs in fp32, bf16 or fp16, all
of one dtype; scores, powers and the activation in fp32, the weights rounded to the inputs' dtype for the second
matrix product (fp32 accumulation); the output in the inputs' dtype.

What does not run here (the caller takes its other path, the reason logged once): fp64, head_dim or dv above 128,
powers above 4, a bias that needs a gradient (Swin's relative position bias: windows, which take the explicit
path anyway), more than 65535 (batch, head) pairs, no triton, a CPU tensor without TRITON_INTERPRET=1.

Safety: the first use in a process on a given device, dtype and variant runs the kernel on a small problem against
the explicit formula, forward and backward; a mismatch or a compile error logs one line naming the kernel and the
cause, and that variant is not used again in the process. A launch that fails later does the same (a failed
backward recomputes its gradients through the tiled path).
"""
import logging
import os
from typing import Dict, Optional, Tuple

import torch

logger = logging.getLogger('softfree_mm.attention')

KINDS = {'pow': 0, 'relu': 1, 'sigmoid': 2}
MAX_POWER = 4
MAX_HEAD_DIM = 128
MAX_PAIRS = 65535  # the grid's second axis
DTYPES = (torch.float32, torch.bfloat16, torch.float16)

_KERNELS: Dict[bool, tuple] = {}  # interpreted? -> (forward, dk-dv, dq)
_STATE: Dict[tuple, object] = {}  # variant -> its block configuration (passed the check) or why it is not used
_SAID = set()  # reasons already logged
_FAILED = set()  # causes _fail logged (attend does not log them twice)
LAUNCHES = {'forward': 0, 'backward': 0}  # fused launches made in this process (what ran, for the tests)


def interpreting() -> bool:
    """TRITON_INTERPRET is set: triton runs the kernels on CPU tensors (numpy), as the tests do."""
    return os.environ.get('TRITON_INTERPRET', '0') not in ('', '0')


def triton_error() -> Optional[str]:
    try:
        from . import _fused_pointwise_kernels  # noqa: F401  (imports triton)
    except Exception as e:  # noqa: BLE001  (not installed, or a triton that fails at import)
        return f'triton cannot be imported ({type(e).__name__}: {_first_line(e)})'
    return None


def kernels():
    interp = interpreting()
    if interp not in _KERNELS:
        from . import _fused_pointwise_kernels as src
        _KERNELS[interp] = src.build()
    return _KERNELS[interp]


def label(kind: str, power: int) -> str:
    return f'poly{power}' if kind == 'pow' else kind


def say_once(message: str) -> None:
    """One log line per distinct message and process."""
    if message not in _SAID:
        _SAID.add(message)
        logger.warning(message)


def unsupported(q, k, v, kind: str, power: int, bias=None) -> Optional[str]:
    """Why the fused kernel cannot take this call (None: it can)."""
    if kind not in KINDS:
        return f'unknown activation {kind!r}'
    if kind == 'pow' and not 1 <= power <= MAX_POWER:
        return f'power {power} (the fused kernel has powers 1 to {MAX_POWER})'
    dev = q.device
    if dev.type != 'cuda' and not (dev.type == 'cpu' and interpreting()):
        return f'{dev.type} tensors (fused kernels run on CUDA, or on CPU tensors under TRITON_INTERPRET=1)'
    if k.device != dev or v.device != dev:
        return 'q, k and v on different devices'
    dtypes = {q.dtype, k.dtype, v.dtype}
    if len(dtypes) != 1 or q.dtype not in DTYPES:
        return f'dtype {", ".join(sorted(str(d).replace("torch.", "") for d in dtypes))} (fused: one of ' \
               'float32, bfloat16, float16 for q, k and v)'
    d, dv = q.shape[-1], v.shape[-1]
    if d > MAX_HEAD_DIM or dv > MAX_HEAD_DIM:
        return f'head_dim {d} / dv {dv} (fused: at most {MAX_HEAD_DIM})'
    if q.shape[0] * q.shape[1] > MAX_PAIRS:
        return f'{q.shape[0] * q.shape[1]} (batch, head) pairs (fused: at most {MAX_PAIRS})'
    if bias is not None and bias.requires_grad:
        return 'a bias that needs a gradient (the fused backward gives none)'
    return triton_error()


# ------------------------------------------------------------------------------------------- configurations
def _pow2(n: int) -> int:
    return max(16, 1 << (int(n) - 1).bit_length())


def block_configs(d: int, dv: int, dtype: torch.dtype):
    """Block shapes to try in order (the first that compiles and passes the check is kept): for each program
    (forward, dk-dv, dq) its (rows, keys, warps, stages). Under the interpreter: small blocks (every program is
    numpy; the tests' sizes then span several blocks)."""
    if interpreting():
        return [dict(fwd=(32, 32, 4, 1), dkdv=(32, 32, 4, 1), dq=(32, 32, 4, 1))]
    warps = 8 if max(_pow2(d), _pow2(dv)) > 64 else 4
    if dtype == torch.float32:
        return [dict(fwd=(64, 32, 4, 2), dkdv=(32, 64, 4, 2), dq=(64, 32, 4, 2)),
                dict(fwd=(32, 32, 4, 1), dkdv=(16, 32, 4, 1), dq=(32, 16, 4, 1))]
    return [dict(fwd=(128, 64, warps, 3), dkdv=(64, 64, warps, 2), dq=(64, 64, warps, 2)),
            dict(fwd=(64, 64, 4, 2), dkdv=(32, 64, 4, 2), dq=(64, 32, 4, 2)),
            dict(fwd=(32, 32, 4, 1), dkdv=(16, 32, 4, 1), dq=(32, 16, 4, 1))]


def _precision(dtype) -> Optional[str]:
    if dtype != torch.float32:
        return None
    return 'tf32' if torch.backends.cuda.matmul.allow_tf32 else 'ieee'


# ------------------------------------------------------------------------------------------- launches
def _rows(t, b, h, nq):
    """(tensor, strides (b, h, row)) of a per-row operand broadcastable to (B, h, Nq, 1)."""
    t = t.reshape((1,) * (4 - t.dim()) + tuple(t.shape)).expand(b, h, nq, 1)
    return t, t.stride()[:3]


def _scores_operand(t, b, h, nq, nk):
    t = t.reshape((1,) * (4 - t.dim()) + tuple(t.shape)).expand(b, h, nq, nk)
    return t, t.stride()


class _Args:
    """The pointer and stride arguments every program takes, in the kernels' order."""

    def __init__(self, q, k, v, bias, shift, coef, mask):
        b, h, nq, d = q.shape
        nk, dv = k.shape[2], v.shape[3]
        self.dims = (b, h, nq, nk, d, dv)
        self.bias, sb = _scores_operand(bias, b, h, nq, nk) if bias is not None else (q, (0, 0, 0, 0))
        self.shift, sr = _rows(shift, b, h, nq) if shift is not None else (q, (0, 0, 0))
        self.coef, sc = _rows(coef, b, h, nq) if coef is not None else (q, (0, 0, 0))
        if mask is not None:
            m, sm = _scores_operand(mask, b, h, nq, nk)
            self.mask = m.view(torch.uint8)
        else:
            self.mask, sm = q, (0, 0, 0, 0)
        self.flags = dict(HAS_BIAS=bias is not None, HAS_SHIFT=shift is not None, HAS_COEF=coef is not None,
                          HAS_MASK=mask is not None)
        self.side_strides = (*sb, *sr, *sc, *sm)

    def strides(self, q, k, v, do):
        return (*q.stride(), *k.stride(), *v.stride(), *do.stride(), *self.side_strides)


def _constants(q, kind, power):
    return dict(KIND=KINDS[kind], POWER=int(power), UPCAST=bool(interpreting() and q.dtype == torch.bfloat16),
                PRECISION=_precision(q.dtype))


def _launch_forward(q, k, v, args: _Args, alpha, shift_value, coef_value, kind, power, cfg):
    fwd, _, _ = kernels()
    b, h, nq, nk, d, dv = args.dims
    out = torch.empty(b, h, nq, dv, dtype=q.dtype, device=q.device)
    bm, bn, warps, stages = cfg['fwd']
    const = _constants(q, kind, power)
    grid = ((nq + bm - 1) // bm, b * h)
    LAUNCHES['forward'] += 1
    fwd[grid](q, k, v, out, args.bias, args.shift, args.coef, args.mask, *args.strides(q, k, v, out),
              h, nq, nk, d, dv, float(alpha), float(shift_value), float(coef_value), **const, **args.flags,
              BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=_pow2(d), BLOCK_DV=_pow2(dv), num_warps=warps, num_stages=stages)
    return out


def _launch_backward(q, k, v, dout, args: _Args, alpha, shift_value, coef_value, kind, power, cfg, need_q,
                     need_kv):
    _, dkdv, dq_kernel = kernels()
    b, h, nq, nk, d, dv = args.dims
    const = dict(_constants(q, kind, power), **args.flags, BLOCK_D=_pow2(d), BLOCK_DV=_pow2(dv))
    strides = args.strides(q, k, v, dout)
    side = (args.bias, args.shift, args.coef, args.mask)
    scalars = (h, nq, nk, d, dv, float(alpha), float(shift_value), float(coef_value))
    dq = dk = dv_ = None
    LAUNCHES['backward'] += 1
    if need_kv:
        bm, bn, warps, stages = cfg['dkdv']
        dk = torch.empty(b, h, nk, d, dtype=k.dtype, device=k.device)
        dv_ = torch.empty(b, h, nk, dv, dtype=v.dtype, device=v.device)
        dkdv[((nk + bn - 1) // bn, b * h)](q, k, v, dout, dk, dv_, *side, *strides, *scalars, **const,
                                             BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, num_stages=stages)
    if need_q:
        bm, bn, warps, stages = cfg['dq']
        dq = torch.empty(b, h, nq, d, dtype=q.dtype, device=q.device)
        dq_kernel[((nq + bm - 1) // bm, b * h)](q, k, v, dout, dq, *side, *strides, *scalars, **const,
                                                BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, num_stages=stages)
    return dq, dk, dv_


class FusedPointwiseAttention(torch.autograd.Function):
    """The fused forward and backward; gradients for q, k and v (none for bias, shift, coef or mask)."""

    @staticmethod
    def forward(ctx, q, k, v, bias, shift, coef, mask, alpha, shift_value, coef_value, kind, power, cfg, key):
        args = _Args(q, k, v, bias, shift, coef, mask)
        out = _launch_forward(q, k, v, args, alpha, shift_value, coef_value, kind, power, cfg)
        ctx.save_for_backward(q, k, v, bias, shift, coef, mask)
        ctx.setup = (alpha, shift_value, coef_value, kind, power, cfg, key)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout):
        q, k, v, bias, shift, coef, mask = ctx.saved_tensors
        alpha, shift_value, coef_value, kind, power, cfg, key = ctx.setup
        need_q = ctx.needs_input_grad[0]
        need_kv = ctx.needs_input_grad[1] or ctx.needs_input_grad[2]
        try:
            dq, dk, dv = _launch_backward(q, k, v, dout, _Args(q, k, v, bias, shift, coef, mask), alpha,
                                          shift_value, coef_value, kind, power, cfg, need_q, need_kv)
        except Exception as e:  # noqa: BLE001  (a compile or launch error: recompute through the tiled path)
            if key is None:  # the first-use check itself: its caller reports
                raise
            _fail(key, kind, power, q, f'its backward raised {type(e).__name__}: {_first_line(e)}')
            dq, dk, dv = _tiled_grads(q, k, v, dout, bias, shift, coef, mask, alpha, shift_value, coef_value,
                                      kind, power)
        return (dq if need_q else None, dk if ctx.needs_input_grad[1] else None,
                dv if ctx.needs_input_grad[2] else None) + (None,) * 11


def _tiled_grads(q, k, v, dout, bias, shift, coef, mask, alpha, shift_value, coef_value, kind, power):
    from .blocked import tiled_pointwise
    with torch.enable_grad():
        leaves = [t.detach().float().requires_grad_(True) for t in (q, k, v)]
        shift = shift_value if shift is None else shift + shift_value
        shift = torch.full((1, 1, 1, 1), shift, device=q.device) if isinstance(shift, float) else shift.float()
        out = tiled_pointwise(*leaves, kind, power, alpha, None if bias is None else bias.float(), shift, mask)
        out = out * (coef if coef is not None else coef_value)
        grads = torch.autograd.grad(out, leaves, dout.float())
    return tuple(g.to(t.dtype) for g, t in zip(grads, (q, k, v)))


# ------------------------------------------------------------------------------------------- safety
def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return (text[0] if text else '')[:200]


def _fail(key, kind, power, q, cause: str) -> None:
    _STATE[key] = cause
    _FAILED.add(cause)
    say_once(f'softfree_mm: fused {label(kind, power)} attention kernel on {q.device} {str(q.dtype)[6:]}: {cause}; '
             'using the unfused path instead')


def reference(q, k, v, kind, power, alpha, coef, bias=None, shift=None, mask=None, shift_value=0.0):
    """The explicit formula in fp32 (what the check compares against)."""
    q, k, v = (t.float() for t in (q, k, v))
    s = alpha * (q @ k.transpose(-2, -1)) + shift_value
    if bias is not None:
        s = s + bias.float()
    if shift is not None:
        s = s + shift.float()
    a = s.pow(power) if kind == 'pow' else torch.relu(s) if kind == 'relu' else torch.sigmoid(s)
    a = a * coef
    if mask is not None:
        a = a.masked_fill(~mask, 0.0)
    return a @ v


TOLERANCE = {torch.float32: 2e-4, torch.bfloat16: 4e-2, torch.float16: 1e-2}


def _tolerance(dtype):
    if dtype == torch.float32 and _precision(dtype) == 'tf32' and not interpreting():
        return 2e-2
    return TOLERANCE[dtype]


def check(kind, power, device, dtype, d, dv, flags, cfg) -> Optional[str]:
    """Run the fused kernel on a small problem of two blocks each way, the second partial (batch 1, 2 heads), against
    :func:`reference`, forward and the gradients of q, k, v; None when every relative error (to the largest value of
    the reference) is within the dtype's tolerance, else the cause."""
    g = torch.Generator(device='cpu').manual_seed(0)
    nq, nk, h = max(cfg[p][0] for p in ('fwd', 'dkdv', 'dq')) + 5, max(cfg[p][1] for p in ('fwd', 'dkdv', 'dq')) + 3, 2

    def rand(*shape):
        return torch.randn(*shape, generator=g).to(device)

    q, k, v = (rand(1, h, n, c).to(dtype).requires_grad_(True) for n, c in ((nq, d), (nk, d), (nk, dv)))
    bias = rand(1, h, nq, nk) * 0.5 if flags['HAS_BIAS'] else None
    shift = -torch.rand(1, h, nq, 1, generator=g).to(device) - 2.0 if flags['HAS_SHIFT'] else None
    coef = torch.rand(1, 1, nq, 1, generator=g).to(device) + 0.5 if flags['HAS_COEF'] else None
    mask = None
    if flags['HAS_MASK']:
        mask = (torch.rand(1, h, nq, nk, generator=g) > 0.3).to(device)
    alpha, shift_value, coef_value = d ** -0.5, 0.25, 0.7
    with torch.enable_grad():  # also when the first use is under no_grad: the backward is checked too
        return _compare(q, k, v, bias, shift, coef, mask, alpha, shift_value, coef_value, kind, power, cfg, dv, rand)


def _compare(q, k, v, bias, shift, coef, mask, alpha, shift_value, coef_value, kind, power, cfg, dv, rand):
    nq, h, dtype = q.shape[2], q.shape[1], q.dtype
    out = FusedPointwiseAttention.apply(q, k, v, bias, shift, coef, mask, alpha, shift_value, coef_value, kind,
                                        power, cfg, None)
    dout = rand(1, h, nq, dv).to(dtype)
    got = torch.autograd.grad(out, (q, k, v), dout)
    leaves = [t.detach().float().requires_grad_(True) for t in (q, k, v)]
    ref = reference(*leaves, kind, power, alpha, coef if coef is not None else coef_value, bias, shift, mask,
                    shift_value)
    want = torch.autograd.grad(ref, leaves, dout.float())
    tol = _tolerance(dtype)
    for what, a, b in zip(('output', 'dq', 'dk', 'dv'), (out, *got), (ref, *want)):
        a, b = a.detach().float(), b.detach()
        err = float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))
        if not err <= tol:  # also NaN
            return f'its {what} differs from the explicit formula by {err:.3g} of its largest value ' \
                   f'(tolerance {tol:g})'
    return None


def ready(kind, power, q, v, flags) -> Optional[dict]:
    """The block configuration of this variant when it passed its first-use check (run now if not yet), else None."""
    key = _key_of(kind, power, q, v, flags)
    state = _STATE.get(key)
    if isinstance(state, dict):
        return state
    if isinstance(state, str):
        return None
    cause = 'no block configuration'
    for cfg in block_configs(q.shape[-1], v.shape[-1], q.dtype):
        try:
            cause = check(kind, power, q.device, q.dtype, q.shape[-1], v.shape[-1], flags, cfg)
        except Exception as e:  # noqa: BLE001  (compile errors, too little shared memory: try smaller blocks)
            cause = f'its first-use check raised {type(e).__name__}: {_first_line(e)}'
            continue
        if cause is None:
            cfg = dict(cfg, key=key)
            _STATE[key] = cfg
            return cfg
        break  # wrong numbers: not a matter of block sizes
    _fail(key, kind, power, q, cause)
    return None


def fused_pointwise(q, k, v, kind: str, power: int = 1, alpha: float = 1.0, coef=1.0, bias=None, shift=None,
                    mask=None) -> Tuple[Optional[torch.Tensor], Optional[str]]:
    """``(coef * g(alpha q k^T + bias + shift) * keep) @ v`` fused: (output, None), or (None, why not) when the
    call cannot run fused (then nothing was computed). ``coef`` and ``shift``: floats, or tensors broadcastable to
    (B, h, Nq, 1) without gradient; ``bias`` and ``mask`` broadcastable to (B, h, Nq, Nk)."""
    why = unsupported(q, k, v, kind, power, bias)
    if why is None and any(isinstance(t, torch.Tensor) and t.requires_grad for t in (coef, shift)):
        why = 'a row coefficient or shift that needs a gradient'
    if why is not None:
        return None, why
    coef_t = coef if isinstance(coef, torch.Tensor) else None
    shift_t = shift if isinstance(shift, torch.Tensor) else None
    flags = dict(HAS_BIAS=bias is not None, HAS_SHIFT=shift_t is not None, HAS_COEF=coef_t is not None,
                 HAS_MASK=mask is not None)
    cfg = ready(kind, power, q, v, flags)
    if cfg is None:
        return None, _STATE[_key_of(kind, power, q, v, flags)]
    try:
        out = FusedPointwiseAttention.apply(q, k, v, bias, shift_t, coef_t, mask, float(alpha),
                                            0.0 if shift_t is not None or shift is None else float(shift),
                                            1.0 if coef_t is not None else float(coef), kind, int(power), cfg,
                                            cfg['key'])
    except Exception as e:  # noqa: BLE001  (a launch that fails after the check: say so once, take the other path)
        _fail(cfg['key'], kind, power, q, f'its forward raised {type(e).__name__}: {_first_line(e)}')
        return None, _STATE[cfg['key']]
    return out, None


def attend(q, k, v, kind: str, power: int, scale, coef, bias=None, shift=None, mask=None):
    """``coef * ((g(scale q k^T + bias + shift) * keep) @ v)`` fused, in the inputs' dtype, for the kernels'
    forward (the counterpart of ``blocked.pointwise_attention``); None where the fused kernel cannot take the call
    (the reason logged once: the caller then runs it in tiles). ``scale``: a float > 0 or a tensor broadcastable to
    (B, h, 1, 1) (folded into q, so it gets its gradient); a float scale of the homogeneous activations (x^p, relu)
    without bias and shift moves into ``coef``, otherwise into the score product."""
    alpha = 1.0
    if isinstance(scale, torch.Tensor):
        q = (q * scale).to(q.dtype)  # the product in fp32, then one rounding to q's dtype
    elif bias is None and shift is None and kind in ('pow', 'relu'):
        coef = coef * float(scale) ** (power if kind == 'pow' else 1)  # (a s)^p = a^p s^p, relu(a s) = a relu(s)
    else:
        alpha = float(scale)
    if isinstance(coef, torch.Tensor) and coef.requires_grad:
        out, why = fused_pointwise(q, k, v, kind, power, alpha, 1.0, bias, shift, mask)
        out = None if out is None else out * coef.to(out.dtype)
    else:
        out, why = fused_pointwise(q, k, v, kind, power, alpha, coef, bias, shift, mask)
    if out is None and why not in _FAILED:
        say_once(f'softfree_mm: {label(kind, power)} attention: no fused kernel for this call ({why}); running it '
                 'in tiles')
    return out


def _key_of(kind, power, q, v, flags):
    return (kind, int(power), str(q.device), q.dtype, _pow2(q.shape[-1]), _pow2(v.shape[-1]),
            tuple(sorted(flags.items())), _precision(q.dtype), interpreting())


def reset() -> None:
    """Forget every check, failure and logged reason (tests)."""
    _STATE.clear()
    _SAID.clear()
    _FAILED.clear()
