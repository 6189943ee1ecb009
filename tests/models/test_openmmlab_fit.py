"""softfree_mm as an OpenMMLab user meets it.

* Drop-in: mmdet's own Swin and PVTv2 configs, shipped in mmdet's ``.mim/configs``, build and run with ``type=``
  changed and nothing else; the result has exactly the parameters of mmdet's backbone. Arguments without a meaning
  here are named in one error. mmseg's ``upernet_r50`` base with our backbone swapped in: the model-level
  ``pretrained`` reaches the backbone (mmseg's EncoderDecoder hands it down), is taken as the deprecated alias of
  ``init_cfg=Pretrained`` with one warning, and loads the file.
* The README's "own config" example builds exactly as written.
* ``tools/train.py CONFIG --dry-run`` checks a config without its data and reads none; the data-root error names the
  option. A visualiser backend whose package is missing (TensorBoard) is one line, exit status 2.
* The tools print nothing before their own one-line errors (no deprecation notes from the frozen stack).
"""
import importlib
import os
import os.path as osp
import re
import subprocess
import sys
import warnings

import pytest
import torch
from mmengine.config import Config

import softfree_mm  # noqa: F401  (registers the backbones)
from softfree_mm import models
from softfree_mm.models import SoftFreePVT, SoftFreePVTv2, SoftFreeSwin

from tests.helpers import ROOT, load_tool
from tests.helpers.models import build_in
from tests.helpers.presets import TINY  # every registered backbone

MMDET_CONFIGS = osp.join(osp.dirname(importlib.import_module('mmdet').__file__), '.mim', 'configs')
MMSEG_CONFIGS = osp.join(osp.dirname(importlib.import_module('mmseg').__file__), '.mim', 'configs')
SWIN_TINY = SoftFreeSwin.family.tiny


def n_params(module):
    return sum(p.numel() for p in module.parameters())


# ---------------------------------------------------------------------------------------------- drop-in for mmdet
@pytest.mark.parametrize('config, ours', [('swin/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py', 'SoftFreeSwin'),
                                          ('pvt/retinanet_pvtv2-b0_fpn_1x_coco.py', 'SoftFreePVTv2')])
def test_mmdet_shipped_config_builds_and_runs_with_only_the_type_changed(config, ours):
    cfg = Config.fromfile(osp.join(MMDET_CONFIGS, config))
    original = build_in('mmdet', cfg.model.backbone)
    cfg.model.backbone.type = ours  # the only change
    model = build_in('mmdet', cfg.model).eval()
    assert type(model.backbone).__name__ == ours
    # the same architecture: every parameter of mmdet's backbone has its counterpart, and the output channels the
    # config's neck expects
    assert n_params(model.backbone) == n_params(original)
    assert list(model.backbone.out_channels) == list(cfg.model.neck.in_channels)
    image = torch.randint(0, 255, (3, 64, 96), dtype=torch.uint8)
    from mmdet.structures import DetDataSample
    sample = DetDataSample(metainfo=dict(img_shape=(64, 96), ori_shape=(64, 96), scale_factor=(1., 1.)))
    data = model.data_preprocessor(dict(inputs=[image], data_samples=[sample]))
    with torch.no_grad():
        feats = model.extract_feat(data['inputs'])
        results = model(**data, mode='predict')
    assert len(feats) == cfg.model.neck.num_outs and all(torch.isfinite(f).all() for f in feats)
    assert len(results) == 1 and 'pred_instances' in results[0]


def test_mmdet_swin_arguments_keep_their_meaning():
    qk = SoftFreeSwin(**SWIN_TINY, qk_scale=0.125).eval()
    ref = SoftFreeSwin(**SWIN_TINY).eval()
    ref.load_state_dict(qk.state_dict())
    seen = {}
    kernel = qk.stages[0].blocks[0].attn.kernel
    kernel.register_forward_hook(lambda m, args, kwargs, out: seen.update(kwargs), with_kwargs=True)
    x = torch.randn(1, 3, 40, 40)
    with torch.no_grad():
        differs = any(not torch.allclose(a, b) for a, b in zip(qk(x), ref(x)))
    assert seen['scale'] == 0.125 and differs
    # frozen_stages as mmdet's: stage 0 and the patch merging after it
    frozen = SoftFreeSwin(**SWIN_TINY, frozen_stages=1).train()
    assert not any(p.requires_grad for p in frozen.stages[1].downsample.parameters())
    assert all(p.requires_grad for p in frozen.stages[1].blocks.parameters())
    # accepted at the values that describe this model
    SoftFreeSwin(**SWIN_TINY, strides=(4, 2, 2, 2), convert_weights=True, pretrain_img_size=384,
                 use_abs_pos_embed=False, attn_drop_rate=0., act_cfg=dict(type='GELU'), norm_cfg=dict(type='LN'))


