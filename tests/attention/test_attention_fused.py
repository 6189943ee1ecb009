"""The fused Triton kernels of poly / relu / sigmoid (attention/fused_pointwise.py) and the path dispatch
(attention/dispatch.py).

Without CUDA the kernels run under TRITON_INTERPRET=1 on CPU tensors (the same Triton programs, executed by numpy),
with CUDA compiled on the GPU. Guards: values and gradients of q, k, v (a learned per-head scale too) equal the
explicit path for every activation (p = 1..4, relu, sigmoid), with boolean masks, key-padding masks and additive
biases, at sizes that are no multiple of a block and head_dim 32 to 128, in fp32, bf16 and fp16; nothing of size
Nq x Nk is saved for backward; a failing kernel (wrong numbers, a compile error, a failing backward) falls back with
one log line naming the kernel and the cause; the CPU dispatch is what it always was, the CUDA rule takes the
explicit matrix within its budget and the fused kernel beyond; impl and SOFTFREE_ATTN_IMPL force one path, bad
values are refused naming what is valid.
"""
import logging

import pytest
import torch

from softfree_mm.attention import build_attention, dispatch
from softfree_mm.attention import _fused_pointwise_check as fp_check
from softfree_mm.attention import fused_pointwise as fp
from softfree_mm.attention.blocked import TILE_ELEMENTS

CUDA = torch.cuda.is_available()


@pytest.fixture
def dev(monkeypatch):
    pytest.importorskip('triton')
    if not CUDA:
        monkeypatch.setenv('TRITON_INTERPRET', '1')
    monkeypatch.delenv(dispatch.IMPL_ENV, raising=False)
    fp_check.reset()
    yield torch.device('cuda' if CUDA else 'cpu')
    fp_check.reset()


def _cfg(name, **kw):
    if name.startswith('poly'):
        return dict(type='poly', degree=int(name[4:]), **kw)
    return dict(type=name, **kw)


def _inputs(dev, b=1, h=2, nq=37, nk=45, d=40, dv=24, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, n, c, generator=g).to(dev, dtype).requires_grad_(True)
            for n, c in ((nq, d), (nk, d), (nk, dv))]


def _run(cfg, impl, q, k, v, dout, **kw):
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    extra = {n: t.detach().clone().requires_grad_(True) for n, t in kw.items()
             if n == 'scale' and isinstance(t, torch.Tensor)}
    kern = build_attention(dict(cfg, impl=impl), num_heads=q.shape[1])
    out = kern(*leaves, **dict(kw, **extra))
    grads = torch.autograd.grad(out, leaves + list(extra.values()), dout)
    return out.detach(), grads


def _close(a, b, rel):
    a, b = a.detach().float(), b.detach().float()
    err = float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))
    assert err <= rel, f'relative error {err:.3g} > {rel:g}'


@pytest.mark.parametrize('name', ['poly1', 'poly2', 'poly3', 'poly4', 'relu', 'sigmoid'])
def test_fused_equals_explicit_in_values_and_gradients_with_mask_and_bias(dev, name):
    """fp32, 37 queries x 45 keys (no multiple of the 32-blocks), head_dim 40, dv 24, a boolean mask
    (1, 1, Nq, Nk) shared by the heads with a fully masked row, an additive bias (1, h, Nq, Nk) and a learned
    per-head scale (XCiT's temperature: a tensor, which gets its gradient)."""
    q, k, v = _inputs(dev)
    g = torch.Generator().manual_seed(1)
    mask = torch.rand(1, 1, 37, 45, generator=g) > 0.4
    mask[0, 0, 3] = False  # a row with no valid key: a zero row, as the explicit path gives
    bias = 0.3 * torch.randn(1, 2, 37, 45, generator=g)
    dout = torch.randn(1, 2, 37, 24, generator=g).to(dev)
    scale = torch.tensor([0.11, 0.19], device=dev)
    before = dict(fp.LAUNCHES)
    got = _run(_cfg(name), 'fused', q, k, v, dout, mask=mask.to(dev), bias=bias.to(dev), scale=scale)
    want = _run(_cfg(name), 'explicit', q, k, v, dout, mask=mask.to(dev), bias=bias.to(dev), scale=scale)
    assert fp.LAUNCHES['forward'] > before['forward'] and fp.LAUNCHES['backward'] > before['backward']
    _close(got[0], want[0], 1e-5)
    assert float(got[0][0, :, 3].abs().max()) == 0.0
    for a, b in zip(got[1], want[1]):
        _close(a, b, 1e-5)


