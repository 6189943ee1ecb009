"""When the fused pointwise kernel (``fused_pointwise.py``) may take a call, and the first-use check that keeps a
wrong or broken kernel from being used, with the process-wide record of what passed and what failed.

What does not run fused (the caller takes its other path, the reason logged once): fp64, head_dim or dv above 128,
powers above 4, a bias that needs a gradient (Swin's relative position bias: windows, which take the explicit path
anyway), more than 65535 (batch, head) pairs, no triton, a CPU tensor without TRITON_INTERPRET=1.

The first use in a process on a given device, dtype and variant runs the kernel on a small problem against the
explicit formula, forward and backward; a mismatch or a compile error logs one line naming the kernel and the cause,
and that variant is not used again in the process. A launch that fails later does the same (:func:`fail`).
"""
import logging
import os
from typing import Callable, Dict, Optional, Tuple

import torch

logger = logging.getLogger('softfree_mm.attention')

KINDS = {'pow': 0, 'relu': 1, 'sigmoid': 2}
MAX_POWER = 4
MAX_HEAD_DIM = 128
MAX_PAIRS = 65535  # the grid's second axis
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
TOLERANCE = {torch.float32: 2e-4, torch.bfloat16: 4e-2, torch.float16: 1e-2}

STATE: Dict[tuple, object] = {}  # variant -> its block configuration (passed the check) or why it is not used
SAID = set()  # reasons already logged
FAILED = set()  # causes fail() logged (attend does not log them twice)


def interpreting() -> bool:
    """TRITON_INTERPRET is set: triton runs the kernels on CPU tensors (numpy), as the tests do."""
    return os.environ.get('TRITON_INTERPRET', '0') not in ('', '0')


def first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return (text[0] if text else '')[:200]


def triton_error() -> Optional[str]:
    try:
        from . import _fused_pointwise_kernels  # noqa: F401  (imports triton)
    except Exception as e:  # noqa: BLE001  (not installed, or a triton that fails at import)
        return f'triton cannot be imported ({type(e).__name__}: {first_line(e)})'
    return None


def label(kind: str, power: int) -> str:
    return f'poly{power}' if kind == 'pow' else kind


def say_once(message: str) -> None:
    """One log line per distinct message and process."""
    if message not in SAID:
        SAID.add(message)
        logger.warning(message)


def tensor_problem(q, k, v) -> Optional[str]:
    """What no fused kernel here takes in q, k and v (device, dtypes, head sizes, (batch, head) pairs), or None; the
    fused pointwise and the fused linear kernel both ask it."""
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
    return None


def unsupported(q, k, v, kind: str, power: int, bias=None) -> Optional[str]:
    """Why the fused kernel cannot take this call (None: it can)."""
    if kind not in KINDS:
        return f'unknown activation {kind!r}'
    if kind == 'pow' and not 1 <= power <= MAX_POWER:
        return f'power {power} (the fused kernel has powers 1 to {MAX_POWER})'
    why = tensor_problem(q, k, v)
    if why is not None:
        return why
    if bias is not None and bias.requires_grad:
        return 'a bias that needs a gradient (the fused backward gives none)'
    return triton_error()


# ------------------------------------------------------------------------------------------- configurations
def pow2(n: int) -> int:
    return max(16, 1 << (int(n) - 1).bit_length())


# each program's candidates (BLOCK_M, BLOCK_N, num_warps, num_stages), timed by triton.autotune at the first call of
# each key (_fused_pointwise_kernels.TUNE_KEY: head sizes, dtype, activation, size buckets) inside the run that uses
# them; a candidate that does not compile (too much shared memory in fp32) is skipped by the tuner
TUNE = {
    'fwd': [(128, 64, 8, 3), (128, 64, 4, 3), (64, 64, 4, 3), (128, 32, 4, 2), (64, 32, 4, 2), (64, 128, 8, 2),
            (128, 128, 8, 2), (32, 32, 4, 1)],
    'dkdv': [(64, 64, 8, 2), (64, 64, 4, 2), (32, 64, 4, 2), (64, 128, 8, 2), (32, 128, 4, 2), (16, 32, 4, 1)],
    'dq': [(64, 64, 8, 2), (64, 64, 4, 2), (64, 32, 4, 2), (128, 64, 8, 2), (128, 32, 4, 2), (32, 16, 4, 1)],
}
# under the interpreter one candidate each (numpy runs every program; the tests' sizes span several blocks)
INTERPRETED = {'fwd': [(32, 32, 4, 1)], 'dkdv': [(32, 32, 4, 1)], 'dq': [(32, 32, 4, 1)]}


