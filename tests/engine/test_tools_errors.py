"""tools/train.py and tools/test.py turn user mistakes into one line on stderr and exit status 2.

Guards: a config file that does not exist, a misspelt kernel or kernel argument (also through --cfg-options), a
misspelt backbone type, a missing data root, a missing checkpoint, and the CPU settings chosen without CUDA.
All run the real tools in this process (their ``main(argv)``): the first ones stop before any model is built;
the later ones build and run a tiny classifier (written here, on the session's shared demo data): misspelt types
anywhere in the config, settings the Runner refuses while it builds its parts inside train() / test(), missing
image folders, --launcher without its environment, --cfg-options that cannot be merged, --show-dir drawing every
image. The 2-process runs (torchrun, clean teardown) are in test_tools_dist.py.
"""
import glob
import os.path as osp

import pytest
import torch

from tests.helpers import ROOT, load_tool
from tests.helpers.demo import shared_demo_root

DET = osp.join(ROOT, 'configs', 'maskrcnn_xcit_s12_poly3.py')
SEG = osp.join(ROOT, 'configs', 'upernet_swin_t_softmax.py')
CLS = osp.join(ROOT, 'configs', 'cls_swin_t_softmax.py')


@pytest.fixture(scope='module')
def train_tool():
    return load_tool('train')


@pytest.fixture(scope='module')
def test_tool():
    return load_tool('test')


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


# a near miss of a kernel's name (the type check would suggest the name) and a name like none (nothing to suggest)
@pytest.mark.parametrize('kernel', ['polly', 'qqzx'])
def test_unknown_kernel_in_cfg_options_is_one_line_listing_valid_kernels(train_tool, test_tool, capsys, tmp_path,
                                                                         kernel):
    from softfree_mm.attention import list_attentions
    expect = (f"error: model.backbone.attn_cfg: unknown attention type {kernel!r}; valid types: "
              f"{', '.join(list_attentions())}")
    assert train_tool.main([DET, '--cfg-options', f'model.backbone.attn_cfg.type={kernel}']) == 2
    assert _one_line_error(capsys) == expect
    ckpt = tmp_path / 'model.pth'
    ckpt.write_bytes(b'')  # tools/test.py checks the config before it reads the checkpoint
    assert test_tool.main([DET, str(ckpt), '--cfg-options', f'model.backbone.attn_cfg.type={kernel}']) == 2
    assert _one_line_error(capsys) == expect


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
    from softfree_mm.engine import config_checks, device, errors
    cfg = config_checks.load_config(DET)
    assert cfg.model.backbone.norm_cfg.type == 'SyncBN'
    notes = device.apply_device_settings(cfg, 'pytorch')
    assert cfg.env_cfg.dist_cfg.backend == 'gloo'
    assert cfg.model_wrapper_cfg == dict(type='MMDistributedDataParallel', device_ids=None)
    assert cfg.model.backbone.norm_cfg.type == 'BN'
    assert len(notes) == 3
    with pytest.raises(errors.UsageError, match='--amp needs CUDA'):
        device.enable_amp(cfg)


def test_auto_scale_lr_flag_enables_the_configs_scaling():
    from softfree_mm.engine import config_checks, errors, runner
    cfg = config_checks.load_config(SEG)
    assert cfg.auto_scale_lr == dict(enable=False, base_batch_size=16)
    runner.enable_auto_scale_lr(cfg)
    assert cfg.auto_scale_lr.enable
    cfg.auto_scale_lr = None
    with pytest.raises(errors.UsageError, match='no auto_scale_lr'):
        runner.enable_auto_scale_lr(cfg)


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


# ------------------------------------------------------------------------------------------- the tools at work
# The real tools (their main(), in this process: each run in a subprocess would cost an import of the whole mm stack)
# on a tiny classifier: what fails while the Runner builds and runs, missing image folders, --launcher without its
# environment, --cfg-options that cannot merge, --show-dir. A 2-process run (torchrun) is in test_tools_dist.py.
DEMO_CLS = osp.join(ROOT, 'configs', 'demo', 'cls_xcit_s12_poly3_demo.py')
DIST_ENV = ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'MASTER_ADDR', 'MASTER_PORT', 'SLURM_PROCID', 'SLURM_NTASKS',
            'SLURM_NODELIST', 'OMPI_COMM_WORLD_RANK', 'OMPI_COMM_WORLD_LOCAL_RANK', 'OMPI_COMM_WORLD_SIZE',
            'SOFTFREE_MM_TRACEBACK')