@pytest.mark.parametrize('name,dtype,rel', [('poly3', torch.bfloat16, 3e-2), ('relu', torch.bfloat16, 3e-2),
                                            ('sigmoid', torch.bfloat16, 3e-2), ('poly3', torch.float16, 5e-3),
                                            ('sigmoid', torch.float16, 5e-3)])
def test_fused_half_inputs_match_the_fp32_explicit_path(dev, name, dtype, rel):
    """bf16 / fp16 inputs (fp32 accumulation, powers in fp32): the output and the gradients in the inputs' dtype,
    within the half type's rounding of the fp32 explicit result on the same rounded inputs."""
    q, k, v = _inputs(dev, dtype=dtype, seed=2)
    dout = torch.randn(1, 2, 37, 24, generator=torch.Generator().manual_seed(3)).to(dev)
    out, grads = _run(_cfg(name), 'fused', q, k, v, dout.to(dtype))
    ref, ref_grads = _run(_cfg(name), 'explicit', *(t.detach().float() for t in (q, k, v)), dout)
    assert out.dtype == dtype and all(g.dtype == dtype for g in grads)
    _close(out, ref, rel)
    for a, b in zip(grads, ref_grads):
        _close(a, b, rel)


@pytest.mark.parametrize('head_dim', [32, 64, 128])
def test_fused_head_dims_32_to_128(dev, head_dim):
    q, k, v = _inputs(dev, b=1, h=1, nq=33, nk=35, d=head_dim, dv=head_dim, dtype=torch.bfloat16, seed=4)
    dout = torch.randn(1, 1, 33, head_dim, generator=torch.Generator().manual_seed(5)).to(dev, torch.bfloat16)
    out, grads = _run(_cfg('poly3'), 'fused', q, k, v, dout)
    ref, ref_grads = _run(_cfg('poly3'), 'explicit', *(t.detach().float() for t in (q, k, v)), dout.float())
    _close(out, ref, 3e-2)
    for a, b in zip(grads, ref_grads):
        _close(a, b, 3e-2)


@pytest.mark.parametrize('name', ['poly3', 'sigmoid'])
def test_fused_key_padding_mask_equals_deleting_the_padded_keys(dev, name):
    """A (B, 1, 1, Nk) key-padding mask (read with stride 0, no copy) gives per image exactly the output of the
    same call on the valid keys only (the row coefficient counts the valid keys)."""
    q, k, v = _inputs(dev, b=2, h=2, nq=34, nk=41, seed=6)
    valid = [41, 29]
    mask = torch.zeros(2, 1, 1, 41, dtype=torch.bool)
    for i, n in enumerate(valid):
        mask[i, ..., :n] = True
    kern = build_attention(_cfg(name, impl='fused'), num_heads=2)
    with torch.no_grad():
        out = kern(q, k, v, mask=mask.to(dev))
        for i, n in enumerate(valid):
            alone = kern(q[i:i + 1], k[i:i + 1, :, :n], v[i:i + 1, :, :n])
            _close(out[i:i + 1], alone, 2e-6)


def test_fused_saves_nothing_of_size_nq_by_nk_for_backward(dev):
    """What autograd keeps from a fused call: q, k, v (and the per-row coefficient), nothing quadratic."""
    from softfree_mm.analysis.benchmark.timing import saved_bytes
    q, k, v = _inputs(dev, b=1, h=2, nq=200, nk=180, d=32, dv=32, seed=7)
    kern = build_attention(_cfg('poly3', impl='fused'), num_heads=2)
    kern(q, k, v)  # the first-use check (it saves its own small problem)
    saved = saved_bytes(lambda: kern(q, k, v))
    inputs = sum(t.numel() * t.element_size() for t in (q, k, v))
    assert saved <= inputs, (saved, inputs)
    assert 2 * 200 * 180 * 4 > inputs  # one fp32 score matrix alone would be more than everything saved