def test_arguments_without_a_meaning_here_are_named_in_one_error():
    with pytest.raises(ValueError) as e:
        SoftFreeSwin(**SWIN_TINY, use_abs_pos_embed='yes', attn_drop_rate=0.1, act_cfg=dict(type='ReLU'),
                     strides=(4, 2, 2, 1))
    msg = str(e.value)
    assert msg.startswith('SoftFreeSwin: these arguments have no meaning here: ')
    for name in ("use_abs_pos_embed='yes'", 'attn_drop_rate=0.1', "act_cfg={'type': 'ReLU'}", 'strides=(4, 2, 2, 1)'):
        assert name in msg
    assert 'norm_cfg' not in msg and '\n' not in msg
    with pytest.raises(ValueError, match=r"SoftFreePVTv2: these arguments have no meaning here: num_stages=3 .*"
                                         r"norm_cfg=\{'type': 'BN'\}"):
        SoftFreePVTv2(num_stages=3, norm_cfg=dict(type='BN'))
    with pytest.raises(ValueError, match=r'depths=\(2, 2, 2, 2\) and num_layers=\[3, 4, 6, 3\] .* disagree'):
        SoftFreePVTv2(depths=(2, 2, 2, 2), num_layers=[3, 4, 6, 3])
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'qkscale'"):  # a typo stays a typo
        SoftFreeSwin(qkscale=0.1)


@pytest.mark.parametrize('ours, theirs', [('SoftFreeSwin', 'swin.SwinTransformer'),
                                          ('SoftFreePVTv2', 'pvt.PyramidVisionTransformerV2'),
                                          ('SoftFreePVT', 'pvt.PyramidVisionTransformer')])
def test_pretrain_img_size_of_another_length_is_refused_as_mmdet_refuses_it(ours, theirs):
    module, name = theirs.split('.')
    mmdet_cls = getattr(importlib.import_module(f'mmdet.models.backbones.{module}'), name)
    cls = getattr(models, ours)
    small = SWIN_TINY if ours == 'SoftFreeSwin' else dict(embed_dims=(8, 8, 8, 8), num_heads=(1, 1, 1, 1),
                                                            depths=(1, 1, 1, 1))
    with pytest.raises(AssertionError, match='length 1 or 2, but got 3'):
        mmdet_cls(pretrain_img_size=(224, 224, 3))
    for bad in ((224, 224, 3), (), [224, 224, 3], (224, 0), 224.0, '224'):
        with pytest.raises(ValueError, match=rf'^{ours}: pretrain_img_size must be a positive int or a tuple of 1 or '
                                             rf'2 positive ints \(H, W\).* got {re.escape(repr(bad))}$'):
            cls(**small, pretrain_img_size=bad)
    for good in (224, (224,), (224, 320), [224, 320]):  # mmdet's own forms
        cls(**small, pretrain_img_size=good)


def test_pvt_and_swin_size_their_position_tables_from_an_h_w_pretrain_img_size_as_mmdet():
    from mmdet.models.backbones.pvt import PyramidVisionTransformer
    from mmdet.models.backbones.swin import SwinTransformer
    size = (224, 320)
    ref = PyramidVisionTransformer(pretrain_img_size=size, num_layers=[1, 1, 1, 1])
    mm = [m.pos_embed.shape for m in ref.modules() if hasattr(m, 'pos_embed')]
    ours = SoftFreePVT(pretrain_img_size=size, depths=(1, 1, 1, 1))
    assert [s.pos_embed.shape for s in ours.stages] == mm == [(1, 56 * 80, 64), (1, 28 * 40, 128),
                                                              (1, 14 * 20, 320), (1, 7 * 10, 512)]
    swin = SwinTransformer(embed_dims=16, depths=(1, 1), num_heads=(1, 2), strides=(4, 2), out_indices=(0, 1),
                           pretrain_img_size=size, use_abs_pos_embed=True)
    mine = SoftFreeSwin(arch=dict(embed_dims=16, depths=(1, 1), num_heads=(1, 2)), out_indices=(0, 1),
                        pretrain_img_size=size, use_abs_pos_embed=True)
    assert mine.absolute_pos_embed.shape == swin.absolute_pos_embed.shape == (1, 56 * 80, 16)


