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


# ---------------------------------------------------------------------------------------------- the rule, by hand
def _seg(layout, kernel, start, values, maccs=None):
    maccs = maccs or [50.0] * len(values)
    return [dict(layout=layout, task='seg', kernel=kernel, start=start, recipe=ts.recipe_of(layout, start), seed=s,
                 cls_top1=70.0, status='ok', error='', mIoU=v, mAcc=a) for s, (v, a) in enumerate(zip(values, maccs))]


FLOOR = 9.0  # an mAcc below the floor (one class of eleven)


def _lines(rows):
    from softfree_mm.analysis import collapse_arms as ca
    from softfree_mm.analysis import task_study_report as tsr
    return ca.lines(tsr.summarise(rows), tsr.floor_seeds, {})


BASE = (_seg('pvt', 'softmax', 'scratch', [56.0, 56.0, 65.0, 61.0, 55.0])
        + _seg('pvt', 'poly:degree=3', 'transfer', [12.0, 8.3, 8.3, 18.0, 8.3], [16, FLOOR, FLOOR, 27, FLOOR]))


def test_the_rule_rescues_only_with_a_control_that_trains_and_no_seed_at_the_floor():
    # the control: the arm's softmax minus the baseline's is -1, 0, +1, -1, 0 (holds zero): trains; x^3 at the
    # floor in none, x^3 minus the arm's softmax -2, -1, 0, +3, -1 (holds zero): rescues
    soft = [55.0, 56.0, 66.0, 60.0, 55.0]
    rows = BASE + _seg('pvt_lowlr', 'softmax', 'scratch', soft) + _seg(
        'pvt_lowlr', 'poly:degree=3', 'transfer', [53.0, 55.0, 66.0, 63.0, 54.0])
    (line, ) = _lines(rows)
    assert line.startswith('pvt_lowlr (pvt_lowlr), x^3 from transfer: the arm\'s softmax minus the baseline\'s -0.2 ')
    assert '(trains)' in line and 'x^3 at the floor in 0 of 5 (baseline from transfer: 3)' in line
    assert line.endswith(': rescues')


def test_a_control_that_does_not_train_leaves_the_arm_inconclusive_whatever_x3_does():
    soft = [40.0, 41.0, 50.0, 44.0, 39.0]  # 16 points below the baseline in every seed
    rows = BASE + _seg('pvt_long', 'softmax', 'scratch', soft) + _seg(
        'pvt_long', 'poly:degree=3', 'transfer', [8.3] * 5, [FLOOR] * 5)
    (line, ) = _lines(rows)
    assert '(does not train)' in line and line.endswith(': inconclusive')


def test_as_many_seeds_at_the_floor_as_the_baseline_does_not_rescue_fewer_is_inconclusive():
    soft = [55.0, 57.0, 64.0, 62.0, 55.0]
    arm = _seg('pvt_fixn', 'softmax', 'scratch', soft)
    three = _seg('pvt_fixn', 'poly:degree=3', 'transfer', [8.3, 8.3, 8.3, 40.0, 45.0], [FLOOR] * 3 + [50, 50])
    (line, ) = _lines(BASE + arm + three)
    assert 'x^3 at the floor in 3 of 5 (baseline from transfer: 3)' in line and line.endswith(': does not rescue')
    # one seed at the floor, the others equal to softmax: the interval holds zero, but a seed at the floor is no rescue
    one = _seg('pvt_fixn', 'poly:degree=3', 'transfer', [8.3, 57.0, 64.0, 62.0, 55.0], [FLOOR] + [50] * 4)
    (line, ) = _lines(BASE + arm + one)
    assert 'minus the arm\'s softmax -9.3 [-35.3, +16.6]' in line
    assert 'floor in 1 of 5' in line and line.endswith(': inconclusive')


def test_fewer_than_five_seeds_give_no_verdict():
    rows = BASE + _seg('pvt_lowlr', 'softmax', 'scratch', [55.0, 56.0, 66.0]) + _seg(
        'pvt_lowlr', 'poly:degree=3', 'transfer', [53.0, 55.0, 66.0])
    (line, ) = _lines(rows)
    assert line.endswith('no verdict yet: the rule is stated for 5 seeds, 3 finished')


def test_one_seed_does_not_judge_the_control():
    """One seed gives no interval: the control is neither said to train nor not to (it was 'does not train')."""
    rows = BASE + _seg('pvt_fixn', 'softmax', 'scratch', [60.0]) + _seg('pvt_fixn', 'poly:degree=3', 'transfer', [8.4])
    (line, ) = _lines(rows)
    assert '(not judged: one seed gives no interval)' in line and 'does not train' not in line
    assert line.endswith('no verdict yet: the rule is stated for 5 seeds, 1 finished')