def _fused_records(caplog):
    return [r.getMessage() for r in caplog.records if r.name == 'softfree_mm.attention']


def test_a_kernel_giving_wrong_numbers_falls_back_with_one_line(dev, monkeypatch, caplog):
    """The first-use check catches a forward that is off (here: the output times 1.01): one log line naming the
    kernel and the cause; this call and the next run the tiled path, with the explicit path's numbers."""
    real = fp._launch_forward
    monkeypatch.setattr(fp, '_launch_forward', lambda *a, **kw: real(*a, **kw) * 1.01)
    q, k, v = _inputs(dev, seed=8)
    kern = build_attention(_cfg('poly3', impl='fused'), num_heads=2)
    ref = build_attention(_cfg('poly3', impl='explicit'), num_heads=2)
    with caplog.at_level(logging.WARNING, logger='softfree_mm.attention'):
        for _ in range(2):
            with torch.no_grad():
                _close(kern(q, k, v), ref(q, k, v), 1e-5)
    lines = _fused_records(caplog)
    assert len(lines) == 1, lines
    assert 'fused poly3 attention kernel' in lines[0] and 'its output differs from the explicit formula' in lines[0]
    assert 'using the unfused path instead' in lines[0]


def test_a_kernel_that_fails_to_compile_falls_back_with_one_line(dev, monkeypatch, caplog):
    def broken():
        raise RuntimeError('PassManager::run failed (planted)')

    monkeypatch.setattr(fp, 'kernels', broken)
    q, k, v = _inputs(dev, seed=9)
    dout = torch.randn(1, 2, 37, 24).to(dev)
    with caplog.at_level(logging.WARNING, logger='softfree_mm.attention'):
        got = _run(_cfg('relu'), 'fused', q, k, v, dout)
        _run(_cfg('relu'), 'fused', q, k, v, dout)
    want = _run(_cfg('relu'), 'explicit', q, k, v, dout)
    for a, b in zip([got[0], *got[1]], [want[0], *want[1]]):
        _close(a, b, 1e-5)
    lines = _fused_records(caplog)
    assert len(lines) == 1, lines
    assert 'fused relu attention kernel' in lines[0] and 'RuntimeError: PassManager::run failed (planted)' in lines[0]


def test_a_backward_that_fails_after_the_check_recomputes_its_gradients_in_tiles(dev, monkeypatch, caplog):
    q, k, v = _inputs(dev, seed=10)
    dout = torch.randn(1, 2, 37, 24).to(dev)
    _run(_cfg('sigmoid'), 'fused', q, k, v, dout)  # the check passes with the real kernels

    def broken(*args, **kw):
        raise RuntimeError('an illegal memory access was encountered (planted)')

    monkeypatch.setattr(fp, '_launch_backward', broken)
    with caplog.at_level(logging.WARNING, logger='softfree_mm.attention'):
        got = _run(_cfg('sigmoid'), 'fused', q, k, v, dout)
    want = _run(_cfg('sigmoid'), 'explicit', q, k, v, dout)
    for a, b in zip(got[1], want[1]):
        _close(a, b, 1e-5)
    lines = _fused_records(caplog)
    assert len(lines) == 1 and 'fused sigmoid attention kernel' in lines[0] and 'its backward raised' in lines[0]


def test_fused_on_a_cpu_tensor_without_the_interpreter_runs_in_tiles_and_says_why(monkeypatch, caplog):
    monkeypatch.delenv('TRITON_INTERPRET', raising=False)
    monkeypatch.delenv(dispatch.IMPL_ENV, raising=False)
    fp_check.reset()
    q, k, v = _inputs('cpu', seed=11)
    with caplog.at_level(logging.WARNING, logger='softfree_mm.attention'), torch.no_grad():
        out = build_attention(_cfg('poly2', impl='fused'), num_heads=2)(q, k, v)
    _close(out, build_attention(_cfg('poly2', impl='explicit'), num_heads=2)(q, k, v), 1e-5)
    lines = _fused_records(caplog)
    assert len(lines) == 1 and 'poly2 attention: no fused kernel for this call (cpu tensors' in lines[0]
    assert 'TRITON_INTERPRET=1' in lines[0] and 'in tiles' in lines[0]
    fp_check.reset()


