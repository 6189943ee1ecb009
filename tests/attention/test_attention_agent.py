"""Agent attention: a reference written from the official computation (LeapLabTHU/Agent-Attention, the classification
models' AgentAttention and the detection / segmentation backbones' resize rule), the biases and the dwc each
reaching the output, the declarations, and the one-line errors."""
import math

import pytest
import torch
import torch.nn.functional as F

from softfree_mm.attention import build_attention

F64 = torch.float64
BIASES = ('an_bias', 'na_bias', 'ah_bias', 'aw_bias', 'ha_bias', 'wa_bias')


def rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=F64)


def kernel(heads=2, head_dim=4, seed=0, **cfg):
    torch.manual_seed(seed)
    kern = build_attention(dict(type='agent', **cfg), num_heads=heads, head_dim=head_dim).double()
    with torch.no_grad():  # biases of the size trained weights have (the init's std .02 would hide a wrong layout)
        for p in kern.parameters():
            p.copy_(rand(*p.shape, seed=seed + p.numel()) * 0.7)
    return kern


def adaptive_pool(x, out):
    """Adaptive average pooling written out: bin i of n covers floor(i n_in / n) .. ceil((i + 1) n_in / n)."""
    def bins(n_in, n):
        return [(i * n_in // n, -(-(i + 1) * n_in // n)) for i in range(n)]
    rows = [torch.stack([x[..., r0:r1, c0:c1].mean((-2, -1)) for c0, c1 in bins(x.shape[-1], out[1])], -1)
            for r0, r1 in bins(x.shape[-2], out[0])]
    return torch.stack(rows, -2)


def reference(kern, q, k, v, hw):
    """The official computation, in its own order: the queries of all heads pooled as one (B, C, H, W) map; each bias
    term resized to the grid, then (downstream) its p x p agent axis resized to the agent grid, the terms summed after;
    scale on the agents and the queries; two softmaxes; the dwc on v as (B, C, H, W)."""
    b, h, n, d = q.shape
    hh, ww = hw
    p = math.isqrt(kern.agent_num)
    shape = kern.downstream_agent_shape
    na_ = shape[0] * shape[1]
    scale = d ** -0.5
    qmap = q.transpose(1, 2).reshape(b, n, h * d).transpose(1, 2).reshape(b, h * d, hh, ww)
    agents = adaptive_pool(qmap, shape).reshape(b, h * d, na_).transpose(1, 2)  # (B, n, C)
    agents = agents.reshape(b, na_, h, d).transpose(1, 2)

    def to_grid(t):  # (h, A, H0, W0) -> (h, A, H, W), bilinear as the official F.interpolate default
        return F.interpolate(t, size=(hh, ww), mode='bilinear')

    def agent_axis(t):  # (h, A, N) -> (h, n, N)
        t = t.reshape(h, p, p, n).permute(0, 3, 1, 2)
        t = F.interpolate(t, size=shape, mode='bilinear')
        return t.reshape(h, n, na_).transpose(1, 2)

    pos = sum(agent_axis(to_grid(t).reshape(h, kern.agent_num, n)) for t in
              (kern.an_bias, (kern.ah_bias + kern.aw_bias)[0]))
    agb = sum(agent_axis(to_grid(t).reshape(h, kern.agent_num, n)) for t in
              (kern.na_bias, (kern.ha_bias + kern.wa_bias)[0].permute(0, 3, 1, 2))).transpose(1, 2)
    agent_attn = torch.softmax((agents * scale) @ k.transpose(-2, -1) + pos, -1)
    q_attn = torch.softmax((q * scale) @ agents.transpose(-2, -1) + agb, -1)
    out = q_attn @ (agent_attn @ v)
    vmap = v.transpose(1, 2).reshape(b, n, h * d).transpose(1, 2).reshape(b, h * d, hh, ww)
    conv = kern.dwc(vmap).reshape(b, h * d, n).transpose(1, 2).reshape(b, n, h, d).transpose(1, 2)
    return out + conv


def qkv(hw, heads=2, head_dim=4, seed=1):
    n = hw[0] * hw[1]
    return (rand(2, heads, n, head_dim, seed=seed), rand(2, heads, n, head_dim, seed=seed + 1),
            rand(2, heads, n, head_dim, seed=seed + 2))


@pytest.mark.parametrize('cfg,hw', [
    (dict(agent_num=9, window_size=6), (6, 6)),  # classification: the grid the biases were trained at
    (dict(agent_num=4, window_size=(5, 7)), (5, 7)),
    (dict(agent_num=9, window_size=6, downstream_agent_shape=(4, 5)), (9, 7)),  # detection: another grid, more agents
    (dict(agent_num=16, window_size=8, downstream_agent_shape=(2, 3)), (5, 11)),
])
def test_output_equals_the_official_computation(cfg, hw):
    kern = kernel(**cfg)
    q, k, v = qkv(hw)
    torch.testing.assert_close(kern(q, k, v, hw=hw), reference(kern, q, k, v, hw), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize('part', BIASES + ('dwc',))
def test_every_bias_and_the_dwc_reach_the_output(part):
    """Zeroing any one of the six biases or the dwc changes the output (a term dropped in the kernel fails here and
    in the reference test)."""
    kern = kernel(agent_num=9, window_size=6, downstream_agent_shape=(4, 4))
    q, k, v = qkv((7, 6))
    before = kern(q, k, v, hw=(7, 6))
    with torch.no_grad():
        for t in (kern.dwc.parameters() if part == 'dwc' else [getattr(kern, part)]):
            t.zero_()
    assert (kern(q, k, v, hw=(7, 6)) - before).abs().max() > 1e-3


def test_no_bias_and_no_dwc_options():
    kern = kernel(agent_num=9, window_size=6, agent_bias=False, kernel_size=0)
    assert not any(hasattr(kern, n) for n in BIASES + ('dwc',)) and kern.matrix_is_complete
    q, k, v = qkv((6, 6))
    s = 4 ** -0.5
    a = adaptive_pool(q.reshape(2, 2, 6, 6, 4).permute(0, 1, 4, 2, 3), (3, 3)).flatten(3).transpose(2, 3)
    ref = torch.softmax(s * q @ a.transpose(-2, -1), -1) @ (torch.softmax(s * a @ k.transpose(-2, -1), -1) @ v)
    torch.testing.assert_close(kern(q, k, v, hw=(6, 6)), ref, rtol=1e-12, atol=1e-12)
    assert torch.equal(kern.residual_output(q, k, v, hw=(6, 6)), torch.zeros_like(v))


def test_rows_of_the_explicit_matrix_sum_to_one_and_the_forward_never_builds_it():
    kern = kernel(agent_num=9, window_size=6)
    q, k, v = qkv((6, 6))
    a = kern.attention_matrix(q, k, hw=(6, 6))
    torch.testing.assert_close(a.sum(-1), torch.ones(2, 2, 36, dtype=F64))
    assert (a >= 0).all()
    torch.testing.assert_close(kern(q, k, v, hw=(6, 6)), a @ v + kern.residual_output(q, k, v, hw=(6, 6)))


def test_declared_flops_match_torchs_counter_with_more_agents_on_another_grid():
    from torch.utils.flop_counter import FlopCounterMode
    kern = build_attention(dict(type='agent', agent_num=9, window_size=8, downstream_agent_shape=(4, 5)),
                           num_heads=1, head_dim=6)
    q, k, v = (torch.randn(1, 1, 70, 6) for _ in range(3))
    with FlopCounterMode(display=False) as fc:
        kern(q, k, v, hw=(7, 10))
    assert kern.flops(70, 70, 6, 6, hw=(7, 10)) == fc.get_total_flops() // 2 == 20 * 70 * 12 * 2 + 9 * 70 * 6


@pytest.mark.parametrize('cfg,match', [
    (dict(agent_num=10), r'agent_num must be a square number of agents .* got 10'),
    (dict(window_size=0), r'window_size must be a positive int or a pair .* got 0'),
    (dict(downstream_agent_shape=(3, 0)), r'downstream_agent_shape must be .* got \(3, 0\)'),
    (dict(kernel_size=2), r'kernel_size must be an odd positive int .* or 0 \(none\), got 2'),
    (dict(agent_bias='yes'), r"agent_bias must be True or False, got 'yes'"),
])
def test_bad_options_are_one_line_errors_naming_the_value(cfg, match):
    with pytest.raises(ValueError, match=match) as e:
        build_attention(dict(type='agent', **cfg), num_heads=2, head_dim=4)
    assert '\n' not in str(e.value)


def test_bad_calls_are_one_line_errors():
    with pytest.raises(ValueError, match=r'need num_heads and head_dim \(got num_heads=None'):
        build_attention('agent')
    kern = kernel()
    q, k, v = qkv((4, 4))
    with pytest.raises(ValueError, match=r"keys on the queries' \(H, W\) grid, got Nq=16 and Nk=4; .*sr_ratios=1"):
        kern(q, k[:, :, :4], v[:, :, :4], hw=(4, 4))
    with pytest.raises(ValueError, match=r"'agent' cannot honour an attention mask"):
        kern(q, k, v, hw=(4, 4), mask=torch.ones(16, 16, dtype=torch.bool))