def test_pvtv2_mmdet_embed_dims_and_num_layers_mean_what_they_mean_in_mmdet():
    model = SoftFreePVTv2(embed_dims=32, num_layers=[2, 2, 2, 2])
    assert model.embed_dims == (32, 64, 160, 256) and model.depths == (2, 2, 2, 2)


# ---------------------------------------------------------------------------------------------- pretrained
@pytest.mark.parametrize('name', sorted(TINY))
def test_pretrained_is_the_deprecated_alias_of_a_pretrained_init_cfg(name, tmp_path):
    from softfree_mm.models.utils import pretrained
    cls, kwargs = getattr(models, name), TINY[name]
    src = cls(**kwargs)
    path = str(tmp_path / 'weights.pth')
    torch.save({'state_dict': src.state_dict()}, path)
    pretrained._WARNED_PRETRAINED.discard(cls.__name__)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        model = cls(**kwargs, pretrained=path)
        cls(**kwargs, pretrained=path)
    notes = [w for w in caught if issubclass(w.category, FutureWarning) and 'pretrained' in str(w.message)]
    assert len(notes) == 1 and "init_cfg=dict(type='Pretrained'" in str(notes[0].message)
    assert model.init_cfg == dict(type='Pretrained', checkpoint=path)
    model.init_weights()
    for k, v in src.state_dict().items():
        assert torch.equal(model.state_dict()[k], v), k
    with pytest.raises(ValueError, match=f'{cls.__name__}: pretrained=.* and init_cfg=.* cannot both be given'):
        cls(**kwargs, pretrained=path, init_cfg=dict(type='Pretrained', checkpoint=path))
    with pytest.raises(TypeError, match=f'{cls.__name__}: pretrained must be a checkpoint path'):
        cls(**kwargs, pretrained=3)


def test_mmseg_upernet_r50_base_with_our_backbone_takes_the_model_level_pretrained(tmp_path):
    src = SoftFreeSwin(**SWIN_TINY)
    path = str(tmp_path / 'swin.pth')
    torch.save(src.state_dict(), path)
    cfg_file = tmp_path / 'upernet_softfree_swin.py'
    cfg_file.write_text(
        f"_base_ = '{osp.join(MMSEG_CONFIGS, '_base_', 'models', 'upernet_r50.py')}'\n"
        f"custom_imports = dict(imports=['softfree_mm'], allow_failed_imports=False)\n"
        f"model = dict(pretrained={path!r},\n"
        f"             backbone=dict(_delete_=True, type='SoftFreeSwin', arch={SWIN_TINY['arch']!r}),\n"
        f"             decode_head=dict(in_channels=[16, 32, 64, 128]), auxiliary_head=dict(in_channels=64))\n")
    cfg = Config.fromfile(str(cfg_file))
    assert cfg.model.backbone.get('pretrained') is None  # the model-level key, as mmseg's configs have it
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', FutureWarning)
        model = build_in('mmseg', cfg.model)
    assert model.backbone.init_cfg == dict(type='Pretrained', checkpoint=path)
    model.init_weights()
    for k, v in src.state_dict().items():
        assert torch.equal(model.backbone.state_dict()[k], v), k


# ---------------------------------------------------------------------------------------------- README example
def test_readme_own_config_example_builds_as_written(tmp_path):
    readme = open(osp.join(ROOT, 'README.md')).read()
    section = readme[readme.index('## Use it in your own mm config'):]
    snippet = re.search(r'```python\n(.*?)```', section, re.S).group(1)
    path = tmp_path / 'my_config.py'
    path.write_text(snippet)
    cfg = Config.fromfile(str(path))
    assert importlib.import_module(cfg.custom_imports['imports'][0]) is softfree_mm
    model = build_in(cfg.default_scope, cfg.model)
    assert type(model.backbone).__name__.startswith('SoftFree')
    assert list(cfg.model.neck.in_channels) == list(model.backbone.out_channels)
    assert all(type(m).__name__ != 'ResNet' for m in model.modules())  # _delete_=True dropped ResNet's arguments


