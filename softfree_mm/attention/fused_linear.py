"""Fused bidirectional linear attention for GPUs (Triton): the factorised order of the linear family (``linear``,
elu+1 or relu features), of x/sqrt(N) (``poly`` degree 1) and of InLine's injective linear part, in one pass over
the keys and one over the queries, forward and backward.

``out_i = phi(q_i)^T S / (phi(q_i).z + eps)`` ('normalised'), ``alpha phi(q_i)^T S`` ('plain'), or
``alpha phi(q_i)^T S + (1 - alpha phi(q_i).z) beta vs`` ('injective'), with ``S = sum_j phi(k_j) v_j^T``,
``z = sum_j phi(k_j)``, ``vs = sum_j v_j``. The key pass runs one program per chunk of keys and (batch, head) and
adds the chunks' partial states (so that batch 1 x 4 heads fills the GPU too); the feature map runs in registers;
inputs in fp32, bf16 or fp16 with every sum in fp32 and the output in the inputs' dtype; head_dim and dv up to 128.
Masks never come here: a key-masked call stays on the torch path (it keeps the factorised order, with the masked
keys' rows zeroed there), a call with a general mask takes the explicit order.

Where it runs: the factorised order of those kernels on CUDA tensors, and on CPU tensors under TRITON_INTERPRET=1
(the tests). The first use per device, dtype, head sizes, form and feature map is checked against the explicit
formula, forward and backward (as the fused pointwise kernel is: ``_fused_pointwise_check.py``); a variant that
fails its check or a launch is not used again in the process, the call then runs the kernel's torch code, and the
reason is logged once. Programs: ``_fused_linear_kernels.py``.
"""
from typing import Dict, Optional

import torch

from ._fused_pointwise_check import first_line, interpreting, pow2, say_once, tensor_problem

FORMS = {'normalised': 0, 'plain': 1, 'injective': 2}
FEATURES = {'identity': 0, 'relu': 1, 'elu+1': 2}
TOLERANCE = {torch.float32: 2e-4, torch.bfloat16: 4e-2, torch.float16: 1e-2}

_KERNELS: Dict[bool, tuple] = {}
STATE: Dict[tuple, object] = {}  # variant -> its blocks (passed the check) or why it is not used
LAUNCHES = {'forward': 0, 'backward': 0}  # fused calls in this process (forward: the calls, not the checks)


def allowed(q) -> bool:
    """Whether a factorised call may try the fused kernel: CUDA tensors, or CPU tensors under TRITON_INTERPRET=1
    (the tests). Anything else never imports triton."""
    return q.device.type == 'cuda' or (q.device.type == 'cpu' and interpreting())


def kernels():
    interp = interpreting()
    if interp not in _KERNELS:
        from . import _fused_linear_kernels as src
        _KERNELS[interp] = src.build()
    return _KERNELS[interp]


def unsupported(q, k, v, form: str, feature: str) -> Optional[str]:
    """Why the fused kernel cannot take this call (None: it can)."""
    if form not in FORMS or feature not in FEATURES:
        return f'form {form!r} / feature map {feature!r} (fused: {", ".join(FORMS)} with {", ".join(FEATURES)})'
    why = tensor_problem(q, k, v)
    if why is not None:
        return why
    if torch.jit.is_tracing():
        return 'torch.jit tracing'
    try:
        kernels()
    except Exception as e:  # noqa: BLE001  (no triton, or one that fails at import)
        return f'triton cannot be imported ({type(e).__name__}: {first_line(e)})'
    return None


def blocks(d: int, dv: int, device) -> dict:
    """Block sizes and the key / query chunks: under the interpreter small (the tests' sizes span several blocks and
    chunks); on CUDA 64 rows (32 with 128-wide heads), 8 warps from 128-wide heads, chunks enough for 4 programs per
    streaming multiprocessor."""
    if interpreting():
        return dict(block=16, warps=4, programs=4)
    big = max(pow2(d), pow2(dv)) > 64
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return dict(block=32 if big else 64, warps=8 if big else 4, programs=4 * sms)


def _precision(dtype) -> str:
    if interpreting():
        return 'ieee'
    if dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32:
        return 'ieee'
    return 'tf32'


