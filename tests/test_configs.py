"""Every config in configs/ builds its model and its data pipelines (on the embedded demo data).

Guards: the config matrix the issue asks for exists; each config's model builds from its own scope's registry with
the kernels its name promises (poly3 -> poly degree 3 everywhere, inline -> the InLine set-up with a softmax last
stage); the train and test pipelines of every dataset definition turn demo images into packed model inputs; the
recipes leave norms, biases, position tables and XCiT's temperature without weight decay; ``auto_scale_lr`` uses the
total batch written in each header.
"""
import functools
import glob
import os.path as osp
import re
import sys

import mmengine.config.utils as _cfg_utils
import pytest
import torch
from mmengine.config import Config

# for every config that inherits an mmseg / mmdet base, mmengine re-reads all of that package's metafiles (dozens of
# YAML files, most of a config's parse time); they never change during the tests, so each is read once
_cfg_utils.load = functools.lru_cache(maxsize=None)(_cfg_utils.load)
from mmengine.registry import DATASETS, MODELS  # noqa: E402

import softfree_mm  # noqa: E402,F401
from softfree_mm.attention import AttentionKernel, kernel_class  # noqa: E402
from softfree_mm.engine.warm_start import default_recipe  # noqa: E402

from tests.helpers import ROOT  # noqa: E402

TASKS = ('maskrcnn', 'upernet', 'semfpn', 'cls')
WARM_START = ('transfer', 'finetune')  # stage 1 and 2 of the warm start, per kernel without a release
BACKBONES = ('xcit_s12', 'pvt_v2_b2', 'swin_t', 'cswin_t')
BACKBONE_TYPES = dict(xcit_s12='SoftFreeXCiT', pvt_v2_b2='SoftFreePVTv2', swin_t='SoftFreeSwin',
                      cswin_t='SoftFreeCSWin', pvt_s='SoftFreePVT', soft_s='SoftFreeSOFT')
MAIN = sorted(p for p in glob.glob(osp.join(ROOT, 'configs', '*.py')))
DEMO = sorted(p for p in glob.glob(osp.join(ROOT, 'configs', 'demo', '*.py')) if not osp.basename(p).startswith('_'))
NAME = re.compile(r'^(?P<task>[a-z]+)_(?P<backbone>xcit_s12|pvt_v2_b2|swin_t|cswin_t|pvt_s|soft_s)_'
                  r'(?P<attn>[a-z0-9]+)\.py$')


def _rel(p):
    return osp.relpath(p, ROOT)


def test_config_matrix_has_softmax_poly3_and_inline_or_poly1_for_every_task_and_backbone():
    names = {osp.basename(p) for p in MAIN}
    assert 'maskrcnn_xcit_s12_poly3.py' in names
    for task in TASKS:
        for bb in BACKBONES:
            third = 'poly1' if bb == 'xcit_s12' else 'inline'
            for attn in ('softmax', 'poly3', third):
                assert f'{task}_{bb}_{attn}.py' in names, f'missing configs/{task}_{bb}_{attn}.py'
    for task in TASKS:  # the official models the seeds released: InLine-PVT-S, SOFT-Small-Norm
        for extra in ('pvt_s_inline', 'soft_s_softnorm'):
            assert f'{task}_{extra}.py' in names, f'missing configs/{task}_{extra}.py'
    for n in names:
        assert NAME.match(n) and NAME.match(n)['task'] in TASKS + WARM_START, \
            f'config name {n} is not task_backbone_attention'


@pytest.mark.parametrize('path', MAIN + DEMO, ids=_rel)
def test_config_header_states_gpus_times_images_per_gpu(path):
    head = open(path).read().split('_base_')[0]
    assert re.search(r'\d+ (GPUs|process) \(?\w*\)? ?x \d+ images', head) or 'GPUs x images per GPU' in head, \
        f'{_rel(path)}: the header must state GPUs x images per GPU'


INIT_FUNCTIONS = ('uniform_', 'normal_', 'trunc_normal_', 'trunc_normal_tf_', 'kaiming_uniform_', 'kaiming_normal_',
                  'xavier_uniform_', 'xavier_normal_')


def _skip_random_init(monkeypatch):
    """Random initialisation is most of a build's time and not what the build tests guard: make it a no-op."""
    modules = [torch.nn.init] + [m for n, m in list(sys.modules.items())
                                 if m is not None and n.startswith(('softfree_mm.', 'timm.layers'))]
    for mod in modules:
        for fn in INIT_FUNCTIONS:
            if callable(getattr(mod, fn, None)):
                monkeypatch.setattr(mod, fn, lambda tensor, *a, **k: tensor)


