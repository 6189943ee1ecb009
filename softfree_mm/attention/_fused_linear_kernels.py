"""The Triton programs behind ``fused_linear.py``: bidirectional (non-causal) linear attention in two passes.

Imported only when the fused linear kernel is first used (``fused_linear.kernels``); :func:`build` wraps the
functions with ``triton.jit``, which reads TRITON_INTERPRET at that moment (see _fused_pointwise_kernels.py).

Per (batch, head), with ``f = phi(x)`` the feature map applied in registers (FEAT 0 identity, 1 relu, 2 elu+1) and
every sum in fp32:

* ``_state`` (one program per chunk of keys and (batch, head): small batch x heads still fill the GPU): partial
  ``S = f(k)^T v`` (d x dv), ``z = sum_j f(k_j)`` and ``vs = sum_j v_j`` of its chunk; the caller adds the chunks.
* ``_out`` (one program per block of queries): ``u = f(q) S``, ``w = f(q).z`` and the output by MODE:
  0 ``u / (w + eps)`` (linear attention), 1 ``alpha u`` (x/sqrt(N): no normaliser), 2 ``alpha u + (1 - alpha w) beta
  vs`` (InLine's injective form, alpha = s/N, beta = 1/N).
* ``_bwd_q`` (per chunk of queries): ``dq`` and the partial ``dS = f(q)^T du``, ``dz = f(q)^T dw``, ``dvs``.
* ``_bwd_kv`` (per block of keys): ``dk = (v dS^T + dz) * phi'(k)``, ``dv = f(k) dS + dvs``.

UPCAST (the interpreter with bfloat16): every product in fp32 (it multiplies bfloat16 bit patterns as integers).
Only triton.language builtins are used (no jit helpers such as tl.sum: see _fused_pointwise_kernels.py): a sum over
rows is a product with a block of ones (R = 16 equal columns; the caller keeps the first), a per-row scalar a product
that gives it in every column it is needed in, and a vector broadcast over rows a load with stride 0.
"""
import triton
import triton.language as tl


