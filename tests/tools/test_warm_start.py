"""The warm start through tools/train.py, on the demo digits at a tiny XCiT width: stage 1 (AttentionTransfer from a
softmax "release", random weights saved as releases are), its resume, stage 2 (the classifier fine-tuned from it),
both checkpoints into the matching Mask R-CNN, and the bad inputs.

Guards: stage 1 trains only what it declares (every other student weight is bit-identical to the teacher's after the
run) and saves no teacher; a run stopped half-way and resumed ends with exactly the weights of the uninterrupted
run; the stage-1 and stage-2 checkpoints place every backbone weight of the demo detector (nothing missing but the
stride-fixing adapter, new to a detector by design); a teacher file of another architecture, a kernel the layout
does not take and a student of another width are one line and exit status 2 before any iteration.
"""
import os
import os.path as osp
import subprocess
import sys

import pytest
import torch

from softfree_mm.analysis import warm_start as ws

from tests.helpers import ROOT
from tests.helpers.demo import shared_demo_root
from tests.helpers.models import build_in

STUDY = osp.join(ROOT, 'configs', 'demo', 'study_xcit_t12_digits.py')


def _tiny_base(tmp_path, demo_root, width=32):
    """The kernel study's XCiT classifier at a tiny width, on the shared demo data."""
    path = tmp_path / f'tiny_base_{width}.py'
    path.write_text(f"_base_ = {STUDY!r}\n"
                    f"model = dict(backbone=dict(embed_dims={width}, depth=4, num_heads=4, cls_attn_layers=1),\n"
                    f"             head=dict(in_channels={width}))\n"
                    "custom_hooks = []\n"
                    f"train_dataloader = dict(batch_size=4, num_workers=0, persistent_workers=False,\n"
                    f"                        dataset=dict(data_root={demo_root!r}, indices=32))\n"
                    f"val_dataloader = dict(batch_size=8, num_workers=0, persistent_workers=False,\n"
                    f"                      dataset=dict(data_root={demo_root!r}, indices=8))\n"
                    "test_dataloader = val_dataloader\n")
    return str(path)


def _release(tmp_path, depth=4, width=32):
    """A softmax XCiT of the tiny width with random weights, saved as a release file."""
    torch.manual_seed(0)
    model = build_in('softfree_mm', dict(type='SoftFreeXCiT', arch='t12', embed_dims=width, depth=depth, num_heads=4,
                              cls_attn_layers=1, out_type='cls_token', attn_cfg='softmax'))
    path = str(tmp_path / f'release_d{depth}_w{width}.pth')
    head = torch.nn.Linear(width, 10)  # its classifier, in the official layout ('head.*')
    torch.save({'model': {**model.state_dict(), 'head.weight': head.weight.detach(), 'head.bias': head.bias.detach()}},
               path)
    return path


def _train(config, work_dir, *options, tmp_path):
    cmd = [sys.executable, osp.join(ROOT, 'tools', 'train.py'), config, '--work-dir', str(work_dir)]
    if options:
        cmd += ['--cfg-options', *options]
    env = dict(os.environ, OMP_NUM_THREADS='1')
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=str(tmp_path))


def _stage1(tmp_path, base, release, kernel=None, iters=4):
    path = tmp_path / f'stage1_{iters}.py'
    # a warm start of 3 x iters: the recipe gives stage 1 a third
    path.write_text(ws.transfer_config(base, kernel or dict(type='poly', degree=3), 3 * iters, release, prefix=None))
    return str(path)


def _state(work_dir):
    with open(osp.join(work_dir, 'last_checkpoint')) as f:
        path = f.read().strip()
    return path, torch.load(path, map_location='cpu', weights_only=False)['state_dict']


@pytest.fixture(scope='module')
def demo_root(tmp_path_factory):
    return shared_demo_root(tmp_path_factory)


