"""Synthesizer attention: each mode's logits against a plain reference, masks, bias, lengths, dtypes, errors."""
import itertools

import pytest
import torch

from softfree_mm.attention import build_attention

B, H, D, L = 2, 2, 4, 12
F64 = torch.float64
MODES = ['random', 'factorized_random', 'dense', 'factorized_dense']


def rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=F64)


def build(mode, **kw):
    torch.manual_seed(0)
    kern = build_attention(dict(type='synthesizer', mode=mode, max_len=L, rank=3, **kw), num_heads=H, head_dim=D)
    with torch.no_grad():  # non-zero biases so that they are checked too
        for name, p in kern.named_parameters():
            if name.startswith('b'):
                p.normal_()
    return kern


def ref_logits(kern, q, nk):
    """The synthetic logits from the parameters, with explicit einsums (float64)."""
    p = {name: t.detach().to(F64) for name, t in kern.named_parameters()}
    nq = q.shape[2]
    if kern.mode == 'random':
        return p['table'][:, :nq, :nk].expand(q.shape[0], -1, -1, -1)
    if kern.mode == 'factorized_random':
        return torch.einsum('hik,hjk->hij', p['r1'][:, :nq], p['r2'][:, :nk]).expand(q.shape[0], -1, -1, -1)
    hid = torch.relu(torch.einsum('bhnd,hde->bhne', q, p['w1']) + p['b1'])
    if kern.mode == 'factorized_dense':
        hid = torch.einsum('bhne,her->bhnr', hid, p['u'])
    return torch.einsum('bhnr,hrl->bhnl', hid, p['w2'][..., :nk]) + p['b2'][..., :nk]


def ref_compact(synth, keep):
    """Masked keys deleted: in each row the j-th kept key reads the synthetic logit of position j (loops)."""
    keep = keep.expand_as(synth)
    out = torch.zeros_like(synth)
    nb, nh, nq, _ = synth.shape
    for b, h, i in itertools.product(range(nb), range(nh), range(nq)):
        for rank, j in enumerate(keep[b, h, i].nonzero().flatten().tolist()):
            out[b, h, i, j] = synth[b, h, i, rank]
    return out


def ref_softmax(logits, keep):
    """exp / sum over the kept entries only; rows with no kept entry are zero."""
    keep = keep.expand_as(logits)
    z = torch.where(keep, logits, torch.zeros_like(logits))
    e = torch.exp(z - z.amax(-1, keepdim=True)) * keep
    tot = e.sum(-1, keepdim=True)
    return torch.where(tot > 0, e / tot.clamp_min(1e-300), torch.zeros_like(e))


