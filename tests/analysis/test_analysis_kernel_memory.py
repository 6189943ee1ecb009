"""Every kernel's memory declaration (``AttentionKernel.memory``: elements kept for backward, largest temporary) held
against what its calls create, measured by hooks on the kernels inside each backbone family's tiny preset, for every
kernel x family pair the support table lists, at two image sizes, in the token geometry (N > 4 d) and in XCiT's
channel geometry (its kernel's "head_dim" is the image's N tokens, N > 4 d_h)."""
import functools

import pytest
import torch

from softfree_mm.analysis.kernel_memory import KernelMemory, problems
from softfree_mm.analysis.support import setup
from softfree_mm.attention import list_attentions
from softfree_mm.models.family import FAMILIES

# XCiT's tiny preset: d_h = 8, its kernels see N = 144 and 320 tokens as their "head_dim"; the token families' first
# stage N = 576 and 1920 tokens at head_dim 8-16 (windows and stripes: their own sizes)
SIZES = {'SoftFreeXCiT': ((192, 192), (320, 256))}
TOKEN_SIZES = ((96, 96), (160, 192))
PAIRS = [(f, k) for f in FAMILIES for k in list_attentions()]


@functools.lru_cache(maxsize=None)
def _calls(family, kernel):
    cls = FAMILIES[family]
    cell, args = setup(cls, kernel)
    if cell == 'no':
        return cell, ()
    out = []
    for size in SIZES.get(family, TOKEN_SIZES):
        torch.manual_seed(0)
        model = cls(**args).eval()
        with KernelMemory(model) as probe:
            model(torch.randn(1, 3, *size))  # autograd on: what backward would keep is recorded
        out.append((size, tuple(probe.calls)))
    return cell, tuple(out)


@pytest.mark.parametrize('family,kernel', PAIRS)
def test_kernel_calls_create_what_the_kernel_declares(family, kernel):
    cell, runs = _calls(family, kernel)
    if cell == 'no':
        pytest.skip(f'{kernel} does not fit {family} (the support table says no)')
    for size, calls in runs:
        assert calls, f'no kernel call in {family} at {size}'
        found = [p for c in calls for p in problems(c)]
        assert not found, f'{family} ({cell}) at {size}: ' + '; '.join(found)


@pytest.mark.parametrize('kernel', [k for k in list_attentions()])
def test_channel_attention_memory_grows_linearly_in_the_image_tokens(kernel):
    """In XCA the kernel's "head_dim" is N: what any kernel keeps may grow like N, never like N^2 (an N x N k^T v)."""
    cell, runs = _calls('SoftFreeXCiT', kernel)
    if cell == 'no':
        pytest.skip(f'{kernel} does not fit XCiT')
    (_, small), (_, large) = runs
    growth = large[0]['d'] / small[0]['d']  # the token count: 320 / 144
    assert growth > 2
    for a, b in zip(small, large):
        assert b['saved'] <= 1.25 * growth * a['saved'] + 64, (kernel, a['name'], a['saved'], b['saved'])
        assert b['largest'] <= 1.25 * growth * a['largest'] + 64, (kernel, a['name'], a['largest'], b['largest'])


def test_the_geometries_are_the_ones_named():
    _, runs = _calls('SoftFreeXCiT', 'linear')
    for _, calls in runs:
        assert all(c['d'] > 4 * c['nq'] for c in calls)  # channel geometry: N tokens > 4 d_h
    _, runs = _calls('SoftFreePVTv2', 'linear')
    for _, calls in runs:
        assert calls[0]['nq'] > 4 * calls[0]['d']  # token geometry, the first stage