@pytest.fixture(scope='module')
def tiny(tmp_path_factory):
    """A 1-block classifier on 4 demo images (the session's shared demo data, written on demand by the first run)
    and a checkpoint with no weights (loading it only warns)."""
    folder = tmp_path_factory.mktemp('tiny_cls')
    root = shared_demo_root(tmp_path_factory)
    cfg = folder / 'cls_tiny.py'
    cfg.write_text(f"""_base_ = {DEMO_CLS!r}
data_root = {root!r}
model = dict(backbone=dict(embed_dims=32, depth=1, num_heads=4, cls_attn_layers=1), head=dict(in_channels=32))
train_dataloader = dict(batch_size=4, dataset=dict(data_root=data_root, indices=4))
val_dataloader = dict(batch_size=4, dataset=dict(data_root=data_root, indices=4))
test_dataloader = val_dataloader
train_cfg = dict(max_epochs=1, val_interval=1)
""")
    ckpt = folder / 'empty.pth'
    torch.save({'state_dict': {}, 'meta': {}}, str(ckpt))
    return dict(cfg=str(cfg), ckpt=str(ckpt), folder=folder)


@pytest.fixture
def run_tool(train_tool, test_tool, capsys, monkeypatch):
    """run_tool('train' | 'test', *args) -> (exit status, stdout, stderr) of the tool's main(), outside any
    launcher's environment."""
    for k in DIST_ENV:
        monkeypatch.delenv(k, raising=False)
    capsys.readouterr()

    def run(tool, *args):
        rc = {'train': train_tool, 'test': test_tool}[tool].main(list(args))
        out = capsys.readouterr()
        return rc, out.out, out.err

    return run


def _error(result):
    """The one ``error:`` line of a run that exited 2 (an exception escaping main() fails the test by itself)."""
    rc, _, err = result
    assert rc == 2, err[-3000:]
    lines = [line for line in err.splitlines() if line.startswith('error: ')]
    assert len(lines) == 1, err[-3000:]
    return lines[0]


def test_misspelt_types_outside_the_model_are_one_line_with_a_suggestion(tiny, run_tool):
    line = _error(run_tool('train', tiny['cfg'], '--work-dir', str(tiny['folder'] / 'w1'),
                           '--cfg-options', 'train_dataloader.dataset.type=ImageNett'))
    assert "train_dataloader.dataset.type='ImageNett'" in line and 'ImageNet' in line and 'mmpretrain' in line
    line = _error(run_tool('test', tiny['cfg'], tiny['ckpt'], '--work-dir', str(tiny['folder'] / 'w1'),
                           '--cfg-options', 'test_dataloader.dataset.pipeline.0.type=LoadImageFromFil'))
    assert "test_dataloader.dataset.pipeline[0].type='LoadImageFromFil'" in line and 'LoadImageFromFile' in line


def test_type_check_passes_the_configs_and_names_without_a_close_match():
    from softfree_mm.engine import config_checks, errors
    for path in (DET, SEG, CLS, *sorted(glob.glob(osp.join(ROOT, 'configs', 'demo', '*.py')))):
        # the Mask R-CNN configs hold roi_layer type 'RoIAlign' (mmcv)
        config_checks.check_types(config_checks.load_config(path))
    cfg = config_checks.load_config(CLS)
    cfg.optim_wrapper.optimizer.type = 'AdamWW'
    with pytest.raises(errors.UsageError, match=r"optim_wrapper.optimizer.type='AdamWW'.*AdamW"):
        config_checks.check_types(cfg)
    cfg.optim_wrapper.optimizer.type = 'SomethingElseEntirely'  # no close registered name: left to the Runner
    config_checks.check_types(cfg)
    cfg.optim_wrapper.optimizer.type = 'mmpretrain.AdamW'  # scope-qualified registered names pass
    config_checks.check_types(cfg)


def test_errors_while_the_runner_builds_its_parts_are_one_line(tiny, run_tool):
    # no close registered name, so the pre-build check lets it through; mmengine then fails in build_optim_wrapper
    line = _error(run_tool('train', tiny['cfg'], '--work-dir', str(tiny['folder'] / 'w2'),
                           '--cfg-options', 'optim_wrapper.optimizer.type=NoSuchOptimizer'))
    assert line.startswith(f"error: {tiny['cfg']}: TypeError")
    assert "optim_wrapper.optimizer.type='NoSuchOptimizer'" in line
    line = _error(run_tool('test', tiny['cfg'], tiny['ckpt'], '--work-dir', str(tiny['folder'] / 'w2'),
                           '--cfg-options', 'test_evaluator.type=NoSuchMetric'))
    assert line.startswith(f"error: {tiny['cfg']}: KeyError") and 'NoSuchMetric' in line


