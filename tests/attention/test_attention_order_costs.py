"""The association rule's costs against what each order runs: for every registered kernel with two orders, each order
forced, torch's flop counter on the kernel's forward counts exactly the declared matrix products of that order
(``order_products``), and the declared costs the rule compares (``order_costs``) are those products plus the weighted
work no counter sees (``order_extra``: row sums, elementwise normalisers, poly's features), never another formula.
Tests of which order wins cannot see a cost counted with the wrong size (performer's m random features taken as d)."""
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from softfree_mm.attention import AttentionKernel, build_attention, dispatch, kernel_arguments, list_attentions

# (nq, nk, d, dv, hw): a square grid (the kernels' terms on the grid on), an oblong call with nq != nk and d != dv
SHAPES = [(64, 64, 16, 16, (8, 8)), (50, 70, 8, 12, None)]
EXTRA = (dict(type='poly', degree=1), dict(type='poly', degree=2), dict(type='inline', local_residual='head'),
         dict(type='inline', local_residual=False), dict(type='flatten', local_conv=False))


def _two_orders(name):
    return build_attention(name, num_heads=2, head_dim=8).order_costs(16, 16, 8, 8) is not None


TWO_ORDERS = [n for n in list_attentions() if _two_orders(n)]
VARIANTS = [dict(type=n) for n in TWO_ORDERS] + [c for c in EXTRA if c['type'] in TWO_ORDERS]


def _label(cfg):
    return ','.join(f'{k}={v}' for k, v in cfg.items())


def _fits(cfg, kern, nq, nk, d, dv, hw):
    """Whether the variant takes the shape: terms on the token grid need nq == nk on one grid, InLine's official
    residual a kernel per channel of v (dv == d)."""
    on_grid = getattr(kern, 'local_residual', False) or getattr(kern, 'local_conv', False)
    if on_grid and hw is None:
        return False
    return not (getattr(kern, 'local_residual', False) == 'channel' and dv != d)


def _counted(kern, q, k, v, hw):
    with FlopCounterMode(display=False) as fc:
        kern(q, k, v, hw=hw)
    return fc.get_total_flops() // 2  # torch counts 2 flops per multiply-add


@pytest.mark.parametrize('cfg', VARIANTS, ids=_label)
def test_each_forced_order_runs_exactly_its_declared_products(cfg):
    b, h = 2, 2
    ran = 0
    for nq, nk, d, dv, hw in SHAPES:
        g = torch.Generator().manual_seed(nq)
        q, k = torch.randn(b, h, nq, d, generator=g), torch.randn(b, h, nk, d, generator=g)
        v = torch.randn(b, h, nk, dv, generator=g)
        products = build_attention(cfg, num_heads=h, head_dim=d).order_products(nq, nk, d, dv)
        for i, impl in enumerate(dispatch.ORDERS):
            kern = build_attention(dict(cfg, impl=impl), num_heads=h, head_dim=d)
            if not _fits(cfg, kern, nq, nk, d, dv, hw):
                continue
            assert kern.order(nq, nk, d, dv) == impl
            got = _counted(kern, q, k, v, hw)
            assert got == b * h * products[i], f'{_label(cfg)} {impl} at {(nq, nk, d, dv)}: ran {got // (b * h)} ' \
                f'multiply-adds a (batch, head), declares {products[i]}'
            assert kern.flops(nq, nk, d, dv, hw=hw) == products[i]  # flops() reads the same declaration
            ran += 1
    assert ran >= 2


@pytest.mark.parametrize('cfg', VARIANTS, ids=_label)
def test_order_costs_are_the_counted_products_plus_the_weighted_work_no_counter_sees(cfg):
    """One source of truth: a kernel declares its products and its extra work, and the rule's costs are their sum
    (no kernel overrides ``order_costs`` with a formula of its own)."""
    kern = build_attention(cfg, num_heads=2, head_dim=16)
    assert type(kern).order_costs is AttentionKernel.order_costs, f'{kern.name} overrides order_costs'
    for nq, nk, d, dv, _ in SHAPES:
        for device in ('cpu', 'cuda'):
            costs, products = kern.order_costs(nq, nk, d, dv, device), kern.order_products(nq, nk, d, dv)
            extra = kern.order_extra(nq, nk, d, dv, device)
            assert all(isinstance(x, int) and x >= 0 for x in extra)
            assert costs == (products[0] + extra[0], products[1] + extra[1])


def test_every_kernel_with_a_factorised_form_is_covered():
    assert {'linear', 'efficient', 'taylor', 'cosformer', 'performer', 'flatten', 'inline', 'poly'} <= set(TWO_ORDERS)
    assert 'num_features' in kernel_arguments('performer')  # its m random features differ from d at these shapes
    assert build_attention('performer', num_heads=2, head_dim=16).num_features != 16
