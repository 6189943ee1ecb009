"""A kernel of one's own, exactly as docs/kernels.md "Add your own kernel" writes it, loaded from a folder outside the
package: the package reaches it through its declarations alone.

Guards: the registry lists and builds it; its A is relu(S)^2 / N over the valid keys (the formula written here) and
its output A @ v; the fit rules follow its declared abilities (Swin's masked windows take it; once it declares no
mask support they refuse it, naming the mask, and the support table names global windows); the norms hook's
Jacobian comes from its declared score map (autograd) and equals the closed form 2 relu(S) / N written here, with a
note beyond max_autograd_keys; a query's map puts its row of A on its window; swap_attention puts it into a timm ViT
(the block's output is the formula applied by hand); FLOP counts add its declared flops; ``tools/train.py
--dry-run`` takes a config that imports it by ``custom_imports``.
"""
import os
import os.path as osp
import subprocess
import sys

import pytest
import torch

from softfree_mm import models
from softfree_mm.engine.hooks import AttentionCapture

from tests.helpers import ROOT
from tests.helpers.extensions import doc_example, forget_kernel, load_example

SIZE = (61, 90)  # odd: padded and shifted windows, partial ones


@pytest.fixture(scope='module')
def example(tmp_path_factory):
    folder = tmp_path_factory.mktemp('own_kernel')
    module = load_example(doc_example('kernels.md', 'Add your own kernel'), 'my_kernel', folder)
    yield module, folder
    forget_kernel('relu2')
    sys.modules.pop('my_kernel', None)


def _swin(**kw):
    torch.manual_seed(0)
    return models.SoftFreeSwin(**models.SoftFreeSwin.family.tiny, attn_cfg='relu2', **kw).eval()


def _capture(model, batch=2):
    torch.manual_seed(1)
    with AttentionCapture(model) as cap, torch.no_grad():
        model(torch.randn(batch, 3, *SIZE))
    return cap


def _scores(call):
    """S = scale q k^T + bias of a recorded call, in float64."""
    scale = call.q.shape[-1] ** -0.5 if call.scale is None else call.scale
    s = (call.q.double() @ call.k.double().transpose(-2, -1)) * scale
    return s if call.bias is None else s + call.bias.double()


def test_the_registry_lists_builds_and_names_it(example):
    from softfree_mm.attention import build_attention, list_attentions, normalize_cfg
    assert 'relu2' in list_attentions()
    kern = build_attention('relu2', num_heads=2, head_dim=8)
    assert type(kern) is example[0].Relu2Attention and kern.name == 'relu2'
    with pytest.raises(KeyError, match='relu2'):  # a near miss lists the valid types, this one among them
        normalize_cfg('relu3')


def test_its_matrix_is_relu_squared_over_the_valid_keys_and_its_output_a_times_v(example):
    from softfree_mm.attention import build_attention
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 5, 4, generator=g, dtype=torch.float64) for _ in range(3))
    bias = torch.randn(1, 2, 5, 5, generator=g, dtype=torch.float64)
    mask = torch.rand(2, 1, 5, 5, generator=g) > 0.3
    mask[..., 0] = True
    kern = build_attention('relu2')
    want = torch.relu(q @ k.transpose(-2, -1) / 2 + bias) ** 2 / mask.sum(-1, keepdim=True) * mask
    torch.testing.assert_close(kern.attention_matrix(q, k, bias=bias, mask=mask), want)
    torch.testing.assert_close(kern(q, k, v, bias=bias, mask=mask), want @ v)


def test_the_fit_rules_and_the_support_table_read_its_declared_abilities(example, monkeypatch):
    from softfree_mm.analysis.support import support_matrix
    _swin()  # shifted, padded windows with a bias table: it declares both
    assert support_matrix(kernels=['relu2'], families=['SoftFreeSwin', 'SoftFreePVTv2']) == {
        'SoftFreeSwin': {'relu2': 'yes'}, 'SoftFreePVTv2': {'relu2': 'yes'}}
    monkeypatch.setattr(example[0].Relu2Attention, 'supports_mask', False)
    with pytest.raises(ValueError, match=r"attention kernel 'relu2' cannot be used in stage 0 .*cannot honour a mask"):
        _swin()
    assert _swin(global_window=True).global_window[0] == (True, True)
    assert support_matrix(kernels=['relu2'], families=['SoftFreeSwin']) == {'SoftFreeSwin': {'relu2': 'global windows'}}


def test_its_calls_create_what_its_memory_declaration_says(example, monkeypatch):
    from softfree_mm.analysis.kernel_memory import KernelMemory, problems
    model = _swin()
    with KernelMemory(model) as probe:
        model(torch.randn(1, 3, 67, 93))
    assert probe.calls and all(c['type'] == 'relu2' for c in probe.calls)
    assert not [p for c in probe.calls for p in problems(c)]
    # a declaration that forgets the scores it keeps is found
    monkeypatch.setattr(example[0].Relu2Attention, 'memory', lambda self, nq, nk, *a, **kw: (nq, nk))
    with KernelMemory(model) as probe:
        model(torch.randn(1, 3, 67, 93))
    assert any('keeps for backward' in p for c in probe.calls for p in problems(c))