# ------------------------------------------------------------------------------------------- dispatch
def test_cpu_auto_dispatch_is_what_it_always_was(monkeypatch):
    """CPU: the explicit matrix up to TILE_ELEMENTS scores a (batch, head) pair, tiles beyond; poly also takes its
    factorised path where it is cheaper (no bias, no mask); the batch never counts."""
    monkeypatch.delenv(dispatch.IMPL_ENV, raising=False)
    for name in ('poly3', 'relu', 'sigmoid'):
        kern = build_attention(_cfg(name))
        for nq, nk in ((49, 49), (256, 256), (257, 256), (4096, 950)):
            q, k = torch.empty(64, 1, nq, 64), torch.empty(64, 1, nk, 64)
            path = kern.path(q, k, k, mask=torch.ones(1, dtype=torch.bool))
            assert path == ('tiled' if nq * nk > TILE_ELEMENTS else 'explicit'), (name, nq, nk)
    poly = build_attention(_cfg('poly1'))
    q = torch.empty(1, 1, 4096, 64)
    assert poly.path(q, q, q) == 'factorised' and poly.path(q, q, q, bias=torch.zeros(1)) == 'tiled'


def test_cuda_rule_takes_the_explicit_matrix_within_its_budget_and_the_fused_kernel_beyond():
    mib = 2 ** 20
    # 12 bytes a score over all (batch, head) pairs: 2 x 3 x 4096 x 4096 scores are 1152 MiB
    assert dispatch.explicit_bytes(6, 4096, 4096) == 1152 * mib
    assert dispatch.rule('cuda', 6, 4096, 4096, 1152 * mib) == 'explicit'
    assert dispatch.rule('cuda', 6, 4096, 4097, 1152 * mib) == 'fused'
    # the default budget: PVTv2-b2 stage 1 at 800x1216 (2 images, 1 head, 60800 queries x 950 keys) goes fused,
    # Swin-T's 7x7 windows of stage 1 (2 x 29 x 44 windows x 3 heads) stay explicit
    budget = dispatch.DEFAULT_EXPLICIT_MIB * mib
    assert dispatch.rule('cuda', 2, 60800, 950, budget) == 'fused'
    assert dispatch.rule('cuda', 2 * 29 * 44 * 3, 49, 49, budget) == 'explicit'
    assert dispatch.rule('cpu', 1, 60800, 950, budget) == 'tiled'
    # the tiled fallback on CUDA: thousands of queries a tile, within the tile budget
    rows, cols = dispatch.gpu_tile(2, 60800, 950)
    assert cols == 950 and rows >= 4096 and 2 * rows * cols <= dispatch.GPU_TILE_ELEMENTS
    assert dispatch.gpu_tile(1, 100, 50) == (100, 50)
    assert dispatch.tile_for(torch.empty(1, 1, 8, 4), torch.empty(1, 1, 8, 4)) is None  # CPU: blocked.py's tile
    assert dispatch.explicit_budget(torch.device('cuda', 0), 3.5) == int(3.5 * mib)


