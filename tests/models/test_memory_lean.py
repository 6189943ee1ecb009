"""What autograd keeps for backward: the MLP keeps its hidden pre-activation only (gelu_linear), softmax with
recompute=True keeps its inputs only, and the softmax backbones keep less than their references (a property read
from the saved tensors themselves, so it holds on any device whose code path is the same)."""
import pytest
import torch
from torch import nn

import softfree_mm  # noqa: F401
from softfree_mm.analysis.benchmark.comparison import kept_for_backward
from softfree_mm.analysis.benchmark.references import reference_pair
from softfree_mm.analysis.benchmark.timing import saved_bytes
from softfree_mm.attention import build_attention
from softfree_mm.models.utils.mlp import Mlp, _GeluLinear, gelu_linear


def _saved_storages(fn):
    """{data_ptr: (shape, nbytes)} of the storages autograd saves during fn(), and fn()'s result."""
    kept = {}

    def pack(t):
        st = t.untyped_storage()
        kept.setdefault(st.data_ptr(), (tuple(t.shape), st.nbytes()))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return kept, out


# ------------------------------------------------------------------------------------------------ gelu_linear
@pytest.mark.parametrize('approximate, shape, bias', [('none', (2, 5, 8), True), ('tanh', (7, 8), True),
                                                      ('none', (3, 4, 2, 8), False)])
def test_gelu_linear_equals_linear_of_gelu_in_output_and_every_gradient(approximate, shape, bias):
    torch.manual_seed(0)
    act, fc = nn.GELU(approximate=approximate), nn.Linear(8, 5, bias=bias).double()
    h = torch.randn(*shape, dtype=torch.float64, requires_grad=True)
    out = gelu_linear(h, act, fc)
    assert type(out.grad_fn).__name__ == '_GeluLinearBackward'
    # the formula, written out: 0.5 h (1 + erf(h / sqrt 2)) (or the tanh form), then h W^T + b
    if approximate == 'none':
        a = 0.5 * h * (1 + torch.erf(h / 2 ** 0.5))
    else:
        a = 0.5 * h * (1 + torch.tanh((2 / torch.pi) ** 0.5 * (h + 0.044715 * h ** 3)))
    ref = a @ fc.weight.t() + (fc.bias if bias else 0)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    g = torch.randn_like(ref)
    leaves = [h] + list(fc.parameters())
    for got, want in zip(torch.autograd.grad((out * g).sum(), leaves), torch.autograd.grad((ref * g).sum(), leaves)):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    b = fc.bias.detach().requires_grad_() if bias else None
    assert torch.autograd.gradcheck(lambda t, w, *c: _GeluLinear.apply(t, w, c[0] if c else None, approximate),
                                    (h, fc.weight.detach().requires_grad_()) + ((b,) if bias else ()), fast_mode=True)


def test_mlp_keeps_one_hidden_sized_tensor_for_backward_where_autograd_keeps_two():
    torch.manual_seed(0)
    mlp = Mlp(16, 64)
    x = torch.randn(3, 10, 16, requires_grad=True)
    kept, out = _saved_storages(lambda: mlp(x))
    plain, ref = _saved_storages(lambda: mlp.fc2(mlp.act(mlp.fc1(x))))
    hidden = lambda d: [s for s in d.values() if s[1] == x.shape[0] * x.shape[1] * 64 * 4]  # noqa: E731
    assert len(hidden(kept)) == 1 and len(hidden(plain)) == 2
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    params = list(mlp.parameters())
    assert saved_bytes(lambda: mlp(x), storages=True, exclude=params) < \
        saved_bytes(lambda: mlp.fc2(mlp.act(mlp.fc1(x))), storages=True, exclude=params)


