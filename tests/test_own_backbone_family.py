"""A backbone family of one's own, exactly as docs/backbones.md "Add a backbone family" writes it, loaded from a folder
outside the package: the package's tools reach it through its declarations alone.

Guards: it is declared to the tools and built from every MODELS registry (a second class of that name is refused);
its fit rule refuses a kernel tied to token positions, naming the place and the reason, and takes a grid kernel; the
support table computes its column from its tiny preset; the hooks place each call by its declared token layout (the
recorded q is the projection of the block's input, the rows are the grid's tokens) and give its norms (softmax's
Jacobian, the closed form written here); a query's map is its row of A on the grid; swap_attention leaves it to its
own attn_cfg; FLOP counts add its kernels' declared flops; the converter detects a release of it, reports its
architecture, converts and loads it, and refuses a file of another depth naming both; the benchmark lists its
preset; ``tools/train.py --dry-run`` takes a config that imports it by ``custom_imports``.
"""
import os
import os.path as osp
import subprocess
import sys

import pytest
import torch

from softfree_mm.engine.hooks import AttentionCapture

from tests.helpers import ROOT, load_tool
from tests.helpers.extensions import doc_example, forget_family, load_example

SIZE = (67, 93)  # a 4x5 patch grid, the bottom / right rows cut as the stride-16 conv does


@pytest.fixture(scope='module')
def example(tmp_path_factory):
    folder = tmp_path_factory.mktemp('own_family')
    module = load_example(doc_example('backbones.md', 'Add a backbone family'), 'my_vit', folder)
    yield module, folder
    forget_family('MyViT')
    sys.modules.pop('my_vit', None)


def _tiny(example, **kw):
    torch.manual_seed(0)
    cls = example[0].MyViT
    return cls(**dict(cls.family.tiny, **kw)).eval()


def test_it_is_declared_to_the_tools_and_built_from_every_registry(example):
    import mmdet.registry
    import mmpretrain.registry
    import mmseg.registry
    from mmengine.registry import DefaultScope
    from softfree_mm.models.family import FAMILIES
    from softfree_mm.registry import MODELS, register_backbone
    cls = example[0].MyViT
    assert FAMILIES['MyViT'] is cls
    for reg in (MODELS, mmdet.registry.MODELS, mmseg.registry.MODELS, mmpretrain.registry.MODELS):
        # in the registry's own scope, as its package's runner builds (another test may leave a scope current)
        with DefaultScope.overwrite_default_scope(reg.scope):
            assert type(reg.build(dict(type='MyViT', **cls.family.tiny, attn_cfg='poly'))) is cls
    other = type('MyViT', (cls,), dict(family=cls.family))
    with pytest.raises(KeyError, match="'MyViT' is already registered"):
        register_backbone(other)
    # its warm start takes its layout's default recipe (token attention unless it declares mixes='channels')
    from softfree_mm.engine.warm_start import default_recipe
    from softfree_mm.models.family import Family
    from softfree_mm.engine.layout_defaults import LAYOUT_DEFAULTS
    assert cls.family.mixes == 'tokens' and default_recipe('MyViT') == LAYOUT_DEFAULTS['tokens']
    # a family that declares no layout borrows token attention's verdict, and the warm start says so
    from softfree_mm.engine.layout_defaults import default_origin
    assert 'not on MyViT (its family declares no layout)' in default_origin(dict(type='MyViT'))
    with pytest.raises(ValueError, match=r"^Family: layout must be None, one of \['global tokens', "):
        Family(tiny={}, layout='pixels')
    with pytest.raises(ValueError, match=r"^Family: mixes must be one of \['tokens', 'channels'\], got 'pixels'$"):
        Family(tiny={}, mixes='pixels')


def test_its_fit_rule_refuses_a_position_tied_kernel_and_the_support_table_says_so(example):
    from softfree_mm.analysis.support import support_matrix
    with pytest.raises(ValueError, match=r"MyViT: attention kernel 'synthesizer' cannot be used in its blocks "
                                         r'\(global attention over the patch grid\): .*tied to token positions'):
        _tiny(example, attn_cfg='synthesizer')
    _tiny(example, attn_cfg='inline')  # a grid kernel: the blocks hand it the patch grid
    assert support_matrix(kernels=['softmax', 'inline', 'synthesizer'], families=['MyViT']) == {
        'MyViT': {'softmax': 'yes', 'inline': 'yes', 'synthesizer': 'no'}}