def test_stage1_trains_what_it_declares_resumes_exactly_and_both_stages_start_the_detector(tmp_path, demo_root):
    base = _tiny_base(tmp_path, demo_root)
    release = _release(tmp_path)
    config = _stage1(tmp_path, base, release)
    full = _train(config, tmp_path / 'full', 'randomness.seed=0', 'default_hooks.logger.interval=1', tmp_path=tmp_path)
    assert full.returncode == 0, full.stderr[-3000:]
    ckpt, state = _state(tmp_path / 'full')
    assert ckpt.endswith('iter_4.pth')
    assert state and all(k.startswith('backbone.') for k in state)  # the student, no teacher
    teacher = torch.load(release, map_location='cpu', weights_only=False)['model']
    moved = {k[len('backbone.'):] for k, v in state.items() if not torch.equal(v, teacher[k[len('backbone.'):]])}
    trained = {n for n in moved if '.attn.qkv.' in n or n.endswith('.attn.temperature')}
    assert moved and moved == trained, sorted(moved - trained)  # frozen weights: the teacher's, bit for bit
    assert 'block_00' in full.stdout and 'loss_transfer' in full.stdout  # each block's loss is logged

    # stopped after 2 iterations, resumed: the same weights at the end
    half = _train(config, tmp_path / 'resumed', 'randomness.seed=0', 'train_cfg.max_iters=2', tmp_path=tmp_path)
    assert half.returncode == 0, half.stderr[-3000:]
    resumed = subprocess.run([sys.executable, osp.join(ROOT, 'tools', 'train.py'), config, '--work-dir',
                              str(tmp_path / 'resumed'), '--resume', '--cfg-options', 'randomness.seed=0'],
                             capture_output=True, text=True, timeout=600, cwd=str(tmp_path),
                             env=dict(os.environ, OMP_NUM_THREADS='1'))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    _, again = _state(tmp_path / 'resumed')
    assert again.keys() == state.keys() and all(torch.equal(again[k], state[k]) for k in state)

    # stage 2: the classifier from stage 1's student, its head the release's classifier
    ft_cfg = tmp_path / 'stage2.py'
    ft_cfg.write_text(ws.finetune_config(base, dict(type='poly', degree=3), 2, ckpt, release))
    ft = _train(str(ft_cfg), tmp_path / 'stage2', 'randomness.seed=0', tmp_path=tmp_path)
    assert ft.returncode == 0, ft.stderr[-3000:]
    ft_ckpt, ft_state = _state(tmp_path / 'stage2')

    # both start the demo Mask R-CNN at this width: every backbone weight placed but the new adapter's
    from mmengine.config import Config
    from softfree_mm.models.converters import placement, read_pretrained
    det = Config.fromfile(osp.join(ROOT, 'configs', 'demo', 'maskrcnn_xcit_t12_poly3_demo.py'))
    bb = dict(det.model.backbone.to_dict(), embed_dims=32, depth=4, num_heads=4, out_indices=(0, 1, 2, 3),
              norm_cfg=dict(type='BN'))
    backbone = build_in('softfree_mm', bb)
    for path in (ckpt, ft_ckpt):
        sd = read_pretrained(backbone, path, type(backbone)._convert, 'backbone.')
        missing, unexpected, mismatched = placement(backbone, sd)
        assert not mismatched and missing and all(k.startswith('adapter') or 'fpn' in k for k in missing), missing


@pytest.mark.parametrize('case, message', [
    ('teacher of another depth', 'holds another architecture than this model'),
    ('a kernel the layout does not take', "attention kernel 'inline' cannot be used in layer 0"),
    ('a student of another width', 'the student SoftFreeXCiT has another architecture than the teacher'),
])
def test_bad_inputs_are_one_line_and_exit_2_before_any_iteration(case, message, tmp_path, demo_root):
    base = _tiny_base(tmp_path, demo_root)
    if case == 'teacher of another depth':
        config = _stage1(tmp_path, base, _release(tmp_path, depth=5))
    elif case == 'a kernel the layout does not take':
        config = _stage1(tmp_path, base, _release(tmp_path), kernel=dict(type='inline'))
    else:
        config = _stage1(tmp_path, _tiny_base(tmp_path, demo_root, width=48), _release(tmp_path))
        text = open(config).read().replace("'embed_dims': 48", "'embed_dims': 32")
        open(config, 'w').write(text)
    proc = _train(config, tmp_path / 'bad', tmp_path=tmp_path)
    assert proc.returncode == 2, proc.stderr[-3000:]
    err = [ln for ln in proc.stderr.strip().splitlines() if ln.startswith('error:')]
    assert len(err) == 1 and message in err[0], proc.stderr[-3000:]
    assert 'Iter(train)' not in proc.stdout + proc.stderr


