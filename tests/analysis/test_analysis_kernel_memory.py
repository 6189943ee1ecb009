"""Every kernel's memory declaration (``AttentionKernel.memory``: elements kept for backward, largest temporary) held
against what its calls create, measured by hooks on the kernels inside each backbone family's tiny preset, for every
kernel x family pair the support table lists, at two image sizes, in the token geometry (N > 4 d) and in XCiT's
channel geometry (its kernel's "head_dim" is the image's N tokens, N > 4 d_h). The same runs show that the tolerance
catches a declaration 4 times off, and that what a call creates grows with the image no faster than its kernel's
class allows."""
import functools
import inspect

import pytest
import torch

from softfree_mm.analysis.kernel_memory import KernelMemory, problems
from softfree_mm.analysis.support import setup
from softfree_mm.attention import list_attentions
from softfree_mm.models.family import FAMILIES

# XCiT's tiny preset: d_h = 8, its kernels see N = 144 and 320 tokens as their "head_dim". The token families at two
# sizes where every window and stripe stage that can pad does, so key masks and padded layouts are measured at both:
# Swin's 7 x 7 windows on 22x22, 11x11, 6x6, 3x3 and on 42x50, 21x25, 11x13, 6x7 grids; CSWin's stripes of width 2
# and 4 on 11x11, 6x6 and 21x25, 11x13 grids (width 1 never pads; its last stage is global). First stages: N = 484
# and 2100 tokens at head_dim 8-16.
SIZES = {'SoftFreeXCiT': ((192, 192), (320, 256))}
TOKEN_SIZES = ((88, 88), (168, 200))
# kernels beyond the registry's defaults: poly of degree 1 is a linear kernel (its factorised order keeps no Nq x Nk)
VARIANTS = {'poly(degree=1)': ('poly', dict(type='poly', degree=1))}
KERNELS = list_attentions() + list(VARIANTS)
PAIRS = [(f, k) for f in FAMILIES for k in KERNELS]
TOKEN_PAIRS = [(f, k) for f, k in PAIRS if FAMILIES[f].family.mixes == 'tokens']


@functools.lru_cache(maxsize=None)
def _calls(family, kernel):
    """(support cell, ((image size, calls, {kernel name: kernel module}), ...)) of the family's tiny preset with
    ``kernel``, one forward at each size with autograd on."""
    cls = FAMILIES[family]
    name, cfg = VARIANTS.get(kernel, (kernel, None))
    cell, args = setup(cls, name)
    if cell == 'no':
        return cell, ()
    if cfg is not None:
        args = dict(args, attn_cfg=cfg)
    out = []
    for size in SIZES.get(family, TOKEN_SIZES):
        torch.manual_seed(0)
        model = cls(**args).eval()
        with KernelMemory(model) as probe:
            model(torch.randn(1, 3, *size))  # autograd on: what backward would keep is recorded
        out.append((size, tuple(probe.calls), {n: k for n, k in probe.kernels}))
    return cell, tuple(out)


def _runs(family, kernel):
    cell, runs = _calls(family, kernel)
    if cell == 'no':
        pytest.skip(f'{kernel} does not fit {family} (the support table says no)')
    return cell, runs


@pytest.mark.parametrize('family,kernel', PAIRS)
def test_kernel_calls_create_what_the_kernel_declares(family, kernel):
    cell, runs = _runs(family, kernel)
    for size, calls, _ in runs:
        assert calls, f'no kernel call in {family} at {size}'
        found = [p for c in calls for p in problems(c)]
        assert not found, f'{family} ({cell}) at {size}: ' + '; '.join(found)


@pytest.mark.parametrize('family,kernel', PAIRS)
def test_a_declaration_four_times_off_is_found(family, kernel):
    """The tolerance catches a 4x error: every measured call, its declared saved or largest scaled by 4 or by 1/4,
    breaks its declaration."""
    _, runs = _runs(family, kernel)
    for size, calls, _ in runs:
        for c in calls:
            for key in ('declared_saved', 'declared_largest'):
                for factor in (4, 0.25):
                    wrong = dict(c, **{key: c[key] * factor})
                    assert problems(wrong), (family, kernel, size, c['name'], key, factor, c[key[9:]], c[key])


def _declared(kernel, call, **shapes):
    """``kernel.memory`` for the call, ``shapes`` (nq, nk, hw) replaced; the call's ``key_mask`` and ``scale`` to a
    declaration that takes them (as ``kernel_memory`` does)."""
    c = dict(call, **shapes)
    takes = inspect.signature(kernel.memory).parameters
    extra = {k: c[k] for k in ('key_mask', 'scale') if k in takes and k in c}
    return kernel.memory(c['nq'], c['nk'], c['d'], c['dv'], masked=c['masked'], hw=c['hw'], **extra)


def _constant(kernel, call) -> int:
    """Elements a (batch, head) pair of what the call keeps for backward that do not grow with its tokens: its
    kernel's declaration at zero tokens (the key-value sums, the residual's weights, the agent tokens ...). A kernel
    with two orders declares the factorised one at zero tokens; where the call takes the explicit one, or the
    declaration cannot take zero tokens (SOFT's landmark grid), nothing is subtracted: a constant too small only
    loosens the bound below, one too large (a term that grows, subtracted at the small size) would tighten it."""
    d, dv, masked = call['d'], call['dv'], call['masked']
    if kernel.order(call['nq'], call['nk'], d, dv, masked) != kernel.order(0, 0, d, dv, masked):
        return 0
    try:
        return _declared(kernel, call, nq=0, nk=0, hw=None)[0]
    except (ValueError, ZeroDivisionError):
        return 0