def _expected_kernels(cfg_name, cfg):
    """The kernel type names per backbone stage / layer that the config's name promises."""
    m = NAME.match(cfg_name.replace('_demo', ''))
    attn = m['attn']
    if attn in ('inline', 'agent') and m['backbone'] == 'pvt_s':
        return {attn}  # InLine-PVT, Agent-PVT: the kernel in every stage
    if attn == 'agent':
        return {'agent', 'softmax'}  # Agent-Swin-T: softmax windows in stage 4
    if attn in ('inline', 'soft'):
        return {attn, 'softmax'}
    if attn == 'softnorm':
        return {'soft', 'softmax'}
    return {'poly3': {'poly'}, 'poly1': {'poly'}, 'softmax': {'softmax'}, 'linear': {'linear'}}[attn]


@pytest.mark.parametrize('path', MAIN, ids=_rel)
def test_config_builds_its_model_with_the_kernels_its_name_promises(path, monkeypatch):
    cfg = Config.fromfile(path)
    name = osp.basename(path)
    bb_type = cfg.model.backbone.type
    assert bb_type == BACKBONE_TYPES[NAME.match(name)['backbone']]
    model_cfg = cfg.model
    # SyncBN needs a process group: build with BN as tools/train.py does on CPU
    from softfree_mm.engine.device import _replace_syncbn
    _replace_syncbn(model_cfg)
    _skip_random_init(monkeypatch)
    with MODELS.switch_scope_and_registry(cfg.default_scope) as registry:
        model = registry.build(model_cfg)
    kernels = [m for m in model.backbone.modules() if isinstance(m, AttentionKernel)]
    assert kernels, f'{name}: the backbone holds no attention kernel'
    found = {_kernel_name(k) for k in kernels}
    assert found == _expected_kernels(name, cfg), f'{name}: kernels {found}'
    if name.endswith('_poly3.py'):
        assert all(k.degree == 3 for k in kernels if hasattr(k, 'degree'))
    if name.endswith('_inline.py') and '_pvt_s_' not in name:
        # the InLine set-up keeps softmax only in the last stage(s): the first kernel is InLine, the last softmax
        assert _kernel_name(kernels[0]) == 'inline' and _kernel_name(kernels[-1]) == 'softmax'
    if name.endswith('_inline.py'):  # the official per-channel residual, with the context the backbone passes
        assert all(k.local_residual == 'channel' for k in kernels if _kernel_name(k) == 'inline')
    if name.endswith(('_soft.py', '_softnorm.py')):
        # the SOFT set-up: landmark ratios 8 / 4 / 2 and convs on v 9 / 5 / 3 in stages 1-3, softmax in stage 4
        per_stage = []
        for stage in model.backbone.stages:
            names = {_kernel_name(k) if _kernel_name(k) == 'softmax' else
                     (_kernel_name(k), k.landmark_ratio, k.conv_size)
                     for k in stage.modules() if isinstance(k, AttentionKernel)}
            assert len(names) == 1, f'{name}: one kernel per stage, got {names}'
            per_stage.append(names.pop())
        assert per_stage == [('soft', 8, 9), ('soft', 4, 5), ('soft', 2, 3), 'softmax'], per_stage
        assert all(k.tie_qk and k.normalized == name.endswith('_softnorm.py')
                   for k in kernels if _kernel_name(k) == 'soft')


def _kernel_name(k):
    from softfree_mm.attention import ATTENTION
    for n in ATTENTION:
        if type(k) is ATTENTION.get(n):
            return n
    raise AssertionError(f'{type(k)} is not a registered kernel')


@pytest.fixture(scope='module')
def demo_root(tmp_path_factory):
    from make_demo_data import make_demo_data  # tools/make_demo_data.py (tests/conftest.py puts tools/ on sys.path)
    root = tmp_path_factory.mktemp('demo') / 'data' / 'demo'
    return make_demo_data(str(root))