def test_gelu_linear_under_bf16_autocast_gives_autocasts_own_outputs_and_gradients():
    torch.manual_seed(0)
    mlp = Mlp(16, 64)
    x = torch.randn(4, 16, requires_grad=True)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = mlp(x)
        ref = mlp.fc2(mlp.act(mlp.fc1(x)))
    assert out.dtype == ref.dtype == torch.bfloat16
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    g = torch.randn(out.shape)
    leaves = [x] + list(mlp.parameters())
    got = torch.autograd.grad((out.float() * g).sum(), leaves)
    want = torch.autograd.grad((ref.float() * g).sum(), leaves)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype == torch.float32
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_mlp_takes_the_plain_layers_where_hooks_dropout_or_inference_need_them():
    torch.manual_seed(0)
    x = torch.randn(2, 8, requires_grad=True)
    mlp = Mlp(8, 32)
    seen = []
    handle = mlp.fc2.register_forward_hook(lambda m, a, o: seen.append(a[0].shape))
    out = mlp(x)
    handle.remove()
    assert seen == [(2, 32)] and type(out.grad_fn).__name__ != '_GeluLinearBackward'  # the hook saw gelu(h)
    handle = torch.nn.modules.module.register_module_forward_hook(lambda m, a, o: seen.append(type(m).__name__))
    try:
        mlp(x)
    finally:
        handle.remove()
    assert seen[1:] == ['Linear', 'GELU', 'Linear', 'Dropout', 'Mlp']  # a global hook sees every layer
    dropped = Mlp(8, 32, drop=0.5).train()
    torch.manual_seed(1)
    a = dropped(x)
    torch.manual_seed(1)
    b = dropped.drop2(dropped.fc2(dropped.drop1(dropped.act(dropped.fc1(x)))))
    torch.testing.assert_close(a, b, rtol=0, atol=0)  # the same dropout masks drawn
    with torch.no_grad():
        torch.testing.assert_close(mlp(x), mlp.fc2(mlp.act(mlp.fc1(x))), rtol=0, atol=0)


def test_pvt_dwconv_mlp_and_whole_backbones_train_as_with_the_plain_layers(monkeypatch):
    """The backbones' gradients with gelu_linear equal those with fc2(gelu(h)) (PVTv2's conv MLP feeds it a view
    of a channels-last conv output)."""
    from softfree_mm.analysis.benchmark.backbones import build_backbone

    torch.manual_seed(0)
    x = torch.randn(1, 3, 64, 96)
    for name in ('pvt_v2_b0', 'swin_t'):
        model, _ = build_backbone(name)
        model.train()
        results = []
        for patched in (False, True):
            if patched:  # the MLPs (timm's and PVTv2's conv MLP) look it up in models/utils/mlp.py
                from softfree_mm.models.utils import mlp
                monkeypatch.setattr(mlp, 'gelu_linear', lambda h, act, fc: fc(act(h)))
            model.zero_grad()
            outs = model(x)
            sum((o * (i + 1)).sum() for i, o in enumerate(outs)).backward()
            results.append(([o.detach() for o in outs], [p.grad.clone() for p in model.parameters()
                                                         if p.grad is not None]))
            monkeypatch.undo()
        (o1, g1), (o2, g2) = results
        assert len(g1) == len(g2) > 0
        for a, b in zip(o1 + g1, o2 + g2):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------------------ softmax recompute
def _inputs(case):
    g = torch.Generator().manual_seed(3)

    def r(*s):
        return torch.randn(*s, generator=g, dtype=torch.float64).requires_grad_()

    if case == 'window':  # Swin-like: the explicit path on the CPU, bias and mask
        mask = torch.rand(4, 1, 49, 49, generator=g) > 0.3
        mask |= torch.eye(49, dtype=torch.bool)
        return dict(q=r(4, 3, 49, 8), k=r(4, 3, 49, 8), v=r(4, 3, 49, 8), bias=r(1, 3, 49, 49), mask=mask)
    if case == 'global':  # SDPA's path, no bias
        return dict(q=r(1, 2, 300, 16), k=r(1, 2, 300, 16), v=r(1, 2, 300, 16))
    # XCiT-like: tiny matrix, per-head tensor scale
    return dict(q=r(2, 4, 12, 40), k=r(2, 4, 12, 40), v=r(2, 4, 12, 40),
                scale=torch.rand(4, 1, 1, generator=g, dtype=torch.float64).add(0.5).requires_grad_())