def test_readme_explains_the_methods_itself_and_cites_no_project_files():
    """A user of the package has the README, not the project's method notes (METHODS.md, the seeds 000..003)."""
    from softfree_mm.attention import list_attentions
    readme = open(osp.join(ROOT, 'README.md')).read()
    assert 'METHODS.md' not in readme and 'DESIGN.md' not in readme and 'STACK.md' not in readme
    assert not re.search(r'seeds? 0\d\d', readme), re.search(r'.*seeds? 0\d\d.*', readme).group(0)
    start = readme.index('## The four methods, in short')
    section = readme[start:readme.index('\n## ', start + 1)]
    for kernel in ('poly', 'soft', 'linear', 'synthesizer', 'inline'):  # each method's kernel, by its registered name
        assert f'`{kernel}`' in section and kernel in list_attentions(), kernel
    for paper in ('arXiv 2410.18613', 'arXiv 2110.11945', 'NeurIPS 2024'):
        assert paper in section


def test_shipped_configs_tools_and_package_cite_papers_not_project_notes():
    """configs/, tools/ and the package reach users through mim and the wheel: no "seed 0NN" or METHODS.md there."""
    hits = []
    for top in ('configs', 'tools', 'softfree_mm'):
        for dirpath, _, files in os.walk(osp.join(ROOT, top)):
            for name in files:
                if name.endswith(('.py', '.sh', '.md', '.yml')):
                    path = osp.join(dirpath, name)
                    text = open(path, encoding='utf-8').read()
                    if re.search(r'seeds? 0\d\d|METHODS\.md|DESIGN\.md|STACK\.md', text, re.I):
                        hits.append(osp.relpath(path, ROOT))
    assert not hits, hits


# ---------------------------------------------------------------------------------------------- tools

@pytest.fixture(scope='module')
def train_tool():
    return load_tool('train')


def test_dry_run_checks_a_config_without_reading_or_writing_data(train_tool, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the demo configs' data roots are relative: data/demo/... would appear here
    cfg = osp.join(ROOT, 'configs', 'demo', 'upernet_swin_t_poly3_demo.py')
    options = ['--cfg-options', 'model.backbone.embed_dims=16', 'model.backbone.depths=[2,2,1,1]',
               'model.backbone.num_heads=[1,2,2,4]', 'model.decode_head.in_channels=[16,32,64,128]',
               'model.auxiliary_head.in_channels=64']
    assert train_tool.main([cfg, '--dry-run', '--work-dir', str(tmp_path / 'w'), *options]) == 0
    out = capsys.readouterr().out
    for part in ('model EncoderDecoder', 'attention kernels: poly x', 'backbone SoftFreeSwin forward 64x64',
                 'attention paths at 224x224 (each call\'s, from its shapes): stages.0.blocks.0.attn..stages.3.blocks.0.attn '
                 '(6 layers): poly explicit order (explicit)',
                 'train_dataloader.dataset', 'pipeline of', 'val_evaluator: IoUMetric built', 'optim_wrapper:',
                 'config checked, no data read, nothing trained'):
        assert part in out, part
    assert not (tmp_path / 'data').exists()
    # a kernel that cannot run in this backbone is found without data too
    assert train_tool.main([cfg, '--dry-run', *options, 'model.backbone.attn_cfg=soft']) == 2
    err = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith('[softfree_mm]')]
    assert len(err) == 1 and "attention kernel 'soft' cannot be used in stage 0" in err[0]


