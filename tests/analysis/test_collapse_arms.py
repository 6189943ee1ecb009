"""The collapse's three arms (docs/study.md, "The collapse's arms with controls that train"; layouts pvt_lowlr,
pvt_fixn, pvt_long of softfree_mm/analysis/task_study.py): each arm's segmentor is what the stated test says.

Guards: arm 1's optimiser gives every backbone parameter a tenth of the lr (and nothing else) and clips at 5; arm 2's
x^3 computes c = 1/sqrt(the classifier's N) per stage at the segmentor's larger token counts (checked against the
formula at N = 1024, not only read off the config), softmax and a poly kernel with a fixed c untouched; arm 3's
schedule ends at 6000; each arm starts from pvt's classifiers (none of its own) and passes the study's kernel.
"""
import os.path as osp

import pytest
import torch
from mmengine.config import Config
from mmengine.registry import DefaultScope

from softfree_mm.analysis import task_study as ts
from softfree_mm.analysis.warm_start import Runner
from softfree_mm.registry import MODELS

from tests.helpers import ROOT
from tests.analysis.test_analysis_task_study import FAKE_TOOL, _finished

ARMS = ('pvt_lowlr', 'pvt_fixn', 'pvt_long')


def _segmentor_config(tmp_path, layout, kernel):
    """The child config the study writes for ``layout``'s segmentor of ``kernel`` from pvt's seed-0 classifiers (the
    fake tool fails the run; the config stays)."""
    tools, runs, log = tmp_path / 'tools', str(tmp_path / 'runs'), str(tmp_path / 'calls.log')
    tools.mkdir(exist_ok=True)
    for name in ('train.py', 'test.py'):
        (tools / name).write_text(FAKE_TOOL.replace("sys.argv[:2]", "sys.argv").format(log=log))
    _finished(runs, 'scratch/pvt/softmax/seed0', checkpoint='softmax.pth', top1_final=70.0)
    _finished(runs, 'scratch/pvt/poly_degree=3/seed0', checkpoint='x3.pth', top1_final=60.0)
    runner = Runner(runs, str(tools), jobs=1, echo=lambda m: None)
    rows = ts.Study(runner, ROOT, [0], [layout], ['seg'], [kernel], starts=['scratch'], echo=lambda m: None).run()
    assert {r['status'] for r in rows} == {'failed'}  # the fake tool; no classifier retrained
    from softfree_mm.analysis.sweep import safe_name
    calls = [c for c in open(log).read().splitlines() if f'/seg/{layout}/{safe_name(kernel)}/' in c]
    assert len(calls) == 1 and 'init_cfg.checkpoint=' in calls[0]
    return Config.fromfile(calls[0].split()[1])


@pytest.mark.parametrize('layout', ARMS)
def test_each_arm_starts_from_pvts_classifiers_and_has_only_segmentors(layout):
    lay = ts.LAYOUTS[layout]
    assert lay.classifiers == 'pvt' and lay.tasks == ('seg', ) and lay.kernels == ['softmax', 'poly:degree=3']
    assert ts.recipe_of(layout, 'transfer') == ts.recipe_of('pvt', 'transfer')  # the same warm starts as pvt's rows


def test_arm1_backbone_at_a_tenth_of_the_lr_and_gradients_clipped_at_5(tmp_path):
    from mmengine.optim import build_optim_wrapper
    cfg = _segmentor_config(tmp_path, 'pvt_lowlr', 'softmax')
    cfg.model.backbone.init_cfg = None
    import mmseg.models  # noqa: F401  (registers the segmentor)
    from mmseg.registry import MODELS as SEG_MODELS
    with DefaultScope.overwrite_default_scope('mmseg'):
        model = SEG_MODELS.build(cfg.model)
        wrapper = build_optim_wrapper(model, cfg.optim_wrapper)
    assert wrapper.clip_grad_kwargs == dict(max_norm=5.0, norm_type=2)
    lr_of = {id(p): g['lr'] for g in wrapper.optimizer.param_groups for p in g['params']}
    named = list(model.named_parameters())
    assert len(lr_of) == len(named)
    backbone = {n for n, _ in named if n.startswith('backbone.')}
    assert backbone and len(backbone) < len(named)
    for n, p in named:
        assert lr_of[id(p)] == pytest.approx(1e-4 if n in backbone else 1e-3), n


def _stage_kernels(cfg):
    cfg.model.backbone.init_cfg = None
    with DefaultScope.overwrite_default_scope('softfree_mm'):
        backbone = MODELS.build(cfg.model.backbone.to_dict())
    return [stage.blocks[0].attn.kernel for stage in backbone.stages]


def test_arm2_x3_normaliser_is_the_classifiers_token_count_per_stage(tmp_path):
    cfg = _segmentor_config(tmp_path, 'pvt_fixn', 'poly:degree=3')
    kernels = _stage_kernels(cfg)
    assert [k.scale for k in kernels] == pytest.approx([256 ** -0.5, 64 ** -0.5, 16 ** -0.5, 4 ** -0.5])
    # at the segmentor's stage-1 count (1024 keys) the kernel computes c = 1/16, not 1/32
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 1, 1024, 32) for _ in range(3))
    s = 32 ** -0.5
    want = ((q @ k.transpose(-1, -2)) * s).pow(3) / 16 @ v
    got = kernels[0](q, k, v, scale=s)
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(got, want / 2, rtol=1e-4, atol=1e-4)


def test_arm2_leaves_softmax_and_a_fixed_poly_constant_alone():
    lay = ts.LAYOUTS['pvt_fixn']
    assert lay.task_attn('softmax') == dict(type='softmax')
    assert lay.task_attn('poly:degree=3,scale=0.5') == dict(type='poly', degree=3, scale=0.5)
    assert ts.LAYOUTS['pvt'].task_attn('poly:degree=3') == dict(type='poly', degree=3)


def test_arm3_schedule_twice_as_long(tmp_path):
    cfg = _segmentor_config(tmp_path, 'pvt_long', 'softmax')
    base = Config.fromfile(osp.join(ROOT, 'configs/demo/semfpn_pvt_v2_b0_digits.py'))
    assert cfg.train_cfg.max_iters == 2 * base.train_cfg.max_iters == 6000
    assert [s['end'] for s in cfg.param_scheduler] == [30, 6000]
    assert cfg.default_hooks.checkpoint.interval == 6000
    assert cfg.optim_wrapper == base.optim_wrapper and cfg.train_dataloader == base.train_dataloader