def test_only_errors_before_the_run_starts_are_config_errors():
    from softfree_mm.engine import errors, runner

    class FakeRunner:
        def __init__(self, start):
            self.hooks, self.start = [], start

        def register_hook(self, hook, priority):
            self.hooks.append(hook)

        def train(self):
            if self.start:
                for hook in self.hooks:
                    hook.before_run(self)
            raise RuntimeError('boom')

    with pytest.raises(errors.UsageError, match='cfg.py: RuntimeError: boom'):
        runner.run(FakeRunner(start=False), 'train', 'cfg.py')
    with pytest.raises(RuntimeError, match='boom'):
        runner.run(FakeRunner(start=True), 'train', 'cfg.py')


def test_missing_image_folder_under_an_existing_data_root_is_one_line(tmp_path, run_tool):
    seg_demo = osp.join(ROOT, 'configs', 'demo', 'upernet_swin_t_poly3_demo.py')
    line = _error(run_tool('train', seg_demo, '--work-dir', str(tmp_path / 'w'), '--cfg-options',
                           f'train_dataloader.dataset.data_root={tmp_path}'))
    assert f"train_dataloader.dataset.data_prefix.img_path: {tmp_path / 'images' / 'training'} does not exist" in line


def test_data_prefix_check_skips_empty_absolute_and_remote_prefixes(tmp_path):
    from softfree_mm.engine import config_checks, errors
    cfg = config_checks.load_config(DEMO_CLS)
    ds = cfg.train_dataloader.dataset
    ds.update(data_root=str(tmp_path), ann_file='', data_prefix='train')
    with pytest.raises(errors.UsageError, match=r'train_dataloader.dataset.data_prefix: .*train does not exist'):
        config_checks.check_data(cfg, ('train', ))
    for prefix in ('', dict(img_path=''), str(tmp_path)):
        ds.data_prefix = prefix
        config_checks.check_data(cfg, ('train', ))
    ds.update(data_prefix='train', backend_args=dict(backend='petrel'))
    config_checks.check_data(cfg, ('train', ))


def test_launcher_without_its_environment_is_one_line_naming_the_variables(tiny, run_tool):
    line = _error(run_tool('train', tiny['cfg'], '--launcher', 'pytorch'))
    assert 'RANK' in line and 'WORLD_SIZE' in line and 'tools/dist_train.sh' in line and 'KeyError' not in line
    line = _error(run_tool('test', tiny['cfg'], tiny['ckpt'], '--launcher', 'slurm'))
    assert 'SLURM_PROCID' in line and 'tools/slurm_test.sh' in line


def test_cfg_options_that_cannot_merge_name_the_option_not_the_config(run_tool):
    soft = osp.join(ROOT, 'configs', 'cls_swin_t_soft.py')  # attn_cfg is a list, one per stage
    line = _error(run_tool('train', soft, '--cfg-options', 'model.backbone.attn_cfg.type=efficient'))
    assert '--cfg-options could not be applied' in line and 'cannot read config' not in line
    assert 'model.backbone.attn_cfg.type' in line and 'is a list' in line and 'model.backbone.attn_cfg.0.type' in line


def test_show_dir_draws_every_image_also_without_a_visualization_hook(tiny, test_tool, run_tool):
    for n, opts in enumerate(([], ['default_hooks.visualization=None'])):
        show = tiny['folder'] / f'show{n}'
        rc, out, err = run_tool('test', tiny['cfg'], tiny['ckpt'], '--work-dir', str(tiny['folder'] / 'w3'),
                                '--show-dir', str(show), '--cfg-options', f'visualizer.name=vis_show{n}', *opts)
        assert rc == 0, err[-3000:]
        assert 'metrics: ' in out
        assert len(glob.glob(str(show / '*.png'))) == 4  # the 4 test images, not 1 in 5000
    from softfree_mm.engine import config_checks
    for path, kind in ((DET, 'DetVisualizationHook'), (SEG, 'SegVisualizationHook')):
        cfg = config_checks.load_config(path)
        cfg.default_hooks.visualization = None
        test_tool._set_visualization(cfg, str(tiny['folder'] / 'show'))
        assert cfg.default_hooks.visualization.type == kind and cfg.default_hooks.visualization.draw