def _linear_regime(kernel, call) -> bool:
    """Whether a linear kernel's memory is linear in the tokens at the call's shapes: a kernel with two orders where
    its rule takes the factorised one for these shapes without a mask (below that, the explicit order is cheaper and
    its Nq x Nk memory smaller than the factorised order's; a mask that forces the explicit order on shapes the rule
    gives the factorised one is what the growth test is for); a kernel with one path where its declaration, the
    tokens doubled, at most doubles (Nystrom with fewer tokens than landmarks is softmax attention)."""
    d, dv = call['d'], call['dv']
    order = kernel.order(call['nq'], call['nk'], d, dv, False)
    if order:
        return order == 'factorised'
    return _declared(kernel, call, nq=2 * call['nq'], nk=2 * call['nk'])[0] <= 2 * _declared(kernel, call)[0]


GROWTH = {'linear': lambda c: c['pairs'] * (c['nq'] + c['nk']),  # the call's tokens, queries and keys
          'quadratic': lambda c: c['pairs'] * c['nq'] * c['nk']}  # its pairs of tokens
GROWTH_TOLERANCE = 1.25


@pytest.mark.parametrize('family,kernel', TOKEN_PAIRS)
def test_token_attention_memory_grows_no_faster_than_the_kernels_class(family, kernel):
    """Per call (one layer at the two image sizes), what it keeps for backward (less its constant part,
    :func:`_constant`) and its largest tensor, over all its (batch, head) pairs, grow at most 1.25 times as fast as
    its kernel's class allows: ``complexity == 'linear'`` like the call's tokens (pairs x (Nq + Nk)), otherwise like
    its pairs of tokens (pairs x Nq x Nk; SOFT's 'cubic' is its time: its memory, K(Q, L) with m ~ N landmarks, is
    quadratic). A linear kernel's calls count where both sizes are in its linear regime (:func:`_linear_regime`).
    Windows and stripes that pad, masks of every kind: a kernel outside its class in any layout fails."""
    _, runs = _runs(family, kernel)
    (small_size, small, _), (large_size, large, kernels) = runs
    assert [c['name'] for c in small] == [c['name'] for c in large]
    for a, b in zip(small, large):
        kern = kernels[a['name']]
        linear = kern.complexity == 'linear'
        if linear and not (_linear_regime(kern, a) and _linear_regime(kern, b)):
            continue
        tokens = GROWTH['linear' if linear else 'quadratic']
        growth = tokens(b) / tokens(a)
        for key in ('saved', 'largest'):
            # a sum less its constant terms; the largest tensor is a max, and a max grows no faster than its largest
            # growing term, constants or not
            grown = [c['pairs'] * (c[key] - (_constant(kern, c) if key == 'saved' else 0)) for c in (a, b)]
            assert grown[1] <= GROWTH_TOLERANCE * growth * max(grown[0], 0), (
                f"{family} {kernel} ({kern.complexity}) {a['name']}: {key} over its pairs"
                f"{', less its constant,' if key == 'saved' else ''} "
                f"{grown[0]:.0f} at {small_size} -> {grown[1]:.0f} at {large_size}, x{grown[1] / max(grown[0], 1):.2f}"
                f"; its {'tokens' if kern.complexity == 'linear' else 'token pairs'} x{growth:.2f} "
                f"(Nq x Nk {a['nq']}x{a['nk']} -> {b['nq']}x{b['nk']}, pairs {a['pairs']} -> {b['pairs']})")


@pytest.mark.parametrize('kernel', [k for k in KERNELS])
def test_channel_attention_memory_grows_linearly_in_the_image_tokens(kernel):
    """In XCA the kernel's "head_dim" is N: what any kernel keeps may grow like N, never like N^2 (an N x N k^T v)."""
    _, runs = _runs('SoftFreeXCiT', kernel)
    (_, small, _), (_, large, _) = runs
    growth = large[0]['d'] / small[0]['d']  # the token count: 320 / 144
    assert growth > 2
    for a, b in zip(small, large):
        assert b['saved'] <= 1.25 * growth * a['saved'] + 64, (kernel, a['name'], a['saved'], b['saved'])
        assert b['largest'] <= 1.25 * growth * a['largest'] + 64, (kernel, a['name'], a['largest'], b['largest'])


def test_the_geometries_are_the_ones_named():
    _, runs = _calls('SoftFreeXCiT', 'linear')
    for _, calls, _ in runs:
        assert all(c['d'] > 4 * c['nq'] for c in calls)  # channel geometry: N tokens > 4 d_h
    _, runs = _calls('SoftFreePVTv2', 'linear')
    for _, calls, _ in runs:
        assert calls[0]['nq'] > 4 * calls[0]['d']  # token geometry, the first stage
    # at both sizes every window and stripe stage that can pad does: its unshifted windows and its stripes of width
    # > 1 take a key-only mask (the pad keys), at every stage
    for size, calls, _ in _calls('SoftFreeSwin', 'linear')[1]:
        unshifted = [c for c in calls if c['name'].endswith('blocks.0.attn.kernel')]
        assert len(unshifted) == 4 and all(c['key_mask'] for c in unshifted), size
    for size, calls, _ in _calls('SoftFreeCSWin', 'linear')[1]:
        wide = [c for c in calls if c['name'].startswith(('stages.1.', 'stages.2.'))]
        assert len(wide) == 4 and all(c['key_mask'] for c in wide), size