@pytest.mark.parametrize('mode', MODES)
@pytest.mark.parametrize('mix', [False, True])
def test_matrix_and_forward_match_plain_reference(mode, mix):
    kern = build(mode, mix=mix)
    nq = nk = 7
    q, k, v = rand(B, H, nq, D, seed=1), rand(B, H, nk, D, seed=2), rand(B, H, nk, 5, seed=3)
    bias = rand(H, nq, nk, seed=4)
    keep = torch.rand(B, 1, nq, nk, generator=torch.Generator().manual_seed(5)) > 0.3
    keep[0, 0, 2] = False  # a row with no valid key
    logits = ref_compact(ref_logits(kern, q, nk), keep) + bias
    if mix:
        logits = logits + (q @ k.transpose(-2, -1)) * D ** -0.5
    ref = ref_softmax(logits, keep)
    a = kern.attention_matrix(q, k, bias=bias, mask=keep)
    torch.testing.assert_close(a, ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(kern(q, k, v, bias=bias, mask=keep), ref @ v, rtol=1e-10, atol=1e-12)
    assert a[0, :, 2].abs().max() == 0 and a[~keep.expand_as(a)].abs().max() == 0


def test_logits_are_sliced_to_rectangular_nq_by_nk():
    kern = build('factorized_random')
    q, k = rand(1, H, 3, D, seed=1), rand(1, H, 9, D, seed=2)
    a = kern.attention_matrix(q, k)
    assert a.shape == (1, H, 3, 9)
    torch.testing.assert_close(a, torch.softmax(ref_logits(kern, q, 9), -1))


def test_random_mode_without_mix_ignores_queries_and_keys():
    kern = build('random')
    a1 = kern.attention_matrix(rand(1, H, 5, D, seed=1), rand(1, H, 5, D, seed=2))
    a2 = kern.attention_matrix(rand(1, H, 5, D, seed=3), rand(1, H, 5, D, seed=4))
    torch.testing.assert_close(a1, a2)
    torch.testing.assert_close(a1.sum(-1), torch.ones(1, H, 5, dtype=F64))


@pytest.mark.parametrize('mode', MODES)
def test_every_parameter_gets_a_gradient(mode):
    kern = build(mode, mix=True)
    q, k, v = (rand(B, H, 6, D, seed=i).float().requires_grad_() for i in range(3))
    kern(q, k, v).square().sum().backward()
    for name, p in kern.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    assert q.grad.abs().sum() > 0 and k.grad.abs().sum() > 0


@pytest.mark.parametrize('dtype', [torch.float32, F64, torch.bfloat16, torch.float16])
def test_dtypes_return_input_dtype_and_stay_finite_at_scores_60(dtype):
    kern = build('dense', mix=True)
    q, k, v = rand(B, H, 8, D, seed=1), rand(B, H, 8, D, seed=2), rand(B, H, 8, D, seed=3)
    q = q * (60 / ((q @ k.transpose(-2, -1)) * D ** -0.5).abs().max())  # scores up to +-60
    q, k, v = (t.to(dtype).requires_grad_() for t in (q, k, v))
    mask = torch.ones(8, 8, dtype=torch.bool)
    mask[3] = False
    out = kern(q, k, v, mask=mask)
    assert out.dtype == dtype and torch.isfinite(out).all()
    out.float().square().mean().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


def test_bf16_autocast_gives_finite_outputs_and_grads():
    kern = build('factorized_dense', mix=True)
    q, k, v = (rand(B, H, 8, D, seed=i).float().requires_grad_() for i in range(3))
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = kern(q, k, v, bias=torch.zeros(8, 8))
        out.float().sum().backward()
    assert torch.isfinite(out).all() and all(torch.isfinite(t.grad).all() for t in (q, k, v))


def test_gradcheck_float64():
    kern = build('dense', mix=True)  # float32 parameters, float64 math
    q, k, v = (rand(1, H, 2, D, seed=i).requires_grad_() for i in range(3))
    assert torch.autograd.gradcheck(lambda a, b, c: kern(a, b, c), (q, k, v))


def test_compiles_fullgraph():
    kern = build('dense', mix=True)
    q, k, v = (rand(B, H, 6, D, seed=i).float() for i in range(3))
    mask = torch.ones(6, 6, dtype=torch.bool).tril()
    compiled = torch.compile(kern, fullgraph=True, backend='eager')
    torch.testing.assert_close(compiled(q, k, v, mask=mask), kern(q, k, v, mask=mask))


def test_errors_name_the_bad_value():
    with pytest.raises(ValueError, match="mode 'conv'.*random, factorized_random, dense, factorized_dense"):
        build_attention(dict(type='synthesizer', mode='conv'), num_heads=H, head_dim=D)
    with pytest.raises(ValueError, match="mode 'random' needs num_heads"):
        build_attention('synthesizer')
    with pytest.raises(ValueError, match="mode 'dense' needs num_heads and head_dim"):
        build_attention(dict(type='synthesizer', mode='dense'), num_heads=H)
    assert build_attention('synthesizer', num_heads=H).table.shape == (H, 256, 256)  # random mode: no head_dim
    with pytest.raises(ValueError, match='max_len must be a positive int, got 0'):
        build_attention(dict(type='synthesizer', max_len=0), num_heads=H, head_dim=D)
    kern = build('random')
    q = rand(1, H, L + 1, D)
    with pytest.raises(ValueError, match=f'Nq={L + 1} and Nk={L + 1}.*max_len={L}'):
        kern(q, q, q)
    with pytest.raises(ValueError, match=f'Nk={L + 1}.*max_len={L}'):
        kern.attention_matrix(q[:, :, :2], q)