def _chunks(n: int, pairs: int, cfg: dict):
    """(rows per chunk, chunks): as many chunks as bring the programs to cfg['programs'], whole blocks each."""
    block = cfg['block']
    nblocks = max(1, -(-n // block))
    want = max(1, min(nblocks, -(-cfg['programs'] // max(1, pairs))))
    per = -(-nblocks // want)
    return per * block, -(-nblocks // per)


def _state(q, k, v, cfg):
    state_k, _, _, _ = kernels()
    b, h, nk, d = k.shape
    dv = v.shape[-1]
    bd, bdv = pow2(d), pow2(dv)
    chunk, nchunk = _chunks(nk, b * h, cfg)
    f32 = dict(dtype=torch.float32, device=q.device)
    sp = torch.empty(b * h, nchunk, bd, bdv, **f32)
    zp = torch.empty(b * h, nchunk, bd, 16, **f32)  # (16 equal columns: the first is kept)
    vp = torch.empty(b * h, nchunk, bdv, 16, **f32)
    state_k[(nchunk, b * h)](k, v, sp, zp, vp, *k.stride(), *v.stride(), h, nk, d, dv, chunk, nchunk,
                             FEAT=cfg['feat'], UPCAST=bool(interpreting() and q.dtype == torch.bfloat16),
                             HALF=bool(q.dtype != torch.float32 and not interpreting()),
                             PRECISION=_precision(q.dtype), BLOCK_N=cfg['block'], BLOCK_D=bd, BLOCK_DV=bdv,
                             num_warps=cfg['warps'])
    return sp.sum(1).contiguous(), zp[..., 0].sum(1).contiguous(), vp[..., 0].sum(1).contiguous()


class FusedLinearAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, form, feature, alpha, beta, eps, cfg):
        cfg = dict(cfg, feat=FEATURES[feature], mode=FORMS[form])
        s, z, vs = _state(q, k, v, cfg)
        _, out_k, _, _ = kernels()
        b, h, nq, d = q.shape
        dv = v.shape[-1]
        out = torch.empty(b, h, nq, dv, dtype=q.dtype, device=q.device)
        out_k[(-(-nq // cfg['block']), b * h)](q, s, z, vs, out, *q.stride(), *out.stride(), h, nq, d, dv,
                                               float(alpha), float(beta), float(eps), MODE=cfg['mode'],
                                               FEAT=cfg['feat'], PRECISION=_precision(q.dtype),
                                               BLOCK_M=cfg['block'], BLOCK_D=pow2(d), BLOCK_DV=pow2(dv),
                                               num_warps=cfg['warps'])
        ctx.save_for_backward(q, k, v, s, z, vs)
        ctx.setup = (alpha, beta, eps, cfg)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout):
        q, k, v, s, z, vs = ctx.saved_tensors
        alpha, beta, eps, cfg = ctx.setup
        _, _, bwd_q, bwd_kv = kernels()
        b, h, nq, d = q.shape
        nk, dv = k.shape[2], v.shape[-1]
        bd, bdv = pow2(d), pow2(dv)
        dout = dout.contiguous()
        chunk, nchunk = _chunks(nq, b * h, cfg)
        f32 = dict(dtype=torch.float32, device=q.device)
        sp = torch.empty(b * h, nchunk, bd, bdv, **f32)
        zp = torch.empty(b * h, nchunk, bd, 16, **f32)
        vp = torch.empty(b * h, nchunk, bdv, 16, **f32)
        dq = torch.empty(b, h, nq, d, dtype=q.dtype, device=q.device)
        prec = _precision(q.dtype)
        LAUNCHES['backward'] += 1
        bwd_q[(nchunk, b * h)](q, dout, s, z, vs, dq, sp, zp, vp, *q.stride(), *dout.stride(), h, nq, d, dv,
                               chunk, nchunk, float(alpha), float(beta), float(eps), MODE=cfg['mode'],
                               FEAT=cfg['feat'], UPCAST=False, PRECISION=prec, BLOCK_M=cfg['block'], BLOCK_D=bd,
                               BLOCK_DV=bdv, num_warps=cfg['warps'])
        ds, dz, dvs = sp.sum(1).contiguous(), zp[..., 0].sum(1).contiguous(), vp[..., 0].sum(1).contiguous()
        dk = torch.empty(b, h, nk, d, dtype=k.dtype, device=k.device)
        dv_ = torch.empty(b, h, nk, dv, dtype=v.dtype, device=v.device)
        bwd_kv[(-(-nk // cfg['block']), b * h)](k, v, ds, dz, dvs, dk, dv_, *k.stride(), *v.stride(), h, nk, d, dv,
                                                FEAT=cfg['feat'], PRECISION=prec, BLOCK_N=cfg['block'],
                                                BLOCK_D=bd, BLOCK_DV=bdv, num_warps=cfg['warps'])
        return dq, dk, dv_, None, None, None, None, None, None


def reference(q, k, v, form: str, feature: str, alpha=1.0, beta=1.0, eps=0.0):
    """The explicit formula in fp32 (what the check compares against): the N x N matrix, then A @ v."""
    q, k, v = (t.float() for t in (q, k, v))

    def phi(x):
        return x if feature == 'identity' else torch.relu(x) if feature == 'relu' else \
            torch.nn.functional.elu(x) + 1.0
    fq, fk = phi(q), phi(k)
    a = fq @ fk.transpose(-2, -1)
    if form == 'normalised':
        a = a / (a.sum(-1, keepdim=True) + eps)
    elif form == 'plain':
        a = alpha * a
    else:
        a = alpha * a + (1.0 - alpha * a.sum(-1, keepdim=True)) * beta
    return a @ v


def check(form, feature, device, dtype, d, dv, cfg) -> Optional[str]:
    """The fused kernel on a small problem spanning several blocks and chunks (batch 1, 2 heads, the last block
    partial) against :func:`reference`, forward and the gradients of q, k and v; None when every relative error is
    within the dtype's tolerance, else the cause."""
    g = torch.Generator(device='cpu').manual_seed(0)
    n, h = 5 * cfg['block'] + 3, 2

    def rand(*shape):
        return (torch.randn(*shape, generator=g) * 0.5).to(device)

    q, k, v = (rand(1, h, n, c).to(dtype).requires_grad_(True) for c in (d, d, dv))
    alpha, beta, eps = (0.7 / n, 1.0 / n, 1e-6) if form == 'injective' else (0.3, 1.0, 1e-6)
    with torch.enable_grad():
        out = FusedLinearAttention.apply(q, k, v, form, feature, alpha, beta, eps, cfg)
        dout = rand(1, h, n, dv).to(dtype)
        got = torch.autograd.grad(out, (q, k, v), dout)
        leaves = [t.detach().float().requires_grad_(True) for t in (q, k, v)]
        ref = reference(*leaves, form, feature, alpha, beta, eps)
        want = torch.autograd.grad(ref, leaves, dout.float())
    tol = TOLERANCE[dtype] if not (dtype == torch.float32 and _precision(dtype) == 'tf32') else 2e-2
    for what, a, b in zip(('output', 'dq', 'dk', 'dv'), (out, *got), (ref, *want)):
        a, b = a.detach().float(), b.detach()
        err = float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))
        if not err <= tol:
            return f'its {what} differs from the explicit formula by {err:.3g} of its largest value ' \
                   f'(tolerance {tol:g})'
    return None


def fused_linear(q, k, v, form: str, feature: str = 'identity', alpha: float = 1.0, beta: float = 1.0,
                 eps: float = 0.0) -> Optional[torch.Tensor]:
    """The factorised linear attention of ``form`` fused (the module's formulas), in the inputs' dtype; None where
    the fused kernel cannot or may not take the call (the reason logged once; the caller runs its torch code)."""
    why = unsupported(q, k, v, form, feature)
    if why is not None:
        if q.device.type == 'cuda':
            say_once(f'softfree_mm: {form} linear attention ({feature}): no fused kernel for this call ({why}); '
                     'running it in torch')
        return None
    key = (form, feature, str(q.device), q.dtype, pow2(q.shape[-1]), pow2(v.shape[-1]), interpreting(),
           _precision(q.dtype))
    state = STATE.get(key)
    if state is None:
        cfg = blocks(q.shape[-1], v.shape[-1], q.device)
        try:
            cause = check(form, feature, q.device, q.dtype, q.shape[-1], v.shape[-1], cfg)
        except Exception as e:  # noqa: BLE001  (a compile error, too little shared memory)
            cause = f'its first-use check raised {type(e).__name__}: {first_line(e)}'
        state = STATE[key] = cfg if cause is None else cause
        if cause is not None:
            say_once(f'softfree_mm: fused {form} linear attention ({feature}) on {q.device} {str(q.dtype)[6:]}: '
                     f'{cause}; using the torch path instead')
    if isinstance(state, str):
        return None
    try:
        LAUNCHES['forward'] += 1  # (the calls that run fused; the check's own launch is not counted)
        return FusedLinearAttention.apply(q, k, v, form, feature, float(alpha), float(beta), float(eps), state)
    except Exception as e:  # noqa: BLE001  (a launch that fails after the check: not used again)
        STATE[key] = cause = f'it raised {type(e).__name__}: {first_line(e)}'
        say_once(f'softfree_mm: fused {form} linear attention ({feature}) on {q.device}: {cause}; using the torch '
                 'path instead')
        return None


def reset() -> None:
    STATE.clear()