@pytest.mark.parametrize('case', ['window', 'global', 'channels'])
def test_softmax_recompute_keeps_only_its_inputs_and_changes_no_output_or_gradient(case):
    inp = _inputs(case)
    leaves = [t for t in inp.values() if t.requires_grad]
    plain = build_attention('softmax')
    lean = build_attention(dict(type='softmax', recompute=True))
    kept, out = _saved_storages(lambda: lean(**inp))
    mine = {t.untyped_storage().data_ptr() for t in inp.values()}
    assert set(kept) <= mine, 'recompute=True kept a tensor that is not one of its inputs'
    plain_kept, ref = _saved_storages(lambda: plain(**inp))
    if case != 'global':  # the explicit path keeps the weights (N x N per head) besides copies of its inputs
        assert sum(b for _, b in plain_kept.values()) > sum(b for _, b in kept.values())
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    g = torch.randn_like(ref)
    for a, b in zip(torch.autograd.grad((out * g).sum(), leaves), torch.autograd.grad((ref * g).sum(), leaves)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_softmax_recompute_repeats_the_forwards_autocast_and_refuses_bad_values():
    inp = {k: v.detach().float().requires_grad_() for k, v in _inputs('global').items()}
    outs = []
    for recompute in (False, True):
        with torch.autocast('cpu', dtype=torch.bfloat16):
            out = build_attention(dict(type='softmax', recompute=recompute))(**inp)
        outs.append((out, torch.autograd.grad(out.float().square().sum(), list(inp.values()))))
    (o1, g1), (o2, g2) = outs
    torch.testing.assert_close(o1, o2, rtol=0, atol=0)
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"recompute must be True or False, got 'yes'"):
        build_attention(dict(type='softmax', recompute='yes'))


# ------------------------------------------------------------------------------------------------ backbones
@pytest.mark.parametrize('name, limit', [('swin_t', 0.85), ('pvt_v2_b2', 0.75), ('xcit_s12', 0.9)])
def test_softmax_backbones_keep_less_for_backward_than_their_references(name, limit):
    """Bytes of activations kept for backward after a training forward, ours / reference (mmdet's Swin and PVTv2,
    timm's XCiT with the same adapter), at 224x320: ours keeps one hidden tensor per MLP instead of two."""
    ours, ref = reference_pair(name)
    x = torch.randn(1, 3, 224, 320)
    ratio = kept_for_backward(ours, x) / kept_for_backward(ref, x)
    assert ratio <= limit, f'{name}: ours keeps {ratio:.3f}x the reference'


@pytest.mark.parametrize('frozen', ['fc2', 'fc1_and_input'])
def test_gelu_linear_with_frozen_weights_gives_the_remaining_gradients(frozen):
    torch.manual_seed(0)
    mlp = Mlp(8, 32).double()
    x = torch.randn(3, 8, dtype=torch.float64, requires_grad=frozen == 'fc2')
    for p in (mlp.fc2 if frozen == 'fc2' else mlp.fc1).parameters():
        p.requires_grad_(False)
    leaves = [t for t in [x] + list(mlp.parameters()) if t.requires_grad]
    out, ref = mlp(x), mlp.fc2(mlp.act(mlp.fc1(x)))
    g = torch.randn_like(ref)
    for a, b in zip(torch.autograd.grad((out * g).sum(), leaves), torch.autograd.grad((ref * g).sum(), leaves)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_gelu_linear_supports_double_backward_like_the_plain_layers():
    """backward(create_graph=True) (gradient penalties, Hessian-vector products) gives the plain layers' second
    derivatives."""
    torch.manual_seed(0)
    act, fc = nn.GELU(), nn.Linear(6, 4).double()
    h = torch.randn(5, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(lambda t, w, b: _GeluLinear.apply(t, w, b, 'none'),
                                        (h, fc.weight.detach().requires_grad_(), fc.bias.detach().requires_grad_()))
    leaves = [h] + list(fc.parameters())
    penalties = []
    for out in (gelu_linear(h, act, fc), fc(act(h))):
        grads = torch.autograd.grad(out.square().sum(), leaves, create_graph=True)
        penalties.append(torch.autograd.grad(sum(g.square().sum() for g in grads), leaves))
    for a, b in zip(*penalties):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