def test_the_hooks_place_each_call_by_its_declared_layout_and_give_its_norms(example):
    from softfree_mm.engine.hooks.matrix_norms import call_stats
    model = _tiny(example)
    got = {}
    model.blocks[1].norm1.register_forward_hook(lambda mod, args, out: got.setdefault('x', out))
    torch.manual_seed(1)
    with AttentionCapture(model) as cap, torch.no_grad():
        model(torch.randn(2, 3, *SIZE))
    assert list(cap.calls) == ['blocks.0.attn', 'blocks.1.attn']
    call = cap.calls['blocks.1.attn']
    assert (call.layout.kind, call.layout.grid, call.layout.note) == ('global', (4, 5), 'global over the 4x5 grid')
    assert torch.equal(call.layout.query_pos, torch.arange(20).view(1, 20))
    attn = model.blocks[1].attn
    q = attn.qkv(got['x'])[..., :32].view(2, 20, 2, 16).transpose(1, 2)  # query i is grid token i
    torch.testing.assert_close(call.q, q)
    st = call_stats(call)
    a = call.matrix().double()
    torch.testing.assert_close(st['fro'].double(), a.pow(2).sum((-2, -1)).sqrt().mean(0), rtol=1e-5, atol=1e-7)
    jac = (a.pow(2).sum(-1) - 2 * a.pow(3).sum(-1) + a.pow(2).sum(-1) ** 2).sum(-1).sqrt().mean(0)
    torch.testing.assert_close(st['jac'].double(), jac, rtol=1e-5, atol=1e-7)
    assert st['rows'] == 20


def test_a_querys_map_is_its_row_of_a_on_the_grid(example):
    from softfree_mm.analysis.attention_maps import query_map
    with AttentionCapture(_tiny(example)) as cap, torch.no_grad():
        cap.module(torch.randn(1, 3, *SIZE))
    call = cap.calls['blocks.0.attn']
    m = query_map(call, (40.0, 20.0), head=1)  # pixel (x 40, y 20): token (1, 2) of 67 / 4 x 93 / 5 pixels
    assert m['token'] == (1, 2) and m['stride'] == (67 / 4, 93 / 5)
    torch.testing.assert_close(m['values'], call.matrix()[0, 1, 1 * 5 + 2].view(4, 5))


def test_swap_attention_leaves_it_to_its_own_attn_cfg(example):
    from softfree_mm import swap_attention
    from softfree_mm.swap import SwapError
    with pytest.raises(SwapError, match="set that backbone's attn_cfg"):
        swap_attention(_tiny(example), 'relu')


def test_flop_counts_add_its_kernels_declared_flops(example):
    from softfree_mm.analysis.flops import attention_flops
    counts = attention_flops(_tiny(example, attn_cfg='poly'), (torch.randn(1, 3, *SIZE),))
    # two blocks, two heads, 20 tokens of 16 channels: poly's explicit products (fewer than its features here)
    assert counts == {f'blocks.{j}.attn.kernel': 2 * 20 * 20 * (16 + 16) for j in range(2)}


def test_the_converter_detects_reports_and_loads_a_release_and_refuses_another_depth(example, tmp_path, capsys):
    from softfree_mm.analysis.benchmark.backbones import backbone_presets
    from softfree_mm.models.converters import arch_report, detect_family, list_converters
    src = _tiny(example, arch=dict(embed_dims=32, depth=3, num_heads=2))
    release = {k.replace('blocks.', 'layers.', 1): v for k, v in src.state_dict().items()}
    release['head.weight'] = torch.zeros(10, 32)
    assert 'my_vit' in list_converters() and 'my_vit_t' in backbone_presets()
    family, converted = detect_family(release)
    assert family == 'my_vit' and converted.keys() == src.state_dict().keys()
    report = arch_report('my_vit', converted)
    assert report.startswith("MyViT(arch='tiny', embed_dims=32, depth=3)") and '3 blocks, width 32' in report
    path = str(tmp_path / 'release.pth')
    torch.save({'model': release}, path)
    assert load_tool('convert_checkpoint').main(['auto', path, '--print-arch']) == 0
    assert capsys.readouterr().out.strip() == f'my_vit: {report}'
    loaded = _tiny(example, arch=dict(embed_dims=32, depth=3, num_heads=2),
                   init_cfg=dict(type='Pretrained', checkpoint=path))
    loaded.init_weights()
    for k, v in src.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[k], v)
    shallow = _tiny(example, init_cfg=dict(type='Pretrained', checkpoint=path))  # depth 2
    with pytest.raises(ValueError, match=r'(?s)MyViT: checkpoint .*release.pth holds another architecture than this '
                                         r'model .*3 blocks of 32 channels in the file, 2 blocks of 32 channels'):
        shallow.init_weights()


def test_a_config_imports_it_by_custom_imports_and_dry_runs(example, tmp_path):
    cfg = tmp_path / 'cls_my_vit.py'
    cfg.write_text(f"_base_ = {osp.join(ROOT, 'configs', 'demo', 'cls_xcit_t12_poly3_demo.py')!r}\n"
                   "custom_imports = dict(imports=['my_vit'], allow_failed_imports=False)\n"
                   "model = dict(backbone=dict(_delete_=True, type='MyViT', arch=dict(embed_dims=32, depth=2, "
                   "num_heads=2), attn_cfg='poly'), neck=dict(_delete_=True, type='GlobalAveragePooling'), "
                   "head=dict(in_channels=32))\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(example[1]), os.environ.get('PYTHONPATH', '')]))
    proc = subprocess.run([sys.executable, osp.join(ROOT, 'tools', 'train.py'), str(cfg), '--dry-run', '--work-dir',
                           str(tmp_path / 'w')], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert 'backbone MyViT forward' in proc.stdout and 'config checked, no data read' in proc.stdout
    assert not (tmp_path / 'data').exists()