def _point_at_demo(cfg, demo):
    """Real dataset configs re-rooted at the demo data (COCO needs the demo's class names to keep its images)."""
    for key in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        ds = cfg[key].dataset
        if ds.type == 'CocoDataset':
            ds.data_root = osp.join(demo, 'coco') + '/'
            ds.metainfo = dict(classes=tuple(f'digit_{d}' for d in range(10)))
        elif ds.type == 'ADE20KDataset':
            ds.data_root = osp.join(demo, 'ade')
        elif ds.type == 'ImageNet':
            ds.data_root = osp.join(demo, 'imagenet')
        else:
            raise AssertionError(f'unexpected dataset type {ds.type}')


def _unique_dataset_configs():
    seen, out = set(), []
    for p in MAIN + DEMO:
        cfg = Config.fromfile(p)
        key = repr([cfg[k].dataset.to_dict() for k in ('train_dataloader', 'test_dataloader')])
        if key not in seen:
            seen.add(key)
            out.append(p)
    return out


DATASET_CONFIGS = [osp.join(ROOT, 'configs', n) for n in (
    'maskrcnn_xcit_s12_softmax.py', 'upernet_swin_t_softmax.py', 'cls_swin_t_softmax.py')] + DEMO


@pytest.mark.parametrize('path', DATASET_CONFIGS, ids=_rel)
def test_train_and_test_pipelines_pack_demo_images_into_model_inputs(path, demo_root):
    cfg = Config.fromfile(path)
    if '/demo/' not in path:
        _point_at_demo(cfg, demo_root)
    else:
        for key in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
            if cfg.get(key) is None:  # stage 1 of the warm start: images only, no validation
                continue
            ds = cfg[key].dataset
            ds.data_root = ds.data_root.replace('data/demo', demo_root)
    with DATASETS.switch_scope_and_registry(cfg.default_scope) as registry:
        import importlib
        importlib.import_module(f'{cfg.default_scope}.datasets')
        for key in ('train_dataloader', 'test_dataloader'):
            if cfg.get(key) is None:
                continue
            ds = registry.build(cfg[key].dataset)
            assert len(ds) > 0, f'{key}: no samples found in the demo data'
            sample = ds[0]
            inputs = sample['inputs']
            assert isinstance(inputs, torch.Tensor) and inputs.dim() == 3 and inputs.shape[0] == 3
            ds_sample = sample['data_samples']
            if cfg.default_scope == 'mmdet':
                if key == 'train_dataloader':
                    assert len(ds_sample.gt_instances) > 0 and ds_sample.gt_instances.masks.masks.any()
            elif cfg.default_scope == 'mmseg':
                seg = ds_sample.gt_sem_seg.data
                assert seg.shape[-2:] == inputs.shape[-2:] or key == 'test_dataloader'
                # background -> 0, digits -> 1..10, 255 ignore (reduce_zero_label)
                assert set(seg.unique().tolist()) <= set(range(11)) | {255}
            else:
                assert 0 <= int(ds_sample.gt_label) < 10


def test_recipe_has_no_weight_decay_on_norms_biases_tables_and_temperature():
    from mmengine.optim import build_optim_wrapper
    cfg = Config.fromfile(osp.join(ROOT, 'configs', 'maskrcnn_xcit_s12_poly3.py'))
    # a small XCiT keeps the build fast; the parameter names are those of the full model
    cfg.model.backbone.update(embed_dims=64, depth=4, num_heads=4, out_indices=(0, 1, 2, 3),
                              norm_cfg=dict(type='BN'))
    cfg.model.neck.in_channels = [64] * 4
    with MODELS.switch_scope_and_registry('mmdet') as registry:
        model = registry.build(cfg.model)
    wrapper = build_optim_wrapper(model, cfg.optim_wrapper)
    decay = {}
    for group in wrapper.optimizer.param_groups:
        for p in group['params']:
            decay[id(p)] = group['weight_decay']
    names = dict(model.named_parameters())
    for n, p in names.items():
        wd = decay[id(p)]
        no_decay = (n.endswith('.bias') or 'temperature' in n or 'pos_embed' in n or '.bn.' in n
                    or re.search(r'norm\d*\.(weight|bias)$', n) is not None)
        if no_decay:
            assert wd == 0, f'{n} gets weight decay {wd}'
    assert decay[id(names['backbone.blocks.0.attn.qkv.weight'])] == pytest.approx(0.05)
    assert decay[id(names['backbone.blocks.0.attn.temperature'])] == 0


