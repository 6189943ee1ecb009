"""The Triton programs behind ``fused_pointwise.py`` (forward, and the two backward passes), each autotuned.

Imported only when a fused kernel is first used (``fused_pointwise.kernels``): the package itself imports without
triton. :func:`build` wraps the functions with ``triton.jit``, which reads TRITON_INTERPRET at that moment, so the
interpreted and the compiled set are built apart.

Every program computes, for one (batch, head) pair and one block of rows (or of keys), on fp32 scores:
``s = alpha * q k^T + shift_value (+ bias) (+ shift)``, ``a = coef * g(s)`` zeroed where ``keep`` is False or the key is past Nk;
forward ``out = a @ v``; backward ``dv = a^T @ dout``, ``ds = coef * g'(s) * (dout @ v^T)``, ``dq = alpha ds @ k``,
``dk = alpha ds^T @ q``. ``g``: KIND 0 = s^POWER (POWER 1..4), 1 = relu, 2 = sigmoid. The weights and ``ds`` go to
the second matrix product in the inputs' dtype (fp32 accumulation), as FlashAttention does. ``UPCAST``: both
operands of every product in fp32 after the same rounding (the interpreter multiplies bfloat16 bit patterns as
integers; the values are those of a bfloat16 product with fp32 accumulation). Only triton.language's builtins are
used (no jit helpers such as tl.zeros or tl.sigmoid: the interpreter cannot run those when triton was imported
before TRITON_INTERPRET was set).
"""
import triton
import triton.language as tl


def _fwd(Q, K, V, O, BIAS, SHIFT, COEF, MASK,
         sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd, sob, soh, som, sod,
         sbb, sbh, sbm, sbn, srb, srh, srm, scb, sch, scm, smb, smh, smm, smn,
         H, NQ, NK, D, DV, alpha, shift_value, coef_value, NQ_BUCKET, NK_BUCKET,
         KIND: tl.constexpr, POWER: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_SHIFT: tl.constexpr,
         HAS_COEF: tl.constexpr, HAS_MASK: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    """One block of rows: out = a @ v over every key block."""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.arange(0, BLOCK_N)
    rd = tl.arange(0, BLOCK_D)
    rdv = tl.arange(0, BLOCK_DV)
    row_ok = rm < NQ
    d_ok = rd < D
    dv_ok = rdv < DV
    q = tl.load(Q + b * sqb + h * sqh + rm[:, None] * sqm + rd[None, :] * sqd, mask=row_ok[:, None] & d_ok[None, :],
                other=0.0)
    if HAS_SHIFT:
        shift = tl.load(SHIFT + b * srb + h * srh + rm * srm, mask=row_ok, other=0.0).to(tl.float32)
    if HAS_COEF:
        coef = tl.load(COEF + b * scb + h * sch + rm * scm, mask=row_ok, other=0.0).to(tl.float32)
    # pointers of the first key block, moved by one block each step
    k_ptrs = K + b * skb + h * skh + rn[:, None] * skn + rd[None, :] * skd
    v_ptrs = V + b * svb + h * svh + rn[:, None] * svn + rdv[None, :] * svd
    bias_ptrs = BIAS + b * sbb + h * sbh + rm[:, None] * sbm + rn[None, :] * sbn
    mask_ptrs = MASK + b * smb + h * smh + rm[:, None] * smm + rn[None, :] * smn
    k_step, v_step, bias_step, mask_step = BLOCK_N * skn, BLOCK_N * svn, BLOCK_N * sbn, BLOCK_N * smn
    acc = tl.full((BLOCK_M, BLOCK_DV), 0.0, tl.float32)
    for start in range(0, NK, BLOCK_N):
        col_ok = start + rn < NK
        k = tl.load(k_ptrs, mask=col_ok[:, None] & d_ok[None, :], other=0.0)
        v = tl.load(v_ptrs, mask=col_ok[:, None] & dv_ok[None, :], other=0.0)
        if UPCAST:
            s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)))
        else:
            s = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        s = s * alpha + shift_value
        keep = row_ok[:, None] & col_ok[None, :]
        if HAS_BIAS:
            s += tl.load(bias_ptrs, mask=keep, other=0.0).to(tl.float32)
        if HAS_SHIFT:
            s += shift[:, None]
        if KIND == 0:
            a = s
            for _ in tl.static_range(POWER - 1):
                a = a * s
        elif KIND == 1:
            a = tl.maximum(s, 0.0)
        else:
            a = 1.0 / (1.0 + tl.exp(-s))
        if HAS_COEF:
            a = a * coef[:, None]
        else:
            a = a * coef_value
        if HAS_MASK:
            keep = keep & (tl.load(mask_ptrs, mask=keep, other=0) != 0)
        p = tl.where(keep, a, 0.0).to(v.dtype)
        if UPCAST:
            acc += tl.dot(p.to(tl.float32), v.to(tl.float32))
        else:
            acc += tl.dot(p, v, input_precision=PRECISION)
        k_ptrs += k_step
        v_ptrs += v_step
        bias_ptrs += bias_step
        mask_ptrs += mask_step
    tl.store(O + b * sob + h * soh + rm[:, None] * som + rdv[None, :] * sod, acc.to(O.dtype.element_ty),
             mask=row_ok[:, None] & dv_ok[None, :])