def _state(K, V, SP, ZP, VP, skb, skh, skn, skd, svb, svh, svn, svd,
           H, NK, D, DV, CHUNK, NCHUNK,
           FEAT: tl.constexpr, UPCAST: tl.constexpr, HALF: tl.constexpr, PRECISION: tl.constexpr,
           BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    pid_c = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    rn = tl.arange(0, BLOCK_N)
    rd = tl.arange(0, BLOCK_D)
    rdv = tl.arange(0, BLOCK_DV)
    d_ok = rd < D
    dv_ok = rdv < DV
    acc = tl.full((BLOCK_D, BLOCK_DV), 0.0, tl.float32)
    z = tl.full((BLOCK_D, 16), 0.0, tl.float32)
    vs = tl.full((BLOCK_DV, 16), 0.0, tl.float32)
    ones = tl.full((BLOCK_N, 16), 1.0, tl.float32)
    r16 = tl.arange(0, 16)
    first = pid_c * CHUNK
    for off in range(0, CHUNK, BLOCK_N):
        rows = first + off + rn
        ok = rows < NK
        k = tl.load(K + b * skb + h * skh + rows[:, None] * skn + rd[None, :] * skd,
                    mask=ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
        v = tl.load(V + b * svb + h * svh + rows[:, None] * svn + rdv[None, :] * svd,
                    mask=ok[:, None] & dv_ok[None, :], other=0.0)
        if FEAT == 1:
            f = tl.maximum(k, 0.0)
        elif FEAT == 2:
            f = tl.where(k > 0.0, k + 1.0, tl.exp(tl.minimum(k, 0.0)))
        else:
            f = k
        f = tl.where(ok[:, None] & d_ok[None, :], f, 0.0)
        if UPCAST:
            acc += tl.dot(tl.trans(f), v.to(tl.float32))
        elif HALF:  # 16-bit inputs: the features rounded to them, the product on the tensor cores, fp32 sums
            acc += tl.dot(tl.trans(f.to(v.dtype)), v)
        else:  # fp32 inputs (and 16-bit ones under the interpreter): fp32 operands
            acc += tl.dot(tl.trans(f), v.to(tl.float32), input_precision=PRECISION)
        z += tl.dot(tl.trans(f), ones, input_precision='ieee')
        vs += tl.dot(tl.trans(v.to(tl.float32)), ones, input_precision='ieee')
    base = pid_bh * NCHUNK + pid_c
    tl.store(SP + base * BLOCK_D * BLOCK_DV + rd[:, None] * BLOCK_DV + rdv[None, :], acc)
    tl.store(ZP + base * BLOCK_D * 16 + rd[:, None] * 16 + r16[None, :], z)
    tl.store(VP + base * BLOCK_DV * 16 + rdv[:, None] * 16 + r16[None, :], vs)


def _out(Q, S, Z, VS, O, sqb, sqh, sqm, sqd, sob, soh, som, sod,
         H, NQ, D, DV, alpha, beta, eps,
         MODE: tl.constexpr, FEAT: tl.constexpr, PRECISION: tl.constexpr,
         BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rd = tl.arange(0, BLOCK_D)
    rdv = tl.arange(0, BLOCK_DV)
    row_ok = rm < NQ
    d_ok = rd < D
    s = tl.load(S + pid_bh * BLOCK_D * BLOCK_DV + rd[:, None] * BLOCK_DV + rdv[None, :])
    zt = tl.load(Z + pid_bh * BLOCK_D + rd[:, None] + rdv[None, :] * 0)  # z in every column
    q = tl.load(Q + b * sqb + h * sqh + rm[:, None] * sqm + rd[None, :] * sqd,
                mask=row_ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
    if FEAT == 1:
        f = tl.maximum(q, 0.0)
    elif FEAT == 2:
        f = tl.where(q > 0.0, q + 1.0, tl.exp(tl.minimum(q, 0.0)))
    else:
        f = q
    f = tl.where(d_ok[None, :], f, 0.0)
    u = tl.dot(f, s, input_precision=PRECISION)
    w = tl.dot(f, zt, input_precision='ieee')  # (rows, dv): f(q_i).z in every column
    if MODE == 0:
        o = u / (w + eps)
    elif MODE == 1:
        o = u * alpha
    else:
        vs = tl.load(VS + pid_bh * BLOCK_DV + rdv)
        o = u * alpha + (1.0 - alpha * w) * (vs * beta)[None, :]
    tl.store(O + b * sob + h * soh + rm[:, None] * som + rdv[None, :] * sod, o.to(O.dtype.element_ty),
             mask=row_ok[:, None] & (rdv < DV)[None, :])


def _bwd_q(Q, DO, S, Z, VS, DQ, SP, ZP, VP, sqb, sqh, sqm, sqd, sob, soh, som, sod,
           H, NQ, D, DV, CHUNK, NCHUNK, alpha, beta, eps,
           MODE: tl.constexpr, FEAT: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
           BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    pid_c = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    rm0 = tl.arange(0, BLOCK_M)
    rd = tl.arange(0, BLOCK_D)
    rdv = tl.arange(0, BLOCK_DV)
    d_ok = rd < D
    dv_ok = rdv < DV
    s = tl.load(S + pid_bh * BLOCK_D * BLOCK_DV + rd[:, None] * BLOCK_DV + rdv[None, :])
    z = tl.load(Z + pid_bh * BLOCK_D + rd)
    zt = tl.load(Z + pid_bh * BLOCK_D + rd[:, None] + rdv[None, :] * 0)  # (d, dv): z in every column
    vst = tl.load(VS + pid_bh * BLOCK_DV + rdv[:, None] + rd[None, :] * 0) * beta  # (dv, d): beta vs in every column
    ones_dv = tl.full((BLOCK_DV, BLOCK_D), 1.0, tl.float32)
    ones_m = tl.full((BLOCK_M, 16), 1.0, tl.float32)
    r16 = tl.arange(0, 16)
    ds = tl.full((BLOCK_D, BLOCK_DV), 0.0, tl.float32)
    dz = tl.full((BLOCK_D, 16), 0.0, tl.float32)
    dvs = tl.full((BLOCK_DV, 16), 0.0, tl.float32)
    first = pid_c * CHUNK
    for off in range(0, CHUNK, BLOCK_M):
        rm = first + off + rm0
        ok = rm < NQ
        q = tl.load(Q + b * sqb + h * sqh + rm[:, None] * sqm + rd[None, :] * sqd,
                    mask=ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
        do = tl.load(DO + b * sob + h * soh + rm[:, None] * som + rdv[None, :] * sod,
                     mask=ok[:, None] & dv_ok[None, :], other=0.0).to(tl.float32)
        if FEAT == 1:
            f = tl.maximum(q, 0.0)
            slope = tl.where(q > 0.0, 1.0, 0.0)
        elif FEAT == 2:
            f = tl.where(q > 0.0, q + 1.0, tl.exp(tl.minimum(q, 0.0)))
            slope = tl.minimum(f, 1.0)
        else:
            f = q
            slope = tl.full((BLOCK_M, BLOCK_D), 1.0, tl.float32)
        f = tl.where(ok[:, None] & d_ok[None, :], f, 0.0)
        # dw: a per-row scalar, here in every one of the d columns it multiplies
        if MODE == 0:
            u = tl.dot(f, s, input_precision=PRECISION)
            den = tl.dot(f, zt, input_precision='ieee') + eps  # (rows, dv)
            du = do / den
            dw = -tl.dot(du * u / den, ones_dv, input_precision='ieee')  # (rows, d)
        elif MODE == 1:
            du = do * alpha
            dw = tl.full((BLOCK_M, BLOCK_D), 0.0, tl.float32)
        else:
            du = do * alpha
            dw = -alpha * tl.dot(do, vst, input_precision='ieee')
            w = tl.dot(f, zt, input_precision='ieee')
            dvs += tl.dot(tl.trans((1.0 - alpha * w) * do), ones_m, input_precision='ieee')
        df = tl.dot(du, tl.trans(s), input_precision=PRECISION) + dw * z[None, :]
        tl.store(DQ + pid_bh * NQ * D + rm[:, None] * D + rd[None, :], (df * slope).to(DQ.dtype.element_ty),
                 mask=ok[:, None] & d_ok[None, :])
        ds += tl.dot(tl.trans(f), du, input_precision=PRECISION)
        dz += tl.dot(tl.trans(f * dw), ones_m, input_precision='ieee')
    base = pid_bh * NCHUNK + pid_c
    tl.store(SP + base * BLOCK_D * BLOCK_DV + rd[:, None] * BLOCK_DV + rdv[None, :], ds)
    tl.store(ZP + base * BLOCK_D * 16 + rd[:, None] * 16 + r16[None, :], dz)
    tl.store(VP + base * BLOCK_DV * 16 + rdv[:, None] * 16 + r16[None, :], dvs * beta)


def _bwd_kv(K, V, DS, DZ, DVS, DK, DV_, skb, skh, skn, skd, svb, svh, svn, svd,
            H, NK, D, DV, FEAT: tl.constexpr, PRECISION: tl.constexpr,
            BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rd = tl.arange(0, BLOCK_D)
    rdv = tl.arange(0, BLOCK_DV)
    ok = rn < NK
    d_ok = rd < D
    dv_ok = rdv < DV
    ds = tl.load(DS + pid_bh * BLOCK_D * BLOCK_DV + rd[:, None] * BLOCK_DV + rdv[None, :])
    dz = tl.load(DZ + pid_bh * BLOCK_D + rd)
    dvs = tl.load(DVS + pid_bh * BLOCK_DV + rdv)
    k = tl.load(K + b * skb + h * skh + rn[:, None] * skn + rd[None, :] * skd,
                mask=ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
    v = tl.load(V + b * svb + h * svh + rn[:, None] * svn + rdv[None, :] * svd,
                mask=ok[:, None] & dv_ok[None, :], other=0.0).to(tl.float32)
    if FEAT == 1:
        f = tl.maximum(k, 0.0)
        slope = tl.where(k > 0.0, 1.0, 0.0)
    elif FEAT == 2:
        f = tl.where(k > 0.0, k + 1.0, tl.exp(tl.minimum(k, 0.0)))
        slope = tl.minimum(f, 1.0)
    else:
        f = k
        slope = tl.full((BLOCK_N, BLOCK_D), 1.0, tl.float32)
    f = tl.where(d_ok[None, :], f, 0.0)
    df = tl.dot(v, tl.trans(ds), input_precision=PRECISION) + dz[None, :]
    dv = tl.dot(f, ds, input_precision=PRECISION) + dvs[None, :]
    tl.store(DK + pid_bh * NK * D + rn[:, None] * D + rd[None, :], (df * slope).to(DK.dtype.element_ty),
             mask=ok[:, None] & d_ok[None, :])
    tl.store(DV_ + pid_bh * NK * DV + rn[:, None] * DV + rdv[None, :], dv.to(DV_.dtype.element_ty),
             mask=ok[:, None] & dv_ok[None, :])


def build():
    """(state, out, bwd_q, bwd_kv), jit-compiled, or interpreted under TRITON_INTERPRET=1."""
    return tuple(triton.jit(fn) for fn in (_state, _out, _bwd_q, _bwd_kv))