def test_cost_times_stage_1_against_the_classifiers_step_and_refuses_other_configs(tmp_path):
    """tools/analysis/warm_start_grid.py --cost on a tiny XCiT pair (a transfer config and the classifier it names)."""
    import csv
    (tmp_path / 'cls_tiny_poly3.py').write_text(
        f"_base_ = {osp.join(ROOT, 'configs', 'cls_xcit_s12_poly3.py')!r}\n"
        "model = dict(backbone=dict(embed_dims=32, depth=2, num_heads=4, cls_attn_layers=1), "
        "head=dict(in_channels=32))\n")
    (tmp_path / 'transfer_tiny_poly3.py').write_text(
        f"_base_ = {osp.join(ROOT, 'configs', 'transfer_xcit_s12_poly3.py')!r}\n"
        "model = dict(backbone=dict(embed_dims=32, depth=2, num_heads=4, cls_attn_layers=1),\n"
        "             teacher=dict(embed_dims=32, depth=2, num_heads=4, cls_attn_layers=1))\n")
    tool = osp.join(ROOT, 'tools', 'analysis', 'warm_start_grid.py')
    out = tmp_path / 'cost.csv'
    proc = subprocess.run([sys.executable, tool, '--cost', str(tmp_path / 'transfer_tiny_poly3.py'), '--batch', '2',
                           '--steps', '1', '--cost-recipes', 'transfer', 'transfer-final', '--csv', str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    row, final = list(csv.DictReader(open(out)))
    assert (row['recipe'], final['recipe']) == ('transfer', 'transfer-final')
    assert float(row['ratio']) == pytest.approx(float(row['transfer_s']) / float(row['classifier_s']))
    assert 0 < int(row['trained_params']) < int(row['student_params'])
    assert row['trained_params'] == final['trained_params']  # the same groups; the loss adds a pass, not parameters
    assert f"transfer_tiny_poly3.py (transfer): stage 1 {float(row['transfer_s']):.3f} s/step" in proc.stdout
    bad = subprocess.run([sys.executable, tool, '--cost', str(tmp_path / 'transfer_tiny_poly3.py'), '--cost-recipes',
                          'transfer-fast'], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.strip().startswith('error: --cost-recipes transfer-fast: known recipes')
    bad = subprocess.run([sys.executable, tool, '--cost', osp.join(ROOT, 'configs', 'cls_xcit_s12_poly3.py')],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.strip().endswith('not a configs/transfer_*.py file')


def test_child_configs_put_the_kernel_in_place_of_the_bases_own(tmp_path):
    """The demo detector's base holds poly with degree=3: a child for softmax or linear must not inherit the degree."""
    from mmengine.config import Config
    det = osp.join(ROOT, 'configs', 'demo', 'maskrcnn_xcit_t12_poly3_demo.py')
    for kernel in (dict(type='softmax'), dict(type='linear', feature_map='elu+1')):
        for name, text in (('k', ws.kernel_config(det, kernel)),
                           ('ft', ws.finetune_config(det, kernel, 4, 'start.pth', 'release.pth'))):
            path = tmp_path / f'{name}_{kernel["type"]}.py'
            path.write_text(text)
            assert Config.fromfile(str(path)).model.backbone.attn_cfg.to_dict() == kernel


def test_scratch_rows_are_the_studys_runs_unless_the_grid_needs_their_weights(tmp_path):
    """--scratch-from: a kernel's from-scratch row is the study's run of the same config, kernel and seed (read, not
    run: the runner's folder stays empty), except softmax (the teachers) and the detectors' kernels on XCiT, which
    the grid trains itself (here: their finished result.json, read by the real runner); the paired difference of a
    warm start is taken against the row it reads."""
    import csv
    import json
    from softfree_mm.analysis.warm_start_rows import summarise
    study = tmp_path / 'runs.csv'
    fields = ['config', 'kernel', 'seed', 'status', 'top1_final', 'wall_s', 'cpu_s', 'error']
    with open(study, 'w', newline='') as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for config in ('study_xcit_t12_digits', 'study_pvt_v2_b0_digits'):
            for kernel, top in (('softmax', 75.0), ('relu', 61.5), ('linear', 66.0)):
                w.writerow(dict(config=config, kernel=kernel, seed=1, status='ok', top1_final=top, wall_s=10,
                                cpu_s=9, error=''))
    runner = ws.Runner(str(tmp_path / 'runs'), osp.join(ROOT, 'tools'))
    plan = ws.Plan(runner, ROOT, [1], scratch_from=str(study), det_kernels=['linear'])
    got = plan.scratch('pvt', 'relu', 1)
    assert (got['source'], got['top1_final'], got['status']) == ('study', 61.5, 'ok')
    assert plan.scratch('pvt', 'linear', 1)['top1_final'] == 66.0
    assert not (tmp_path / 'runs').exists()
    for key, top in (('scratch/xcit/softmax/seed1', 70.0), ('scratch/xcit/linear/seed1', 64.0)):
        os.makedirs(tmp_path / 'runs' / key)
        (tmp_path / 'runs' / key / 'result.json').write_text(json.dumps(
            dict(status='ok', top1_final=top, checkpoint='c.pth', key=key)))
    assert plan.scratch('xcit', 'softmax', 1)['top1_final'] == 70.0
    assert plan.scratch('xcit', 'linear', 1)['top1_final'] == 64.0
    assert plan.scratch('xcit', 'relu', 1)['source'] == 'study'
    rows = [ws._row(plan.scratch('pvt', 'relu', 1), backbone='pvt', kernel='relu', seed=1, start='scratch',
                    iters=300, groups=''),
            dict(backbone='pvt', kernel='relu', seed=1, start='swap', iters=75, groups='', top1=60.0, status='ok')]
    (swap,) = [r for r in summarise(rows) if r['start'] == 'swap']
    assert swap['vs_scratch_mean'] == pytest.approx(60.0 - 61.5) and swap['paired_seeds'] == 1


@pytest.mark.parametrize('args,message', [
    (['--seeds', '0', '1', '--ablation-seeds', '2'], '--ablation-seeds [2]: a subset of --seeds [0, 1]'),
    (['--scratch-from', 'no/such/runs.csv'], "--scratch-from no/such/runs.csv: no such file"),
    (['--scratch-from', 'OTHER'], 'no column cpu_s, top1_final, wall_s'),
    (['--backbones', 'swin', 'swon'], '--backbones swin swon: distinct names of xcit, pvt, swin, pvt600'),
    (['--backbones', 'pvt600', '--kernels', 'relu'], '--kernels relu: kernels of the backbones pvt600'),
])
def test_grid_options_out_of_range_are_one_line_and_exit_2(args, message, tmp_path):
    other = tmp_path / 'other.csv'
    other.write_text('config,kernel,seed,status\nstudy_xcit_t12_digits,relu,0,ok\n')
    args = [str(other) if a == 'OTHER' else a for a in args]
    tool = osp.join(ROOT, 'tools', 'analysis', 'warm_start_grid.py')
    proc = subprocess.run([sys.executable, tool, '--work-dir', str(tmp_path / 'w'), '--out', str(tmp_path / 'o'),
                           *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and message in proc.stderr.strip().splitlines()[-1], proc.stderr[-2000:]
    assert not (tmp_path / 'w').exists()


def test_dry_run_of_the_main_job_with_only_the_softmax_release_says_which_start_it_takes(tmp_path):
    """`tools/train.py configs/maskrcnn_xcit_s12_poly3.py --dry-run` where only the XCiT-S12/16 release is downloaded
    (random weights in the official layout, in torch hub's cache) and no warm start is made: the run would stop
    before training with the line naming both stages; the other start, the release with poly3 swapped in, is here
    and fits, with the option that takes it; with that option the dry run checks the release as the start."""
    from softfree_mm.models.converters import release_file_name
    from tests.models.test_checkpoint_arch import xcit_official
    cfg = osp.join(ROOT, 'configs', 'maskrcnn_xcit_s12_poly3.py')
    from mmengine.config import Config
    release = Config.fromfile(cfg).softmax_release
    torch.manual_seed(0)
    sd = {k: torch.randn(shape) if shape else torch.tensor(1) for k, shape in xcit_official(384, 12, 8).items()}
    hub = tmp_path / 'torch' / 'hub' / 'checkpoints'
    hub.mkdir(parents=True)
    torch.save({'model': sd}, hub / release_file_name(release))
    env = dict(os.environ, TORCH_HOME=str(tmp_path / 'torch'))
    tool = osp.join(ROOT, 'tools', 'train.py')

    def dry_run(*options):
        proc = subprocess.run([sys.executable, tool, cfg, '--dry-run', '--work-dir', str(tmp_path / 'w'), *options],
                              capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return [ln for ln in proc.stdout.splitlines() if 'model.backbone.init_cfg' in ln]

    stops, other = dry_run()
    assert stops.startswith("[dry-run] model.backbone.init_cfg: the run stops before training: pretrained checkpoint "
                            "'work_dirs/finetune_xcit_s12_poly3' does not exist; make it with the warm start "
                            f'(docs/warm_start.md): `python tools/warm_start.py {cfg} --launcher pytorch --gpus 8` '
                            'runs what is missing (stage 1 configs/transfer_xcit_s12_poly3.py, then stage 2 '
                            'configs/finetune_xcit_s12_poly3.py'), stops
    fit = (f'{release} fits SoftFreeXCiT (12 blocks, width 384, 8 heads, MLP ratio 4, patch size 16): 350 of its 361 '
           'weights placed (11 left to their initialisation, 39 in the file not placed)')
    assert other == ('[dry-run] model.backbone.init_cfg: the other start, softmax_release with this kernel swapped '
                     f'in: {fit}; --cfg-options model.backbone.init_cfg.checkpoint={release} takes it'), other
    (taken, ) = dry_run('--cfg-options', f'model.backbone.init_cfg.checkpoint={release}')
    assert taken == f'[dry-run] model.backbone.init_cfg: {fit}', taken


def test_the_table_gives_mean_std_and_the_difference_paired_by_seed_with_a_failed_seed():
    """Hand computation: scratch 70 / 60 / 80 on seeds 0-2; swap at 75 iterations 71 on seed 0, failed on seed 1, 77
    on seed 2: 74.0 ± 4.2 (sample std), paired differences +1 and -3: -1.0 ± 2.8, n = 2 shown."""
    from softfree_mm.analysis.warm_start_report import markdown
    from softfree_mm.analysis.warm_start_rows import summarise
    rows = [dict(backbone='pvt', kernel='relu', seed=s, start='scratch', iters=300, transfer_iters=0, groups='',
                 top1=t, status='ok', source='study') for s, t in ((0, 70.0), (1, 60.0), (2, 80.0))]
    rows += [dict(backbone='pvt', kernel='relu', seed=s, start='swap', iters=75, transfer_iters=0, groups='',
                  top1=t, status='ok' if t else 'failed') for s, t in ((0, 71.0), (1, None), (2, 77.0))]
    (swap,) = [r for r in summarise(rows) if r['start'] == 'swap']
    assert (swap['n'], swap['failed'], swap['paired_seeds']) == (2, 1, 2)
    assert swap['top1_mean'] == pytest.approx(74.0) and swap['top1_std'] == pytest.approx(18 ** 0.5)
    assert swap['vs_scratch_mean'] == pytest.approx(-1.0) and swap['vs_scratch_std'] == pytest.approx(8 ** 0.5)
    table = markdown(summarise(rows), [], dict(chosen=['kernel', 'qkv']))
    assert '| kernel | scratch, 300 | swap, 75 |' in table
    assert '| relu * | 70.0 ± 10.0 | 74.0 ± 4.2 (-1.0 ± 2.8) n = 2 |' in table
    # runs not made yet (a grid reported while it runs) are 'not run yet', never 'failed'
    later = [dict(r, kernel='linear', start='swap', top1=None, status='not run') for r in rows[:3]]
    later += [dict(r, kernel='linear') for r in rows[:3]]
    (swap,) = [r for r in summarise(later) if r['start'] == 'swap']
    assert (swap['n'], swap['failed'], swap['not_run']) == (0, 0, 3)
    assert '| linear * | 70.0 ± 10.0 | not run yet |' in markdown(summarise(later), [], dict(chosen=['kernel', 'qkv']))
    # each grid backbone's tables are headed by its title, the windowed one's too
    swin = markdown(summarise([dict(r, backbone='swin') for r in rows]), [], dict(chosen=['kernel', 'qkv']))
    assert '### tiny Swin (windowed token attention, 4x4 windows, shifted)' in swin and '### swin' not in swin


def test_outputs_count_the_grids_own_time_and_name_configs_under_the_work_dir(tmp_path):
    """compute_line adds the grid's own runs (classifier, stage 1, detectors; not the study's rows) by hand; an error
    naming a child config is written relative to the work dir."""
    import csv
    from softfree_mm.analysis.warm_start_report import compute_line, write_outputs
    root = tmp_path / 'runs'
    err = f'stage 1 failed: {root}/transfer/x/seed0/cfg.py: ValueError: nothing would train'
    rows = [dict(backbone='pvt', kernel='relu', seed=0, start='scratch', iters=300, transfer_iters=0, groups='',
                 top1=70.0, status='ok', source='study', wall_s=1000.0),
            dict(backbone='pvt', kernel='relu', seed=0, start='swap', iters=75, transfer_iters=0, groups='',
                 top1=69.0, status='ok', source='grid', wall_s=1800.0),
            dict(backbone='pvt', kernel='relu', seed=0, start='transfer', iters=75, transfer_iters=25, groups='kernel',
                 top1=None, status='failed', source='grid', transfer_wall_s=1800.0, error=err)]
    det = dict(kernel='relu', start='swap', seed=0, wall_s=3600.0, bbox_mAP=0.5, segm_mAP=0.3, start_top1=69.0)
    result = dict(rows=rows, detectors=[det], curves=[],
                  groups=('kernel', 'qkv'), scores={})
    line = compute_line(result)
    assert line.startswith("The grid's runs: 1 classifier runs and evaluations, 1 stage-1 runs, 1 detectors")
    assert 'add up to 2.0 h' in line and '1 from-scratch rows are the kernel study' in line
    plan = ws.Plan(ws.Runner(str(root), osp.join(ROOT, 'tools')), ROOT, [0])
    write_outputs(result, str(tmp_path / 'out'), plan)
    (failed,) = [r for r in csv.DictReader(open(tmp_path / 'out' / 'classifiers.csv')) if r['status'] == 'failed']
    assert failed['error'] == 'stage 1 failed: transfer/x/seed0/cfg.py: ValueError: nothing would train'


def test_the_default_recipe_rule_by_hand():
    """choose_default: pairs by (kernel, seed) against the default at the budget; a recipe whose paired mean is
    positive with its 95 % interval above zero replaces it; one that only meets the 1-point target where the default
    misses replaces it only if it loses on no kernel beyond that kernel's interval."""
    from softfree_mm.analysis.stats import t_quantile as t95
    from softfree_mm.analysis.warm_start_rows import choose_default

    def rows(recipe, tops, start='transfer'):
        return [dict(backbone='pvt', kernel=k, seed=s, start=start, iters=75 if start == 'transfer' else 300,
                     recipe=recipe, top1=v) for (k, s), v in tops.items()]
    scratch = {('a', s): 70.0 for s in range(3)} | {('b', s): 70.0 for s in range(3)}
    default = {('a', 0): 65.0, ('a', 1): 66.0, ('a', 2): 67.0, ('b', 0): 70.0, ('b', 1): 71.0, ('b', 2): 69.0}
    better = {k: v + d for (k, v), d in zip(default.items(), (2.0, 3.0, 2.5, 1.0, 2.0, 1.5))}
    noisy = {k: v + d for (k, v), d in zip(default.items(), (6.0, -5.0, 4.0, 0.0, 0.5, -0.5))}
    meets = {k: v + d for (k, v), d in zip(default.items(), (4.5, 4.0, 5.0, -0.1, 0.0, 0.1))}
    all_rows = rows('', scratch, 'scratch') + rows('transfer', default)
    got = choose_default(all_rows + rows('transfer-half', better) + rows('transfer-final', noisy), 'transfer', 75)
    v = got['pvt']['verdicts']
    d = [2.0, 3.0, 2.5, 1.0, 2.0, 1.5]
    m = sum(d) / 6
    half = t95(5) * (sum((x - m) ** 2 for x in d) / 5) ** 0.5 / 6 ** 0.5
    assert v['transfer-half']['mean'] == pytest.approx(m) and v['transfer-half']['half'] == pytest.approx(half)
    assert v['transfer-half']['replaces'] and not v['transfer-final']['replaces']
    assert got['pvt']['misses'] == ['a'] and got['pvt']['chosen'] == 'transfer-half'
    # meeting the target where the default misses ('a': -4 -> -0.5 to scratch), losing nowhere beyond the interval
    got = choose_default(all_rows + rows('transfer-attn', meets), 'transfer', 75)
    assert got['pvt']['verdicts']['transfer-attn']['meets'] == ['a'] and got['pvt']['chosen'] == 'transfer-attn'
    worse_b = dict(meets) | {('b', 0): 60.0, ('b', 1): 61.0, ('b', 2): 60.5}
    got = choose_default(all_rows + rows('transfer-attn', worse_b), 'transfer', 75)
    assert got['pvt']['verdicts']['transfer-attn']['loses'] == ['b'] and got['pvt']['chosen'] == 'transfer'
    # a recipe is its runs with its own stage-1 groups: the groups comparison's other runs, labelled with the
    # default's name, are not the default's; transfer-blocks' runs (groups 'blocks') are its own
    def grouped(recipe, tops, groups):
        return [dict(r, groups=groups) for r in rows(recipe, tops)]
    comparison = grouped('transfer', {k: v + 30.0 for k, v in default.items()}, 'blocks')
    got = choose_default(rows('', scratch, 'scratch') + grouped('transfer', default, 'kernel+qkv') + comparison
                         + grouped('transfer-blocks', better, 'blocks'), 'transfer', 75)
    v = got['pvt']['verdicts']['transfer-blocks']
    assert v['mean'] == pytest.approx(m) and v['n'] == 6 and got['pvt']['chosen'] == 'transfer-blocks'


def test_det_from_keeps_an_earlier_grids_detectors_and_runs_none(tmp_path):
    """--det-from: the grid (here in --report-only form: every run 'not run', each key asked for recorded) asks for
    no detector run and its detectors are the file's rows, typed and marked as read; compute_line does not count them
    as its own time; a file that is not a detectors.csv is refused at the plan, before any run, naming what it lacks."""
    import csv
    from softfree_mm.analysis.warm_start_report import compute_line
    from softfree_mm.engine.errors import UsageError
    path = tmp_path / 'detectors.csv'
    with open(path, 'w', newline='') as f:
        w = csv.writer(f)
        w.writerow(['kernel', 'start', 'seed', 'start_top1', 'status', 'wall_s', 'bbox_mAP', 'segm_mAP', 'bbox_mAP_50',
                    'segm_mAP_50', 'error'])
        w.writerow(['softmax', 'softmax', 0, 73.2, 'ok', 600.0, 0.31, 0.25, 0.6, 0.5, ''])
        w.writerow(['linear', 'swap', 1, '', 'failed', '', '', '', '', '', 'no classifier'])
    asked = []
    runner = ws.Runner(str(tmp_path / 'w'), osp.join(ROOT, 'tools'))
    runner.train = runner.test = lambda key, *a, **k: asked.append(key) or dict(status='not run', key=key)
    plan = ws.Plan(runner, ROOT, [0], budgets=(75, ), backbones={'xcit': (ws.BACKBONES['xcit'][0], ['linear'])},
                   det_from=str(path))
    result = ws.run_grid(plan)
    assert asked and not [k for k in asked if k.startswith('det/')]
    assert result['detectors'] == [
        dict(kernel='softmax', start='softmax', seed=0, start_top1=73.2, status='ok', error='', wall_s=600.0,
             bbox_mAP=0.31, segm_mAP=0.25, bbox_mAP_50=0.6, segm_mAP_50=0.5, source='read: detectors.csv'),
        dict(kernel='linear', start='swap', seed=1, start_top1=None, status='failed', error='no classifier',
             wall_s=None, bbox_mAP=None, segm_mAP=None, bbox_mAP_50=None, segm_mAP_50=None,
             source='read: detectors.csv')]
    line = compute_line(result)
    assert ', 0 detectors (train + test)' in line and \
        "The 2 detector rows are read from an earlier grid's detectors.csv (--det-from)" in line
    # without --det-from the same plan makes its own detector rows, for its detectors' kernels the backbone runs
    own = ws.run_grid(ws.Plan(runner, ROOT, [0], budgets=(75, ),
                              backbones={'xcit': (ws.BACKBONES['xcit'][0], ['linear'])}))['detectors']
    # (here none starts: no classifier has run, so neither has any detector)
    assert [(d['kernel'], d['start'], d['status']) for d in own] == [
        ('softmax', 'softmax', 'not run'), ('linear', 'scratch', 'not run'), ('linear', 'swap', 'not run'),
        ('linear', 'transfer', 'not run')]
    other = tmp_path / 'classifiers.csv'
    other.write_text('backbone,kernel,seed,start\nxcit,relu,0,scratch\n')
    with pytest.raises(UsageError, match=r'classifiers.csv: not a detectors.csv of the warm-start grid: no column '
                                         r'start_top1, status, wall_s, bbox_mAP'):
        ws.Plan(runner, ROOT, [0], det_from=str(other))
    tool = osp.join(ROOT, 'tools', 'analysis', 'warm_start_grid.py')
    proc = subprocess.run([sys.executable, tool, '--work-dir', str(tmp_path / 'w2'), '--out', str(tmp_path / 'o'),
                           '--det-from', str(other)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and 'not a detectors.csv of the warm-start grid' in proc.stderr.strip().splitlines()[-1]
    assert not (tmp_path / 'w2').exists()


def test_the_docs_section_is_the_table_and_plots_and_is_replaced_on_every_run(tmp_path):
    """write_outputs(docs=page): the page's text outside the markers stays; between them the table.md just written
    and the plots (recipes.png once a second recipe has rows), replaced, not appended, when run again."""
    from softfree_mm.analysis import warm_start_report as rep
    rows = [dict(backbone='pvt', kernel='relu', seed=s, start='scratch', iters=300, transfer_iters=0, groups='',
                 top1=70.0 + s, status='ok', source='study') for s in (0, 1)]
    for rec, gain in (('transfer', -2.0), ('transfer-final', 1.0)):
        rows += [dict(backbone='pvt', kernel='relu', seed=s, start='transfer', recipe=rec, iters=75, transfer_iters=25,
                      groups='kernel+qkv', top1=70.0 + s + gain, status='ok', source='grid') for s in (0, 1)]
    result = dict(rows=rows, detectors=[], curves=[], groups=('kernel', 'qkv'), scores={})
    page = tmp_path / 'docs' / 'warm_start.md'
    page.parent.mkdir()
    page.write_text(f'# Warm start\n\nbefore\n\n{rep.BEGIN}\nold table\n{rep.END}\n\nafter\n')
    out = tmp_path / 'docs' / 'results' / 'warm_start'
    plan = ws.Plan(ws.Runner(str(tmp_path / 'runs'), osp.join(ROOT, 'tools')), ROOT, [0, 1], budgets=(75, ),
                   recipes=['transfer-final'])
    for _ in range(2):
        rep.write_outputs(result, str(out), plan, str(page))
    text = page.read_text()
    table = (out / 'table.md').read_text()
    assert text.startswith('# Warm start\n\nbefore\n\n') and text.endswith('\n\nafter\n')
    assert 'old table' not in text and text.count(rep.BEGIN) == 1 and table.rstrip() in text
    assert '| relu | 68.5 ± 0.7 (-2.0 ± 0.0) | 71.5 ± 0.7 (+1.0 ± 0.0) |' in table
    assert ('transfer-final +3.0 [+3.0, +3.0] (n = 2), meets the target where the default misses: relu. Version 1 '
            'would take `transfer-final`.') in table
    assert '![each recipe against scratch, paired by seed](results/warm_start/recipes.png)' in text
    assert (out / 'recipes.png').is_file()


def _kept_folder(path, rows):
    import csv
    fields = ['backbone', 'kernel', 'seed', 'start', 'iters', 'transfer_iters', 'groups', 'source', 'status', 'top1',
              'wall_s', 'cpu_s', 'recipe', 'transfer_loss', 'transfer_s_per_iter', 'transfer_wall_s',
              'finetune_s_per_iter', 'error']
    os.makedirs(path, exist_ok=True)
    with open(osp.join(path, 'classifiers.csv'), 'w', newline='') as f:
        w = csv.DictWriter(f, fieldnames=fields, restval='')
        w.writeheader()
        w.writerows(rows)
    with open(osp.join(path, 'transfer_curves.csv'), 'w', newline='') as f:
        f.write('iter,block,loss,loss_transfer,backbone,kernel,seed,iters,groups\n'
                '5,0,0.25,0.5,pvt,linear,0,75,kernel+qkv\n')
    return str(path)


def test_keep_from_runs_only_what_is_missing_and_refuses_another_teacher(tmp_path):
    """--keep-from: a kept row (identified by backbone, kernel, seed, start, iterations, recipe, groups) is not run
    again and comes back as written, stage-1 curves included; only the missing runs are asked for, and their teacher
    is trained again (here its finished result.json, read by the real runner) only where one is missing; a teacher
    whose top-1 is not the kept one's stops the grid naming both; rows of a seed without its teacher's row are not
    kept; XCiT's detectors cannot start from kept rows, so --det-from is required there."""
    from softfree_mm.engine.errors import UsageError
    seed0 = [dict(backbone='pvt', kernel='softmax', seed=0, start='scratch', iters=300, status='ok', top1=76.0,
                  source='grid', wall_s=90.0),
             dict(backbone='pvt', kernel='linear', seed=0, start='scratch', iters=300, status='ok', top1=66.0,
                  source='study'),
             dict(backbone='pvt', kernel='linear', seed=0, start='swap', iters=0, status='ok', top1=10.5,
                  source='grid'),
             dict(backbone='pvt', kernel='linear', seed=0, start='swap', iters=75, status='ok', top1=60.0,
                  source='grid'),
             dict(backbone='pvt', kernel='linear', seed=0, start='transfer', iters=75, transfer_iters=25,
                  groups='kernel+qkv', recipe='transfer', status='ok', top1=64.5, source='grid', transfer_loss=0.125,
                  transfer_wall_s=7.0, wall_s=11.0)]
    half = dict(seed0[-1], recipe='transfer-half', transfer_iters=37, top1=63.0)
    plan_args = dict(budgets=(75, ), backbones={'pvt': (ws.BACKBONES['pvt'][0], ['linear'])}, ablation_seeds=[],
                     recipes=['transfer', 'transfer-half'], recipe_kernels={'pvt': ['linear']})

    def grid(folder, teacher_top1=76.0, seeds=(0, )):
        runner = ws.Runner(str(tmp_path / 'w'), osp.join(ROOT, 'tools'), report_only=True)
        asked, train = [], runner.train
        runner.train = lambda key, *a, **k: asked.append(key) or train(key, *a, **k)
        runner.test = lambda key, *a, **k: asked.append(key) or dict(status='not run', key=key)
        teacher = tmp_path / 'w' / 'scratch' / 'pvt' / 'softmax' / 'seed0'
        os.makedirs(teacher, exist_ok=True)
        (teacher / 'result.json').write_text(json.dumps(dict(status='ok', top1_final=teacher_top1,
                                                             checkpoint='c.pth')))
        said = []
        result = ws.run_grid(ws.Plan(runner, ROOT, list(seeds), keep_from=folder, echo=said.append, **plan_args))
        # --report-only trains nothing: the line names the teachers a run would train
        assert [m for m in said if 'teachers a run would train again for their weights' in m], said
        return asked, {(r['kernel'], r['start'], r['iters'], r.get('recipe', '')): r for r in result['rows']}, result

    import json
    asked, rows, result = grid(_kept_folder(tmp_path / 'a', seed0))
    assert asked[0] == 'scratch/pvt/softmax/seed0' and len(asked) == 2 and asked[1].startswith('transfer/pvt/linear/')
    assert rows[('linear', 'transfer', 75, 'transfer-half')]['status'] == 'not run'
    kept = rows[('linear', 'transfer', 75, 'transfer')]
    assert (kept['top1'], kept['source'], kept['transfer_loss'], kept['transfer_wall_s'], kept['wall_s']) == \
        (64.5, 'grid', 0.125, 7.0, 11.0)
    assert (rows[('linear', 'scratch', 300, '')]['source'], rows[('linear', 'swap', 0, '')]['top1']) == ('study', 10.5)
    assert result['curves'] == [dict(iter=5, block=0, loss=0.25, loss_transfer=0.5, backbone='pvt', kernel='linear',
                                     seed=0, iters=75, groups='kernel+qkv')]
    # everything kept: nothing runs, no teacher either
    asked, rows, _ = grid(_kept_folder(tmp_path / 'b', seed0 + [half]))
    assert asked == [] and rows[('linear', 'transfer', 75, 'transfer-half')]['top1'] == 63.0
    # a failed row is a finished run: kept with its error, not retried (nor its teacher trained again for it), in
    # the main recipe (whose stage-1 curves are read) and in a variant
    error = 'stage 1 failed: error: ValueError: AttentionTransfer: nothing would train'
    refused = [dict(r, top1='', status='failed', transfer_loss='', transfer_wall_s=1.5, wall_s='', error=error)
               for r in (seed0[-1], half)]
    asked, rows, result = grid(_kept_folder(tmp_path / 'g', seed0[:-1] + refused))
    assert asked == [] and result['curves'] == []
    for recipe in ('transfer', 'transfer-half'):
        row = rows[('linear', 'transfer', 75, recipe)]
        assert (row['status'], row['top1'], row['error'], row['transfer_wall_s']) == ('failed', None, error, 1.5)
    # another teacher: refused before any new run
    with pytest.raises(UsageError, match=r'the pvt teacher of seed 0 trained again reaches top-1 75.0 where the kept '
                                         r"rows' teacher reached 76.0"):
        grid(_kept_folder(tmp_path / 'c', seed0), teacher_top1=75.0)
    # a seed whose teacher row is missing keeps nothing
    orphan = [dict(r, seed=1) for r in seed0[1:]]
    asked, rows, result = grid(_kept_folder(tmp_path / 'd', seed0 + [half] + orphan), seeds=(0, 1))
    assert 'scratch/pvt/softmax/seed1' in asked
    assert [r['status'] for r in result['rows'] if r['seed'] == 1] == ['not run', 'not run']  # its scratch rows only
    with pytest.raises(UsageError, match='give --det-from too'):
        ws.Plan(ws.Runner(str(tmp_path / 'x'), osp.join(ROOT, 'tools')), ROOT, [0],
                keep_from=_kept_folder(tmp_path / 'e', seed0))
    with pytest.raises(UsageError, match='no column top1, source'):
        (tmp_path / 'f').mkdir()
        (tmp_path / 'f' / 'classifiers.csv').write_text('backbone,kernel,seed,start,iters,recipe,groups,status\n')
        ws.Plan(ws.Runner(str(tmp_path / 'x'), osp.join(ROOT, 'tools')), ROOT, [0], keep_from=str(tmp_path / 'f'))


def test_teachers_only_trains_softmax_from_scratch_and_leaves_the_kernels_rows_not_run(tmp_path):
    """--teachers-only (the carry-over test's longer schedule): softmax, which the warm starts start from, is trained;
    the kernels' from-scratch runs are not asked for and their rows say 'not run'; the 600-iteration backbone's scratch
    rows are labelled 600."""
    asked = []
    runner = ws.Runner(str(tmp_path / 'w'), osp.join(ROOT, 'tools'))
    runner.train = runner.test = lambda key, *a, **k: asked.append(key) or dict(status='not run', key=key)
    plan = ws.Plan(runner, ROOT, [0], budgets=(60, ), backbones={'pvt600': ws.BACKBONES['pvt600']},
                   ablation_seeds=[], teachers_only=True)
    rows = ws.run_grid(plan)['rows']
    assert [k for k in asked if k.startswith('scratch/')] == ['scratch/pvt600/softmax/seed0']
    scratch = {r['kernel']: r for r in rows if r['start'] == 'scratch'}
    assert set(scratch) == {'softmax', 'poly:degree=3', 'linear'} and {r['iters'] for r in scratch.values()} == {600}
    assert scratch['linear']['status'] == 'not run' and scratch['linear']['error'] == '--teachers-only'