def _bwd_dkdv(Q, K, V, DO, DK, DV_, BIAS, SHIFT, COEF, MASK,
              sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd, sob, soh, som, sod,
              sbb, sbh, sbm, sbn, srb, srh, srm, scb, sch, scm, smb, smh, smm, smn,
              H, NQ, NK, D, DV, alpha, shift_value, coef_value, NQ_BUCKET, NK_BUCKET,
              KIND: tl.constexpr, POWER: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_SHIFT: tl.constexpr,
              HAS_COEF: tl.constexpr, HAS_MASK: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    """One block of keys: its dk, dv summed over every row block (scores recomputed transposed, keys x rows).
    DO has the strides ``so*``; DK and DV_ are contiguous (B, h, Nk, .)."""
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = tl.arange(0, BLOCK_M)
    rd = tl.arange(0, BLOCK_D)
    rdv = tl.arange(0, BLOCK_DV)
    col_ok = rn < NK
    d_ok = rd < D
    dv_ok = rdv < DV
    k = tl.load(K + b * skb + h * skh + rn[:, None] * skn + rd[None, :] * skd, mask=col_ok[:, None] & d_ok[None, :],
                other=0.0)
    v = tl.load(V + b * svb + h * svh + rn[:, None] * svn + rdv[None, :] * svd,
                mask=col_ok[:, None] & dv_ok[None, :], other=0.0)
    q_ptrs = Q + b * sqb + h * sqh + rm[:, None] * sqm + rd[None, :] * sqd
    do_ptrs = DO + b * sob + h * soh + rm[:, None] * som + rdv[None, :] * sod
    bias_ptrs = BIAS + b * sbb + h * sbh + rm[None, :] * sbm + rn[:, None] * sbn
    mask_ptrs = MASK + b * smb + h * smh + rm[None, :] * smm + rn[:, None] * smn
    shift_ptrs = SHIFT + b * srb + h * srh + rm * srm
    coef_ptrs = COEF + b * scb + h * sch + rm * scm
    q_step, do_step, bias_step, mask_step = BLOCK_M * sqm, BLOCK_M * som, BLOCK_M * sbm, BLOCK_M * smm
    shift_step, coef_step = BLOCK_M * srm, BLOCK_M * scm
    dk = tl.full((BLOCK_N, BLOCK_D), 0.0, tl.float32)
    dv = tl.full((BLOCK_N, BLOCK_DV), 0.0, tl.float32)
    for start in range(0, NQ, BLOCK_M):
        row_ok = start + rm < NQ
        q = tl.load(q_ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)
        do = tl.load(do_ptrs, mask=row_ok[:, None] & dv_ok[None, :], other=0.0)
        if UPCAST:
            st = tl.dot(k.to(tl.float32), tl.trans(q.to(tl.float32)))
            dat = tl.dot(v.to(tl.float32), tl.trans(do.to(tl.float32)))
        else:
            st = tl.dot(k, tl.trans(q), input_precision=PRECISION)  # scores^T (keys, rows)
            dat = tl.dot(v, tl.trans(do), input_precision=PRECISION)  # dA^T
        st = st * alpha + shift_value
        keep = col_ok[:, None] & row_ok[None, :]
        if HAS_BIAS:
            st += tl.load(bias_ptrs, mask=keep, other=0.0).to(tl.float32)
        if HAS_SHIFT:
            st += tl.load(shift_ptrs, mask=row_ok, other=0.0).to(tl.float32)[None, :]
        if HAS_COEF:
            c = tl.load(coef_ptrs, mask=row_ok, other=0.0).to(tl.float32)[None, :]
        else:
            c = coef_value
        if KIND == 0:
            low = tl.full((BLOCK_N, BLOCK_M), 1.0, tl.float32)  # s^(POWER - 1)
            for _ in tl.static_range(POWER - 1):
                low = low * st
            at = low * st * c
            slope = low * (POWER * c)
        elif KIND == 1:
            at = tl.maximum(st, 0.0) * c
            slope = tl.where(st > 0.0, c, 0.0)
        else:
            sig = 1.0 / (1.0 + tl.exp(-st))
            at = sig * c
            slope = sig * (1.0 - sig) * c
        if HAS_MASK:
            keep = keep & (tl.load(mask_ptrs, mask=keep, other=0) != 0)
        pt = tl.where(keep, at, 0.0).to(do.dtype)
        dst = tl.where(keep, dat * slope, 0.0).to(q.dtype)
        if UPCAST:
            dv += tl.dot(pt.to(tl.float32), do.to(tl.float32))
            dk += tl.dot(dst.to(tl.float32), q.to(tl.float32))
        else:
            dv += tl.dot(pt, do, input_precision=PRECISION)
            dk += tl.dot(dst, q, input_precision=PRECISION)
        q_ptrs += q_step
        do_ptrs += do_step
        bias_ptrs += bias_step
        mask_ptrs += mask_step
        shift_ptrs += shift_step
        coef_ptrs += coef_step
    dk = dk * alpha
    out_rows = pid_bh * NK + rn
    tl.store(DK + out_rows[:, None] * D + rd[None, :], dk.to(DK.dtype.element_ty), mask=col_ok[:, None] & d_ok[None, :])
    tl.store(DV_ + out_rows[:, None] * DV + rdv[None, :], dv.to(DV_.dtype.element_ty),
             mask=col_ok[:, None] & dv_ok[None, :])


def _bwd_dq(Q, K, V, DO, DQ, BIAS, SHIFT, COEF, MASK,
            sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd, sob, soh, som, sod,
            sbb, sbh, sbm, sbn, srb, srh, srm, scb, sch, scm, smb, smh, smm, smn,
            H, NQ, NK, D, DV, alpha, shift_value, coef_value, NQ_BUCKET, NK_BUCKET,
            KIND: tl.constexpr, POWER: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_SHIFT: tl.constexpr,
            HAS_COEF: tl.constexpr, HAS_MASK: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    """One block of rows: its dq summed over every key block. DQ is contiguous (B, h, Nq, d)."""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.arange(0, BLOCK_N)
    rd = tl.arange(0, BLOCK_D)
    rdv = tl.arange(0, BLOCK_DV)
    row_ok = rm < NQ
    d_ok = rd < D
    dv_ok = rdv < DV
    q = tl.load(Q + b * sqb + h * sqh + rm[:, None] * sqm + rd[None, :] * sqd, mask=row_ok[:, None] & d_ok[None, :],
                other=0.0)
    do = tl.load(DO + b * sob + h * soh + rm[:, None] * som + rdv[None, :] * sod,
                 mask=row_ok[:, None] & dv_ok[None, :], other=0.0)
    if HAS_SHIFT:
        shift = tl.load(SHIFT + b * srb + h * srh + rm * srm, mask=row_ok, other=0.0).to(tl.float32)
    if HAS_COEF:
        c = tl.load(COEF + b * scb + h * sch + rm * scm, mask=row_ok, other=0.0).to(tl.float32)[:, None]
    else:
        c = coef_value
    k_ptrs = K + b * skb + h * skh + rn[:, None] * skn + rd[None, :] * skd
    v_ptrs = V + b * svb + h * svh + rn[:, None] * svn + rdv[None, :] * svd
    bias_ptrs = BIAS + b * sbb + h * sbh + rm[:, None] * sbm + rn[None, :] * sbn
    mask_ptrs = MASK + b * smb + h * smh + rm[:, None] * smm + rn[None, :] * smn
    k_step, v_step, bias_step, mask_step = BLOCK_N * skn, BLOCK_N * svn, BLOCK_N * sbn, BLOCK_N * smn
    dq = tl.full((BLOCK_M, BLOCK_D), 0.0, tl.float32)
    for start in range(0, NK, BLOCK_N):
        col_ok = start + rn < NK
        k = tl.load(k_ptrs, mask=col_ok[:, None] & d_ok[None, :], other=0.0)
        v = tl.load(v_ptrs, mask=col_ok[:, None] & dv_ok[None, :], other=0.0)
        if UPCAST:
            s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)))
            da = tl.dot(do.to(tl.float32), tl.trans(v.to(tl.float32)))
        else:
            s = tl.dot(q, tl.trans(k), input_precision=PRECISION)
            da = tl.dot(do, tl.trans(v), input_precision=PRECISION)
        s = s * alpha + shift_value
        keep = row_ok[:, None] & col_ok[None, :]
        if HAS_BIAS:
            s += tl.load(bias_ptrs, mask=keep, other=0.0).to(tl.float32)
        if HAS_SHIFT:
            s += shift[:, None]
        if KIND == 0:
            slope = tl.full((BLOCK_M, BLOCK_N), POWER * 1.0, tl.float32)  # POWER s^(POWER - 1)
            for _ in tl.static_range(POWER - 1):
                slope = slope * s
            slope = slope * c
        elif KIND == 1:
            slope = tl.where(s > 0.0, c, 0.0)
        else:
            sig = 1.0 / (1.0 + tl.exp(-s))
            slope = sig * (1.0 - sig) * c
        if HAS_MASK:
            keep = keep & (tl.load(mask_ptrs, mask=keep, other=0) != 0)
        ds = tl.where(keep, da * slope, 0.0).to(k.dtype)
        if UPCAST:
            dq += tl.dot(ds.to(tl.float32), k.to(tl.float32))
        else:
            dq += tl.dot(ds, k, input_precision=PRECISION)
        k_ptrs += k_step
        v_ptrs += v_step
        bias_ptrs += bias_step
        mask_ptrs += mask_step
    dq = dq * alpha
    out_rows = pid_bh * NQ + rm
    tl.store(DQ + out_rows[:, None] * D + rd[None, :], dq.to(DQ.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])