def test_impl_and_the_environment_switch_force_one_path(monkeypatch):
    q = torch.empty(1, 1, 4096, 64)
    small = torch.empty(1, 1, 16, 64)
    monkeypatch.delenv(dispatch.IMPL_ENV, raising=False)
    assert build_attention(_cfg('poly3', impl='tiled')).path(small, small, small) == 'tiled'
    assert build_attention(_cfg('relu', impl='explicit')).path(q, q, q) == 'explicit'
    assert build_attention(_cfg('sigmoid', impl='fused')).path(small, small, small) == 'fused'
    monkeypatch.setenv(dispatch.IMPL_ENV, 'explicit')
    for name in ('poly1', 'poly3', 'relu', 'sigmoid'):
        assert build_attention(_cfg(name, impl='tiled')).path(q, q, q) == 'explicit', name
    monkeypatch.setenv(dispatch.IMPL_ENV, 'tiled')
    kern = build_attention(_cfg('poly3'))
    assert kern.path(small, small, small) == 'tiled'
    x = torch.randn(1, 2, 16, 8)
    torch.testing.assert_close(kern(x, x, x), build_attention(_cfg('poly3', impl='explicit'))(x, x, x))
    monkeypatch.setenv(dispatch.IMPL_ENV, 'flash')
    with pytest.raises(ValueError, match=r"SOFTFREE_ATTN_IMPL='flash': must be one of auto, explicit, tiled, fused"):
        build_attention('relu')
    with pytest.raises(ValueError, match='SOFTFREE_ATTN_IMPL'):
        kern(x, x, x)


@pytest.mark.parametrize('cfg,message', [
    (dict(type='poly', impl='triton'),
     "poly: impl must be one of 'auto', 'explicit', 'tiled', 'fused', 'factorised', got 'triton'"),
    (dict(type='relu', impl=None), "relu: impl must be one of 'auto', 'explicit', 'tiled', 'fused', got None"),
    (dict(type='sigmoid', explicit_mib=0), 'sigmoid: explicit_mib must be None (the default budget) or a number'),
    (dict(type='poly', explicit_mib='1G'), "got '1G'"),
])
def test_bad_impl_or_budget_is_refused_naming_what_is_valid(cfg, message, monkeypatch):
    monkeypatch.delenv(dispatch.IMPL_ENV, raising=False)
    with pytest.raises(ValueError, match=message.replace('(', r'\(').replace(')', r'\)')):
        build_attention(cfg)


def test_fused_poly3_inside_a_pvt_backbone_gives_the_explicit_paths_features(dev):
    """The real model path: SoftFreePVTv2-b0 (one block a stage) with poly3, impl='fused' in every layer against
    impl='explicit', same weights, training mode (32 x 48 image): the same features, and the backward runs through
    the fused kernels to finite gradients. (The input's gradient of this random model is ill-conditioned: fp32
    rounding alone moves it by percents between the explicit and the tiled path, so it is not compared; the kernel's
    own gradients are, above.)"""
    from softfree_mm.models import SoftFreePVTv2
    torch.manual_seed(0)
    kw = dict(arch='b0', depths=(1, 1, 1, 1), drop_path_rate=0.0)
    fused = SoftFreePVTv2(attn_cfg=dict(type='poly', degree=3, impl='fused'), **kw).to(dev)
    explicit = SoftFreePVTv2(attn_cfg=dict(type='poly', degree=3, impl='explicit'), **kw).to(dev)
    explicit.load_state_dict(fused.state_dict())
    x = torch.randn(1, 3, 32, 48, device=dev)
    before = dict(fp.LAUNCHES)
    feats = fused(x)
    sum(f.square().mean() for f in feats).backward()
    assert fp.LAUNCHES['forward'] - before['forward'] >= 4  # every attention layer
    assert fp.LAUNCHES['backward'] - before['backward'] >= 4
    with torch.no_grad():
        for a, b in zip(feats, explicit(x)):
            _close(a, b, 1e-5)
    grads = [p.grad for p in fused.parameters() if p.grad is not None]
    assert len(grads) == sum(1 for p in fused.parameters() if p.requires_grad)
    assert all(torch.isfinite(g).all() for g in grads)


