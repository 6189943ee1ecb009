"""tools/train.py and tools/test.py turn user mistakes into one line on stderr and exit status 2.

Guards: a config file that does not exist, a misspelt kernel or kernel argument (also through --cfg-options), a
misspelt backbone type, a missing data root, a missing checkpoint, and the CPU settings chosen without CUDA.
The tools run in-process (their ``main(argv)``) so that no model is built and no training starts.
"""
import importlib.util
import os.path as osp
import sys

import pytest
import torch

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
sys.path.insert(0, ROOT)
DET = osp.join(ROOT, 'configs', 'maskrcnn_xcit_s12_poly3.py')
SEG = osp.join(ROOT, 'configs', 'upernet_swin_t_softmax.py')
CLS = osp.join(ROOT, 'configs', 'cls_swin_t_softmax.py')


def _load_tool(name):
    sys.path.insert(0, osp.join(ROOT, 'tools'))
    spec = importlib.util.spec_from_file_location(f'softfree_tool_{name}', osp.join(ROOT, 'tools', f'{name}.py'))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope='module')
def train_tool():
    return _load_tool('train')


@pytest.fixture(scope='module')
def test_tool():
    return _load_tool('test')


def _one_line_error(capsys):
    err = capsys.readouterr().err.strip().splitlines()
    err = [line for line in err if not line.startswith('[softfree_mm]')]
    assert len(err) == 1, f'expected one error line, got: {err}'
    assert err[0].startswith('error: ')
    return err[0]


def test_missing_config_file_is_one_line_naming_the_file(train_tool, capsys, tmp_path):
    missing = str(tmp_path / 'maskrcnn_xcit_s12_poly33.py')
    assert train_tool.main([missing]) == 2
    line = _one_line_error(capsys)
    assert 'config file not found' in line and missing in line


def test_unknown_kernel_in_cfg_options_is_one_line_listing_valid_kernels(train_tool, capsys):
    assert train_tool.main([DET, '--cfg-options', 'model.backbone.attn_cfg.type=polly']) == 2
    line = _one_line_error(capsys)
    assert "'polly'" in line and 'model.backbone.attn_cfg' in line and 'softmax' in line and 'poly' in line


def test_bad_kernel_argument_in_per_stage_list_names_the_stage(train_tool, capsys):
    assert train_tool.main([SEG, '--cfg-options', "model.backbone.attn_cfg=[softmax,softmax,softmax,inlin]"]) == 2
    line = _one_line_error(capsys)
    assert 'model.backbone.attn_cfg[3]' in line and "'inlin'" in line


def test_unknown_kernel_argument_is_one_line_listing_valid_arguments(train_tool, capsys):
    assert train_tool.main([DET, '--cfg-options', 'model.backbone.attn_cfg.degre=3']) == 2
    line = _one_line_error(capsys)
    assert 'degre' in line and 'degree' in line


def test_misspelt_backbone_type_suggests_the_registered_name(train_tool, capsys):
    assert train_tool.main([CLS, '--cfg-options', 'model.backbone.type=SoftFreeSwim']) == 2
    line = _one_line_error(capsys)
    assert "'SoftFreeSwim'" in line and 'SoftFreeSwin' in line and 'mmpretrain' in line


def test_missing_data_root_is_one_line_naming_the_path(train_tool, capsys, tmp_path):
    root = str(tmp_path / 'no_coco') + '/'
    assert train_tool.main([DET, '--cfg-options', f'train_dataloader.dataset.data_root={root}']) == 2
    line = _one_line_error(capsys)
    assert 'train_dataloader.dataset.data_root' in line and root in line and 'README' in line


def test_missing_resume_checkpoint_and_test_checkpoint_are_one_line(train_tool, test_tool, capsys, tmp_path):
    ckpt = str(tmp_path / 'iter_5.pth')
    demo_cfg = osp.join(ROOT, 'configs', 'demo', 'cls_xcit_s12_poly3_demo.py')
    assert train_tool.main([demo_cfg, '--resume', ckpt, '--cfg-options',
                            f'train_dataloader.dataset.data_root={tmp_path}',
                            f'val_dataloader.dataset.data_root={tmp_path}']) == 2
    assert ckpt in _one_line_error(capsys)
    assert test_tool.main([DET, ckpt]) == 2
    line = _one_line_error(capsys)
    assert 'checkpoint not found' in line and ckpt in line


def test_config_with_a_syntax_error_is_one_line(train_tool, capsys, tmp_path):
    bad = tmp_path / 'bad.py'
    bad.write_text("_base_ = '" + DET + "'\nmodel = dict(backbone=dict(attn_cfg='poly'\n")
    assert train_tool.main([str(bad)]) == 2
    line = _one_line_error(capsys)
    assert 'cannot read config' in line and str(bad) in line


@pytest.mark.skipif(torch.cuda.is_available(), reason='the CPU settings apply only without CUDA')
def test_cpu_settings_gloo_ddp_without_device_ids_and_bn_for_syncbn():
    from softfree_mm.engine import launch
    cfg = launch.load_config(DET)
    assert cfg.model.backbone.norm_cfg.type == 'SyncBN'
    notes = launch.apply_device_settings(cfg, 'pytorch')
    assert cfg.env_cfg.dist_cfg.backend == 'gloo'
    assert cfg.model_wrapper_cfg == dict(type='MMDistributedDataParallel', device_ids=None)
    assert cfg.model.backbone.norm_cfg.type == 'BN'
    assert len(notes) == 3
    with pytest.raises(launch.UsageError, match='--amp needs CUDA'):
        launch.enable_amp(cfg)


def test_auto_scale_lr_flag_enables_the_configs_scaling():
    from softfree_mm.engine import launch
    cfg = launch.load_config(SEG)
    assert cfg.auto_scale_lr == dict(enable=False, base_batch_size=16)
    launch.enable_auto_scale_lr(cfg)
    assert cfg.auto_scale_lr.enable
    cfg.auto_scale_lr = None
    with pytest.raises(launch.UsageError, match='no auto_scale_lr'):
        launch.enable_auto_scale_lr(cfg)


def test_kernel_the_backbone_refuses_is_one_line_naming_backbone_and_kernel(train_tool, capsys, tmp_path):
    # XCiT's cross-covariance attention has no token grid: InLine (needs_hw) is refused when the model is built
    demo_cfg = osp.join(ROOT, 'configs', 'demo', 'cls_xcit_s12_poly3_demo.py')
    root = str(tmp_path / 'data' / 'demo' / 'imagenet')
    rc = train_tool.main([demo_cfg, '--work-dir', str(tmp_path / 'work'), '--cfg-options',
                          'model.backbone.attn_cfg=inline', 'model.backbone.depth=1',
                          f'train_dataloader.dataset.data_root={root}', f'val_dataloader.dataset.data_root={root}'])
    assert rc == 2
    line = _one_line_error(capsys)
    assert 'XCiT' in line and 'inline' in line