# what each program's block sizes, warps and stages are tuned for: the head sizes, the activation and its extras,
# and the sizes' power-of-two buckets (``NQ_BUCKET``, ``NK_BUCKET``: a new image size within a bucket does not tune
# again); the inputs' dtype is part of every triton.autotune key
TUNE_KEY = ['D', 'DV', 'NQ_BUCKET', 'NK_BUCKET', 'KIND', 'POWER', 'HAS_BIAS', 'HAS_SHIFT', 'HAS_COEF', 'HAS_MASK']


def build(configs):
    """(forward, dk-dv, dq), jit-compiled, or interpreted under TRITON_INTERPRET=1, each under ``triton.autotune``
    over its candidates ``configs[program]``: (BLOCK_M, BLOCK_N, num_warps, num_stages) tuples (one candidate: no
    timing, as under the interpreter)."""
    out = []
    for fn, name in ((_fwd, 'fwd'), (_bwd_dkdv, 'dkdv'), (_bwd_dq, 'dq')):
        cands = [triton.Config({'BLOCK_M': m, 'BLOCK_N': n}, num_warps=w, num_stages=st)
                 for m, n, w, st in configs[name]]
        out.append(triton.autotune(configs=cands, key=TUNE_KEY)(triton.jit(fn)))
    return tuple(out)