def test_the_dry_run_names_the_order_each_attention_call_takes():
    """linear attention: the factorised order over tokens (PVTv2), the explicit one in XCiT's channel attention (at
    224x224 its kernels see 196 tokens as their head_dim, more than a head's 8 channels here)."""
    import torch

    from softfree_mm.engine.dry_run import attention_paths
    from softfree_mm.models.backbones import SoftFreePVTv2, SoftFreeXCiT
    x = torch.zeros(1, 3, 224, 224)
    from softfree_mm.engine.dry_run import describe_paths
    xcit = SoftFreeXCiT(**dict(SoftFreeXCiT.family.tiny, attn_cfg='linear'))
    paths = attention_paths(xcit, x)
    assert [p[1:] for p in paths] == [('linear', 'explicit order')] * 4
    assert describe_paths(paths) == 'blocks.0.attn..blocks.3.attn (4 layers): linear explicit order'
    # token attention: the factorised order, but where a stage has fewer tokens than a few head widths (the last
    # stage's 7 x 7 = 49 tokens at head width 32 here) the explicit one is cheaper
    pvt = SoftFreePVTv2(**dict(SoftFreePVTv2.family.tiny, attn_cfg='linear', sr_ratios=(1, 1, 1, 1)))
    orders = [p[2] for p in attention_paths(pvt, x)]
    assert orders[0] == 'factorised order' and len(orders) == sum(pvt.depths)


def test_tensorboard_backend_without_tensorboard_is_one_line(train_tool, capsys, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, 'tensorboard', None)  # as on a machine without it
    cfg = tmp_path / 'with_tensorboard.py'
    cfg.write_text(f"_base_ = {osp.join(ROOT, 'configs', 'upernet_swin_t_softmax.py')!r}\n"
                   "visualizer = dict(vis_backends=[dict(type='LocalVisBackend'), "
                   "dict(type='TensorboardVisBackend')])\n")
    assert train_tool.main([str(cfg), '--dry-run', '--work-dir', str(tmp_path)]) == 2
    err = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith('[softfree_mm]')]
    assert err == ["error: visualizer.vis_backends[1].type='TensorboardVisBackend' needs the tensorboard package, "
                   'which is not installed: pip install -e .[tensorboard] (or pip install tensorboard)']
    # the extra that the message names exists
    setup = open(osp.join(ROOT, 'setup.py')).read()
    assert "'tensorboard': parse_requirements('tensorboard.txt')" in setup
    assert 'tensorboard' in open(osp.join(ROOT, 'requirements', 'tensorboard.txt')).read()


def test_missing_data_root_is_the_only_line_and_names_the_dry_run(tmp_path):
    """A fresh interpreter, as a user runs the tool: on the way to the data-root check the stack imports
    pkg_resources (mmengine's is_installed), whose deprecation notes must not come before the tool's one line; the
    line names --dry-run."""
    env = {k: v for k, v in os.environ.items() if k != 'PYTHONWARNINGS'}
    env['PYTHONPATH'] = os.pathsep.join([ROOT] + [p for p in env.get('PYTHONPATH', '').split(os.pathsep) if p])
    proc = subprocess.run([sys.executable, osp.join(ROOT, 'tools', 'train.py'),
                           osp.join(ROOT, 'configs', 'upernet_swin_t_softmax.py'), '--work-dir', str(tmp_path),
                           '--cfg-options', f'train_dataloader.dataset.data_root={tmp_path / "ade"}'],
                          capture_output=True, text=True, env=env, timeout=300, cwd=str(tmp_path))
    assert proc.returncode == 2, proc.stderr
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1, proc.stderr
    assert err[0].startswith('error: train_dataloader.dataset.data_root: ') and 'does not exist' in err[0]
    assert '`tools/train.py CONFIG --dry-run` checks the config without data' in err[0]
    # what the filter keeps away is the stack's real note (fails if setuptools rewords it)
    import pkg_resources
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        importlib.reload(pkg_resources)
    notes = [str(w.message) for w in caught if 'pkg_resources' in str(w.message)]
    quiet = importlib.import_module('tool_warnings').QUIET
    assert notes and all(any(re.match(pattern, n) for _, pattern in quiet) for n in notes)
    # precise: the stack's known notes are filtered, any other warning still shows
    with warnings.catch_warnings(record=True) as caught:
        warnings.resetwarnings()
        warnings.simplefilter('always')
        importlib.reload(importlib.import_module('tool_warnings'))
        warnings.warn('pkg_resources is deprecated as an API. See ...', UserWarning)
        warnings.warn('``build_loss`` would be deprecated soon, please use ...', UserWarning)
        warnings.warn('pkg_resources is something else', UserWarning)
        warnings.warn('pkg_resources is deprecated as an API', DeprecationWarning)
    assert [str(w.message) for w in caught] == ['pkg_resources is something else',
                                               'pkg_resources is deprecated as an API']