# ------------------------------------------------------------------------------------------- the other kernels
def test_soft_newton_steps_batched_as_on_cuda_equal_the_plain_steps():
    """SOFT's Newton iteration in its CUDA form (two launches a step: bmm, then baddbmm) gives the plain steps'
    inverse, and, differentiated through (SOFT-Norm), the same gradient."""
    from softfree_mm.attention.soft import _newton_steps, gaussian_kernel
    g = torch.Generator().manual_seed(12)
    lm = torch.randn(2, 3, 16, 8, generator=g, dtype=torch.float64) * 0.5
    k_ll = gaussian_kernel(lm, lm).requires_grad_(True)
    v0 = k_ll / k_ll.sum(-1).amax() ** 2
    plain = _newton_steps(k_ll, v0, 20)
    batched = _newton_steps(k_ll, v0, 20, batched=True)
    torch.testing.assert_close(batched, plain, rtol=1e-10, atol=1e-12)
    eye = torch.eye(16, dtype=torch.float64)
    assert float((k_ll @ batched - eye).detach().abs().max()) < 1e-3  # it is an inverse (K(L, L) is well conditioned here)
    w = torch.randn(plain.shape, generator=g, dtype=torch.float64)
    ga, = torch.autograd.grad((plain * w).sum(), k_ll, retain_graph=True)  # v0 is shared by both
    gb, = torch.autograd.grad((batched * w).sum(), k_ll)
    torch.testing.assert_close(gb, ga, rtol=1e-8, atol=1e-10)


def test_linear_forward_holds_no_temporary_beyond_its_feature_maps_and_output():
    """linear (elu+1) without a mask: phi(q), phi(k) and the output are the only (N, d)-sized tensors of its
    forward (the + 1 in place, the normaliser as a product), measured by the allocator's record on CPU."""
    from softfree_mm.analysis.benchmark.timing import peak_memory
    q, k, v = (torch.randn(1, 1, 8192, 64) for _ in range(3))
    kern = build_attention('linear')

    def fwd():
        with torch.no_grad():
            kern(q, k, v)

    assert peak_memory(fwd, 'cpu') < 3.1 * q.numel() * 4


def test_under_jit_trace_fused_becomes_tiles_and_auto_the_cpu_rule(monkeypatch):
    """A traced graph (ONNX export, FLOP counters) cannot hold a Triton launch: impl='fused' traces the tiled path
    (same numbers as the explicit one), and the trace runs without a fused launch."""
    monkeypatch.delenv(dispatch.IMPL_ENV, raising=False)
    kern = build_attention(_cfg('poly3', impl='fused'), num_heads=2)
    q, k, v = (torch.randn(1, 2, 20, 8) for _ in range(3))
    before = fp.LAUNCHES['forward']
    traced = torch.jit.trace(lambda a, b, c: kern(a, b, c), (q, k, v), check_trace=False)
    assert fp.LAUNCHES['forward'] == before
    torch.testing.assert_close(traced(q, k, v), build_attention(_cfg('poly3', impl='explicit'))(q, k, v))


def test_every_program_is_autotuned_per_head_size_dtype_and_size_bucket(monkeypatch):
    """Compiled (not interpreted), the forward and both backward programs are triton.autotune'd over their own
    candidates, keyed by the head sizes, the activation and its extras and the sizes' power-of-two buckets (the
    inputs' dtype is in every autotune key), so that the measuring run tunes them; nothing compiles here (no GPU)."""
    pytest.importorskip('triton')
    from triton.runtime.autotuner import Autotuner
    from softfree_mm.attention import _fused_pointwise_kernels as src
    monkeypatch.delenv('TRITON_INTERPRET', raising=False)
    monkeypatch.setattr(fp, '_KERNELS', {})
    progs = fp.kernels()
    assert not fp_check.interpreting() and len(progs) == 3
    for prog, name in zip(progs, ('fwd', 'dkdv', 'dq')):
        assert isinstance(prog, Autotuner) and prog.keys == src.TUNE_KEY
        got = [(c.kwargs['BLOCK_M'], c.kwargs['BLOCK_N'], c.num_warps, c.num_stages) for c in prog.configs]
        assert got == fp_check.TUNE[name] and len(got) > 1
    assert {'D', 'DV', 'NQ_BUCKET', 'NK_BUCKET', 'KIND', 'POWER'} <= set(src.TUNE_KEY)
    assert [fp_check.bucket(n) for n in (1, 64, 65, 1000, 4096, 4097)] == [64, 64, 128, 1024, 4096, 8192]
    # under the interpreter: one candidate each (no timing), the check spanning two of its blocks
    monkeypatch.setenv('TRITON_INTERPRET', '1')
    assert all(len(c) == 1 for c in fp_check.tune_configs().values())