@pytest.mark.parametrize('path', MAIN, ids=_rel)
def test_auto_scale_lr_base_batch_equals_header_total_batch(path):
    cfg = Config.fromfile(path)
    text = open(path).read()
    base = re.search(r"^_base_ = '\./(\w+\.py)'", text, re.M)
    if not re.search(r'(\d+) GPUs x (\d+) images', text) and base:
        text = open(osp.join(ROOT, 'configs', base[1])).read()
    m = re.search(r'(\d+) GPUs x (\d+) images', text)
    assert m, f'{_rel(path)}: header (or its softmax base) must state GPUs x images per GPU'
    gpus, per_gpu = int(m[1]), int(m[2])
    assert cfg.train_dataloader.batch_size == per_gpu
    assert cfg.auto_scale_lr.base_batch_size == gpus * per_gpu
    assert not cfg.auto_scale_lr.enable  # scaling is opt-in: tools/train.py --auto-scale-lr


@pytest.mark.parametrize('backbone', ['pvt_v2_b2', 'swin_t', 'cswin_t'])
def test_soft_set_up_backbones_run_at_odd_sizes_with_finite_gradients(backbone):
    """The SOFT set-up (global windows / stripes / no spatial reduction, landmark ratios 8/4/2, conv on v) takes any
    input size: the kernel sees whole stages, so no pad tokens and no mask reach it."""
    cfg = Config.fromfile(osp.join(ROOT, 'configs', f'cls_{backbone}_soft.py'))
    bb_cfg = cfg.model.backbone
    bb_cfg.update(out_indices=(0, 1, 2, 3), drop_path_rate=0.0)
    with MODELS.switch_scope_and_registry(cfg.default_scope) as registry:
        bb = registry.build(bb_cfg)
    torch.manual_seed(0)
    x = torch.randn(1, 3, 75, 101)
    outs = bb(x)
    assert [o.shape[-2:] for o in outs] == [torch.Size((-(-75 // s), -(-101 // s))) for s in (4, 8, 16, 32)]
    assert all(torch.isfinite(o).all() for o in outs)
    sum(o.square().mean() for o in outs).backward()
    soft_convs = [m.v_conv.weight for m in bb.modules() if hasattr(m, 'v_conv')]
    assert soft_convs and all(w.grad is not None and torch.isfinite(w.grad).all() for w in soft_convs)


# ------------------------------------------------------------------------------------------- pretrained starts
DET_SEG = [p for p in MAIN if NAME.match(osp.basename(p))['task'] in TASKS[:3]]
RELEASE_HOSTS = ('https://github.com/', 'https://dl.fbaipublicfiles.com/', 'https://cloud.tsinghua.edu.cn/',
                 'https://drive.google.com/')


def _official_start(name):
    """Set-ups whose backbone the seeds (or the softmax backbones' authors) released: they start from the release."""
    m = NAME.match(name)
    return (m['attn'] == 'softmax' or m['attn'] == 'softnorm'
            or (m['attn'] == 'inline' and m['backbone'] in ('swin_t', 'cswin_t', 'pvt_s'))
            or (m['attn'] == 'agent' and m['backbone'] in ('swin_t', 'pvt_s')))


@pytest.mark.parametrize('path', DET_SEG, ids=_rel)
def test_det_seg_backbone_starts_from_a_release_or_the_checkpoint_of_its_warm_start(path):
    """No det/seg config trains its backbone from scratch unannounced: a release URL (fetched on load, never here),
    or the work dir of the warm start's stage 2 (``configs/finetune_<backbone>_<attention>.py``: its last
    checkpoint, so no config hard-codes an iteration count), which that config's own start leads back to."""
    name = osp.basename(path)
    init = Config.fromfile(path).model.backbone.init_cfg
    assert isinstance(init, dict) and init.type == 'Pretrained' and set(init) == {'type', 'checkpoint'}, init
    if _official_start(name):
        assert init.checkpoint.startswith(RELEASE_HOSTS), init.checkpoint
    else:
        m = NAME.match(name)
        ft_name = f"finetune_{m['backbone']}_{m['attn']}"
        assert init.checkpoint == f'work_dirs/{ft_name}', init.checkpoint
        ft = Config.fromfile(osp.join(ROOT, 'configs', ft_name + '.py')).model.backbone.init_cfg
        assert ft.checkpoint == f"work_dirs/transfer_{m['backbone']}_{m['attn']}" and ft.prefix == 'backbone.'


@pytest.mark.parametrize('name', ['maskrcnn_swin_t_softmax.py', 'upernet_xcit_s12_poly3.py', 'semfpn_cswin_t_inline.py',
                                  'maskrcnn_soft_s_softnorm.py'])
def test_user_pretrained_init_cfg_merges_into_a_det_seg_config_without_delete(name, tmp_path):
    child = tmp_path / 'mine.py'
    child.write_text(f"_base_ = '{osp.join(ROOT, 'configs', name)}'\n"
                     "model = dict(backbone=dict(init_cfg=dict(type='Pretrained', checkpoint='mine.pth', "
                     "prefix='backbone.')))\n")
    init = Config.fromfile(str(child)).model.backbone.init_cfg
    assert init.to_dict() == dict(type='Pretrained', checkpoint='mine.pth', prefix='backbone.')


@pytest.mark.parametrize('name', ['cls_swin_t_softmax.py', 'cls_xcit_s12_poly3.py', 'cls_soft_s_softnorm.py'])
def test_classification_configs_train_from_scratch_and_take_a_pretrained_override(name, tmp_path):
    path = osp.join(ROOT, 'configs', name)
    assert Config.fromfile(path).model.backbone.init_cfg.to_dict() == dict(type='Scratch')
    child = tmp_path / 'mine.py'
    child.write_text(f"_base_ = '{path}'\nmodel = dict(backbone=dict(init_cfg=dict(type='Pretrained', "
                     "checkpoint='mine.pth')))\n")
    assert Config.fromfile(str(child)).model.backbone.init_cfg.to_dict() == dict(type='Pretrained',
                                                                                  checkpoint='mine.pth')


def test_demo_configs_train_their_backbones_from_scratch_on_purpose_or_from_the_demo_classifier():
    for path in DEMO:
        cfg = Config.fromfile(path)
        name = osp.basename(path)
        init = cfg.model.backbone.get('init_cfg') or {}
        if name in ('maskrcnn_xcit_s12_poly3_demo.py', 'maskrcnn_xcit_t12_poly3_demo.py',
                    'semfpn_xcit_t12_poly3_demo.py'):
            # `make demo`: the detector and the segmentor start from the demo classifier's checkpoint
            assert init.to_dict() == dict(type='Pretrained', checkpoint='work_dirs/demo/pretrain/epoch_2.pth',
                                          prefix='backbone.'), init
        elif name in ('maskrcnn_pvt_v2_b0_digits.py', 'semfpn_pvt_v2_b0_digits.py', 'semfpn_pvt_v2_b0_digits_n64.py',
                      'semfpn_pvt_v2_b0_digits_lowlr.py', 'semfpn_pvt_v2_b0_digits_long.py'):
            # the detection and segmentation study: from the study's classifier, which the study passes
            assert init.type == 'Pretrained' and init.prefix == 'backbone.', init
        elif name == 'maskrcnn_xcit_t12_poly3_warm_demo.py':  # the warm start's stage 2 at demo scale
            assert init.to_dict() == dict(type='Pretrained', checkpoint='work_dirs/finetune_xcit_t12_poly3_demo',
                                          prefix='backbone.'), init
        elif cfg.default_scope != 'mmpretrain':
            assert cfg.model.backbone.init_cfg.to_dict() == dict(type='Scratch'), path


def test_missing_warm_start_checkpoint_is_one_line_naming_both_stages_the_release_swap_and_the_opt_out():
    from softfree_mm.engine.config_checks import check_pretrained
    from softfree_mm.engine.errors import UsageError
    cfg = Config.fromfile(osp.join(ROOT, 'configs', 'maskrcnn_swin_t_poly3.py'))
    with pytest.raises(UsageError) as e:
        check_pretrained(cfg)
    msg = str(e.value)
    assert '\n' not in msg and "'work_dirs/finetune_swin_t_poly3' does not exist" in msg
    # the launch the ImageNet scale needs (1024 images a step at 128 a GPU), the cost measured for Swin-T; Swin's
    # windows are the layout the windows' default was measured on: no note
    assert ('`python tools/warm_start.py configs/maskrcnn_swin_t_poly3.py --launcher pytorch --gpus 8` runs what is '
            'missing (stage 1 configs/transfer_swin_t_poly3.py, then stage 2 configs/finetune_swin_t_poly3.py, both '
            'stages cost ') in msg, msg
    from softfree_mm.engine.layout_defaults import warm_start_cost
    assert warm_start_cost('SoftFreeSwin') in msg and 'measured)' in warm_start_cost('SoftFreeSwin')
    assert 'note:' not in msg and 'borrows' not in msg, msg
    # CSWin's stripes take the windows' default, and the line says where it was measured
    with pytest.raises(UsageError) as e:
        check_pretrained(Config.fromfile(osp.join(ROOT, 'configs', 'maskrcnn_cswin_t_poly3.py')))
    assert "note: the warm start's default recipe here, `transfer`, was measured on the study's tiny Swin with " \
           "4x4 shifted windows (windows) at the digits scale, not on SoftFreeCSWin's stripes" in str(e.value), e.value
    release = Config.fromfile(osp.join(ROOT, 'configs', 'maskrcnn_swin_t_softmax.py'))
    assert ('--cfg-options model.backbone.init_cfg.checkpoint=' + release.model.backbone.init_cfg.checkpoint) in msg
    assert 'model.backbone.init_cfg.type=Scratch' in msg
    cfg.model.backbone.init_cfg.type = 'Scratch'  # the opt-in
    check_pretrained(cfg)
    check_pretrained(release)  # URLs are fetched when the model initialises, not checked here
    # the fine-tune's own start is stage 1's checkpoint
    ft = Config.fromfile(osp.join(ROOT, 'configs', 'finetune_swin_t_poly3.py'))
    with pytest.raises(UsageError, match=r"work_dirs/transfer_swin_t_poly3' does not exist; make it with the warm start "
                                         r"\(docs/warm_start\.md\): `python tools/warm_start\.py "
                                         r"configs/finetune_swin_t_poly3\.py --launcher pytorch --gpus 8` runs what is "
                                         r"missing \(stage 1 configs/transfer_swin_t_poly3\.py\)"):
        check_pretrained(ft)


RELEASED = {'swin_t_inline', 'cswin_t_inline', 'swin_t_agent'}  # InLine-Swin-T / InLine-CSWin-T / Agent-Swin-T: their own releases


@pytest.mark.parametrize('path', [p for p in MAIN if NAME.match(osp.basename(p))['task'] in TASKS[:3]], ids=_rel)
def test_the_warm_start_stages_of_each_det_and_seg_config_build_its_kernel_from_a_softmax_release(path):
    """The softmax configs declare their release (softmax_release, the start they load); every other kernel's
    config on the four backbones starts from its warm start's stage 2, whose configs exist: stage 1 a teacher with
    softmax from a release and the student of the kernel's classifier, stage 2 that classifier from stage 1's last
    checkpoint."""
    m = NAME.match(osp.basename(path))
    cfg = Config.fromfile(path)
    start = cfg.model.backbone.init_cfg.get('checkpoint')
    if m['backbone'] not in BACKBONES or f'{m["backbone"]}_{m["attn"]}' in RELEASED:
        return
    if m['attn'] == 'softmax':
        assert start == cfg.softmax_release and start.startswith('https://')
        return
    name = f'{m["backbone"]}_{m["attn"]}'
    assert start == f'work_dirs/finetune_{name}'
    stage1 = Config.fromfile(osp.join(ROOT, 'configs', f'transfer_{name}.py'))
    stage2 = Config.fromfile(osp.join(ROOT, 'configs', f'finetune_{name}.py'))
    cls = Config.fromfile(osp.join(ROOT, 'configs', f'cls_{name}.py'))
    assert stage1.model.type == 'AttentionTransfer' and stage1.model.teacher.attn_cfg == dict(type='softmax')
    assert stage1.model.teacher.init_cfg.checkpoint.startswith('https://')
    for key in ('attn_cfg', 'sr_ratios', 'global_window', 'arch'):  # the student is the kernel's classifier's
        assert stage1.model.backbone.get(key) == cls.model.backbone.get(key) == cfg.model.backbone.get(key) or \
            key == 'arch' or stage1.model.backbone.get(key) == cls.model.backbone.get(key), key
    assert stage2.model.backbone.init_cfg.to_dict() == dict(
        type='Pretrained', checkpoint=f'work_dirs/transfer_{name}', prefix='backbone.')
    # stage 2's head: the release's classifier, the release stage 1's teacher reads
    assert stage2.model.head.init_cfg.to_dict() == dict(type='ReleaseHead',
                                                        checkpoint=stage1.model.teacher.init_cfg.checkpoint)
    # each layout's default recipe (every class: transfer)
    recipe = default_recipe(cfg.model.backbone.to_dict())
    assert stage1.warm_start == stage2.warm_start == dict(recipe=recipe, scale='imagenet')