def tune_configs() -> dict:
    """The candidates: under the interpreter one each; SOFTFREE_ATTN_TUNE=0 (the GPU check's kernel tests): the
    smallest of each, no timing; else TUNE."""
    if interpreting():
        return INTERPRETED
    if os.environ.get('SOFTFREE_ATTN_TUNE', '1') == '0':
        return {name: cands[-1:] for name, cands in TUNE.items()}
    return TUNE


def bucket(n: int) -> int:
    """The autotuning bucket of a size: the next power of two, at least 64."""
    return max(64, 1 << (int(n) - 1).bit_length())


def largest_blocks(configs: dict) -> tuple:
    """(rows, keys): the largest BLOCK_M and BLOCK_N among the candidates (the check spans two of each)."""
    return (max(c[0] for cs in configs.values() for c in cs), max(c[1] for cs in configs.values() for c in cs))


def precision(dtype) -> Optional[str]:
    if dtype != torch.float32:
        return None
    return 'tf32' if torch.backends.cuda.matmul.allow_tf32 else 'ieee'


def key_of(kind, power, q, v, flags):
    return (kind, int(power), str(q.device), q.dtype, pow2(q.shape[-1]), pow2(v.shape[-1]),
            tuple(sorted(flags.items())), precision(q.dtype), interpreting())


# ------------------------------------------------------------------------------------------- the check
def fail(key, kind, power, q, cause: str) -> str:
    """Record that this variant is not used again in the process, say so once; returns the cause."""
    STATE[key] = cause
    FAILED.add(cause)
    say_once(f'softfree_mm: fused {label(kind, power)} attention kernel on {q.device} {str(q.dtype)[6:]}: {cause}; '
             'using the unfused path instead')
    return cause


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


def _tolerance(dtype):
    if dtype == torch.float32 and precision(dtype) == 'tf32' and not interpreting():
        return 2e-2
    return TOLERANCE[dtype]


def check(kind, power, device, dtype, d, dv, flags, cfg, apply: Callable) -> Optional[str]:
    """Run the fused kernel (``apply``: the autograd Function's, with the Function's arguments) on a small problem of
    two of the largest candidate blocks each way, the second partial (batch 1, 2 heads), against :func:`reference`, forward and the gradients
    of q, k, v; None when every relative error (to the largest value of the reference) is within the dtype's
    tolerance, else the cause."""
    g = torch.Generator(device='cpu').manual_seed(0)
    bm, bn = largest_blocks(tune_configs())
    nq, nk, h = bm + 5, bn + 3, 2

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
        out = apply(q, k, v, bias, shift, coef, mask, alpha, shift_value, coef_value, kind, power, cfg, None)
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


def ready(kind, power, q, v, flags, apply: Callable) -> Tuple[Optional[dict], Optional[str]]:
    """(block configuration, None) when this variant passed its first-use check (run now if not yet), else
    (None, why not)."""
    key = key_of(kind, power, q, v, flags)
    state = STATE.get(key)
    if isinstance(state, dict):
        return state, None
    if isinstance(state, str):
        return None, state
    cfg = dict(key=key)  # the blocks: triton.autotune's choice per call (_fused_pointwise_kernels.TUNE_KEY)
    try:
        cause = check(kind, power, q.device, q.dtype, q.shape[-1], v.shape[-1], flags, cfg, apply)
    except Exception as e:  # noqa: BLE001  (compile errors of every candidate, too little shared memory)
        cause = f'its first-use check raised {type(e).__name__}: {first_line(e)}'
    if cause is None:
        STATE[key] = cfg
        return cfg, None
    return None, fail(key, kind, power, q, cause)


def reset() -> None:
    """Forget every check, failure and logged reason (tests)."""
    STATE.clear()
    SAID.clear()
    FAILED.clear()