def test_the_norms_hook_takes_its_jacobian_from_the_declared_score_map(example):
    from softfree_mm.engine.hooks import AttentionStatsHook
    from softfree_mm.engine.hooks.matrix_norms import call_stats
    cap = _capture(_swin())
    hook = AttentionStatsHook()
    for name, call in cap.calls.items():
        st = call_stats(call)
        assert st['jac'] is not None, st['jac_note']
        # the closed form the example does not state: d a_ij / d s_ij = 2 relu(s_ij) / N_i on the valid keys
        keep = torch.ones(1, 1, call.q.shape[2], call.k.shape[2]) if call.mask is None else call.mask
        d = 2 * torch.relu(_scores(call)) / keep.sum(-1, keepdim=True) * keep
        valid = call.layout.query_valid().repeat(call.q.shape[0] // call.layout.groups, 1)
        want = ((d * d).sum(-1) * valid[:, None]).sum(-1).sqrt().mean(0)
        torch.testing.assert_close(st['jac'].double(), want, rtol=1e-4, atol=1e-7)
        assert {f'attn/{name}/jac', f'attn/{name}/jac_h0'} <= set(hook.scalars({name: st}))
    st = call_stats(next(iter(cap.calls.values())), max_autograd_keys=8)  # windows of 49 keys
    assert st['jac'] is None and 'max_autograd_keys=8' in st['jac_note']


def test_a_querys_map_puts_its_row_of_a_on_its_window(example):
    from softfree_mm.analysis.attention_maps import query_map
    call = _capture(_swin(), batch=1).calls['stages.0.blocks.1.attn']  # shifted windows
    m = query_map(call, (40.0, 24.0), head=0)
    h, w = call.layout.grid
    g, i = call.layout.find_query(m['token'][0] * w + m['token'][1])
    row = call.matrix(slice(g, g + 1))[0, 0, i]
    seen = ~m['values'].isnan()
    assert 0 < int(seen.sum()) <= 49  # its window's real tokens only
    torch.testing.assert_close(m['values'][seen].sum(), row.sum())


def test_swap_attention_puts_it_into_a_timm_vit(example):
    from timm.models.vision_transformer import VisionTransformer
    from softfree_mm import swap_attention
    torch.manual_seed(0)
    vit = VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2, num_classes=0).eval()
    swap_attention(vit, 'relu2')
    attn = vit.blocks[0].attn
    assert type(attn.kernel) is example[0].Relu2Attention
    seen = {}
    attn.register_forward_hook(lambda mod, args, out: seen.update(x=args[0], out=out))
    with torch.no_grad():
        vit(torch.randn(2, 3, 32, 32))
        b, n, c = seen['x'].shape
        q, k, v = attn.qkv(seen['x']).reshape(b, n, 3, 2, c // 2).permute(2, 0, 3, 1, 4)
        a = torch.relu(q @ k.transpose(-2, -1) * (c // 2) ** -0.5) ** 2 / n
        want = attn.proj((a @ v).transpose(1, 2).reshape(b, n, c))
    torch.testing.assert_close(seen['out'], want, rtol=1e-4, atol=1e-5)


def test_flop_counts_add_its_declared_flops(example):
    from softfree_mm.analysis.flops import attention_flops
    model = _swin()
    x = torch.randn(1, 3, *SIZE)
    counts = attention_flops(model, (x,))
    with AttentionCapture(model) as cap, torch.no_grad():
        model(x)
    # per call: problems x heads x Nq Nk (d + dv), the example's formula
    want = sum(c.q.shape[0] * c.q.shape[1] * c.q.shape[2] * c.k.shape[2] * (c.q.shape[3] + c.v.shape[3])
               for c in cap.calls.values())
    assert len(counts) == len(cap.calls) and sum(counts.values()) == want


def test_a_config_imports_it_by_custom_imports_and_dry_runs(example, tmp_path):
    cfg = tmp_path / 'upernet_swin_relu2.py'
    cfg.write_text(f"_base_ = {osp.join(ROOT, 'configs', 'demo', 'upernet_swin_t_poly3_demo.py')!r}\n"
                   "custom_imports = dict(imports=['my_kernel'], allow_failed_imports=False)\n"
                   "model = dict(backbone=dict(attn_cfg='relu2', embed_dims=16, depths=[2, 2, 1, 1], "
                   "num_heads=[1, 2, 2, 4]), decode_head=dict(in_channels=[16, 32, 64, 128]), "
                   "auxiliary_head=dict(in_channels=64))\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(example[1]), os.environ.get('PYTHONPATH', '')]))
    proc = subprocess.run([sys.executable, osp.join(ROOT, 'tools', 'train.py'), str(cfg), '--dry-run', '--work-dir',
                           str(tmp_path / 'w')], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert 'attention kernels: relu2 x' in proc.stdout and 'config checked, no data read' in proc.stdout
    assert not (tmp_path / 'data').exists()
