"""The warm start users run (softfree_mm/engine/warm_start.py, tools/warm_start.py): one recipe at both scales, the
chain from a release to the main job, and its bad inputs.

Guards: the committed recipe base configs are the definition's; a config of the small-scale grid and the shipped config
of the same backbone x kernel differ exactly in the named list (SCALE_DIFFERENCES), for both stages; ``--dry-run``
lists the chain of a Mask R-CNN, an UperNet and a PVTv2-b2 InLine config (also with another --work-root and another
length); a stage's work dir holding another pair's checkpoint, a config with a release, a config of no det / seg /
cls task, bad options: one line, exit status 2; the chain runs end to end at demo scale (a softmax demo classifier as
the release, stage 1, stage 2, the detector) and, killed in stage 2, resumes there without running stage 1 again and
ends with the weights of an uninterrupted stage 2; ReleaseHead loads a release's classifier in both layouts and
refuses one of another shape. What the chain decides from its work dirs (run identities, adoption, the batch, the lock,
the release) is tests/engine/test_warm_start_chain_run.py and test_warm_start_identity.py.
"""
import fnmatch
import os
import os.path as osp
import re
import shlex
import signal
import subprocess
import sys
import time

import pytest
import torch

from softfree_mm.engine import warm_start as ws
from softfree_mm.engine.errors import UsageError

from tests.helpers import ROOT, load_tool, main_as_command

TOOL = osp.join(ROOT, 'tools', 'warm_start.py')
STUDY = osp.join(ROOT, 'configs', 'demo', 'study_xcit_t12_digits.py')
STUDY_PVT = osp.join(ROOT, 'configs', 'demo', 'study_pvt_v2_b0_digits.py')
IMAGENET = ['--launcher', 'pytorch', '--gpus', '8']  # the ImageNet recipe's batch: 8 x 128


def _flat(d, pre=''):
    out = {}
    if isinstance(d, dict):
        for k, v in d.items():
            if k != '_delete_':
                out.update(_flat(v, f'{pre}{k}.'))
    elif isinstance(d, (list, tuple)) and d and all(isinstance(x, dict) for x in d):
        for i, v in enumerate(d):
            out.update(_flat(v, f'{pre}{i}.'))
    else:
        out[pre[:-1]] = d
    return out


def _run_keys(cfg):
    return {k: v for k, v in _flat(cfg.to_dict()).items() if k.split('.')[0] in ws.RUN_KEYS}


def test_the_committed_recipe_configs_are_the_definitions():
    for name, recipe in ws.RECIPES.items():
        for scale in ws.SCALES:
            with open(ws.recipe_config_path(ROOT, name, scale)) as f:
                assert f.read() == ws.recipe_config_text(recipe, ws.SCALES[scale]), (name, scale)


def test_every_shipped_stage_config_takes_its_layouts_default_recipe():
    """Every shipped stage config declares its layout class's default (the recipe rule version 2's verdict at the
    budget the carry-over test says carries, which tests/analysis/test_recipe_rule_budgets.py ties LAYOUT_DEFAULTS to:
    `transfer` in every layout class), and stage 1's loss and groups are that recipe's."""
    import glob

    from mmengine.config import Config
    seen = {}
    for path in sorted(glob.glob(osp.join(ROOT, 'configs', 'transfer_*.py'))
                       + glob.glob(osp.join(ROOT, 'configs', 'finetune_*.py'))):
        cfg = Config.fromfile(path)
        family = cfg.model.backbone.type
        want = ws.default_recipe(cfg.model.backbone.to_dict())
        assert cfg.warm_start == dict(recipe=want, scale='imagenet'), (path, cfg.warm_start)
        if osp.basename(path).startswith('transfer_'):
            recipe = ws.RECIPES[want]
            assert (cfg.model.loss, tuple(cfg.model.train)) == (recipe.loss, recipe.groups), path
        seen.setdefault(family, set()).add(want)
    assert seen == {'SoftFreeXCiT': {'transfer'}, 'SoftFreePVTv2': {'transfer'},
                    'SoftFreeSwin': {'transfer'}, 'SoftFreeCSWin': {'transfer'}}, seen
    with pytest.raises(UsageError, match=r"^no backbone family 'ResNet'; known: SoftFreeXCiT, "):
        ws.default_recipe('ResNet')


@pytest.mark.parametrize('stage', ['stage1', 'stage2'])
@pytest.mark.parametrize('study,pair', [(STUDY, 'xcit_s12_poly3'), (STUDY_PVT, 'pvt_v2_b2_poly3')])
def test_a_grid_config_and_the_shipped_config_of_a_pair_differ_exactly_in_the_named_list(stage, study, pair, tmp_path):
    """The grid's runs of the layout's default recipe (transfer in every layout class)
    are the shipped configs' recipe."""
    from mmengine.config import Config

    from softfree_mm.analysis import warm_start as grid
    poly3 = dict(type='poly', degree=3)
    total = ws.SCALES['digits'].iters
    recipe = ws.RECIPES[ws.default_recipe(Config.fromfile(study).model.backbone.type)]
    if stage == 'stage1':
        text, shipped = grid.transfer_config(study, poly3, total, 'release.pth', recipe), f'transfer_{pair}.py'
    else:
        n2 = recipe.stage_iters(total)[1]
        text = grid.finetune_config(study, poly3, n2, 'stage1_dir', 'release.pth', recipe)
        shipped = f'finetune_{pair}.py'
    (tmp_path / 'grid.py').write_text(text)
    a = _run_keys(Config.fromfile(str(tmp_path / 'grid.py')))
    b = _run_keys(Config.fromfile(osp.join(ROOT, 'configs', shipped)))
    patterns = [p for group in ws.SCALE_DIFFERENCES.values() for p in group]
    differ = sorted(k for k in set(a) | set(b) if a.get(k, '<none>') != b.get(k, '<none>'))
    outside = [f'{k}: {a.get(k, "<none>")!r} | {b.get(k, "<none>")!r}' for k in differ
               if not any(fnmatch.fnmatch(k, p) or k == p for p in patterns)]
    assert not outside, outside
    # the recipe is there, and the same, at both scales
    same = [k for k in a if k in b and a[k] == b[k]]
    keys = {'stage1': ['model.type', 'model.train', 'model.loss', 'optim_wrapper.optimizer.type',
                         'optim_wrapper.optimizer.weight_decay', 'optim_wrapper.clip_grad.max_norm',
                         'param_scheduler.0.type', 'param_scheduler.0.start_factor', 'param_scheduler.1.type',
                         'train_cfg.type', 'model.teacher.attn_cfg.type', 'model.backbone.attn_cfg.degree'],
              'stage2': ['model.head.init_cfg.type', 'model.backbone.init_cfg.type', 'model.backbone.init_cfg.prefix',
                         'optim_wrapper.optimizer.type', 'param_scheduler.0.type', 'param_scheduler.0.start_factor',
                         'param_scheduler.1.type', 'train_cfg.type', 'model.backbone.attn_cfg.degree']}[stage]
    assert set(keys) <= set(same), sorted(set(keys) - set(same))
    # the lr rule: the same multiples of each scale's from-scratch lr (both 1e-3 here)
    assert a['optim_wrapper.optimizer.lr'] == b['optim_wrapper.optimizer.lr']
    # the schedule's shape: warm-up over the same share of the stage
    n_a, n_b = a['train_cfg.max_iters'], b['train_cfg.max_iters']
    assert abs(a['param_scheduler.0.end'] / n_a - b['param_scheduler.0.end'] / n_b) < 0.05


def _dry_run(config, *args, cwd=ROOT):
    proc = subprocess.run([sys.executable, TOOL, config, '--dry-run', *args], capture_output=True, text=True,
                          timeout=300, cwd=cwd)
    return proc


@pytest.fixture
def tool(capsys, monkeypatch):
    """tools/warm_start.py's main() in this process, as its command line wraps it (a UsageError: 'error: ...' on
    stderr, status 2): (status, stdout, stderr). A process start and the stack's imports cost more than a dry run;
    the command line itself is run as a process by the tests that check its one line."""
    monkeypatch.syspath_prepend(osp.join(ROOT, 'tools'))
    monkeypatch.chdir(ROOT)
    return main_as_command(load_tool('warm_start', '_warm_start_tool'), capsys)


@pytest.mark.parametrize('config,pair,recipe', [
    ('configs/maskrcnn_xcit_s12_poly3.py', 'xcit_s12_poly3', 'transfer'),
    ('configs/upernet_swin_t_linear.py', 'swin_t_linear', 'transfer'),
    ('configs/semfpn_pvt_v2_b2_inline.py', 'pvt_v2_b2_inline', 'transfer'),
])
def test_dry_run_lists_the_chain_with_its_work_dirs_reads_and_writes(config, pair, recipe, tmp_path, tool):
    """Each stage's length is its layout's default recipe's split (a third or half of the 37,530 iterations)."""
    status, out, err = tool(config, '--dry-run', *IMAGENET)
    assert status == 0, err[-2000:]
    n1, n2 = ws.RECIPES[recipe].stage_iters(ws.SCALES['imagenet'].iters)
    assert f'[warm-start] recipe {recipe} at the imagenet scale' in out, out
    name = osp.splitext(osp.basename(config))[0]
    for line in (f'[warm-start] 1/3 stage 1 (transfer): configs/transfer_{pair}.py',
                 f'work dir work_dirs/transfer_{pair}; reads https://',
                 f'[warm-start] 2/3 stage 2 (fine-tune): configs/finetune_{pair}.py',
                 f'work dir work_dirs/finetune_{pair}; reads work_dirs/transfer_{pair} (missing); writes its last '
                 f'checkpoint there after {n2} iters; not started',
                 f'[warm-start] 3/3 the main job: {config}', f'work dir work_dirs/{name}; reads work_dirs/finetune_{pair}',
                 f'after {n1} iters; not started'):
        assert line in out, (line, out)
    # another work root and another length: every run's folder there, the recipe's split of the new length
    root = str(tmp_path / 'elsewhere')
    status, out, err = tool(config, '--dry-run', '--work-root', root, '--iters', '300', *IMAGENET)
    assert status == 0, err[-2000:]
    n1, n2 = ws.RECIPES[recipe].stage_iters(300)
    assert f'work dir {root}/transfer_{pair}; reads https://' in out and f'after {n1} iters; not started' in out
    assert f'work dir {root}/finetune_{pair}; reads {root}/transfer_{pair} (missing); writes its last checkpoint ' \
           f'there after {n2} iters' in out
    assert f'work dir {root}/{name}; reads {root}/finetune_{pair} (missing)' in out
    if pair != 'xcit_s12_poly3':
        return  # a stage's own options are the tool's, not the config's: one config shows them
    status, out, _ = tool(config, '--dry-run', '--stage1-options', 'train_cfg.max_iters=7', *IMAGENET)
    assert status == 0 and 'stage 1 (transfer)' in out and 'after 7 iters' in out


@pytest.mark.parametrize('args,message', [
    (['configs/maskrcnn_xcit_s12_softmax.py'], 'configs/maskrcnn_xcit_s12_softmax.py: nothing to warm-start: its '
                                               'backbone starts from https://'),
    (['configs/transfer_xcit_s12_poly3.py'], 'configs/transfer_xcit_s12_poly3.py: a AttentionTransfer config; the warm '
                                             'start runs before a detection, segmentation or classification config'),
    (['configs/no_such.py'], 'config file not found: configs/no_such.py'),
    (['configs/maskrcnn_xcit_s12_poly3.py', '--launcher', 'slurm'], '--launcher slurm needs --partition'),
    (['configs/maskrcnn_xcit_s12_poly3.py', '--gpus', '0'], '--gpus must be a positive number, got 0'),
    (['configs/maskrcnn_xcit_s12_poly3.py', '--iters', '1'], '--iters must be at least 2'),
    (['configs/maskrcnn_xcit_s12_poly3.py', '--cfg-options', 'oops'], "options are KEY=VALUE, got 'oops'"),
])
def test_bad_input_is_one_line_and_exit_2(args, message, tool):
    status, out, err = tool(*args, '--dry-run')
    assert status == 2, out[-1000:] + err[-2000:]
    lines = [ln for ln in err.strip().splitlines() if 'error' in ln]
    assert len(lines) == 1 and message in lines[0], err


def test_the_command_line_says_a_bad_input_in_one_line_and_exits_2():
    proc = subprocess.run([sys.executable, TOOL, 'configs/no_such.py', '--dry-run'], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    assert proc.returncode == 2 and proc.stdout == ''
    assert proc.stderr.strip() == 'error: config file not found: configs/no_such.py', proc.stderr


def test_a_work_dir_holding_another_pairs_checkpoint_is_one_line(tmp_path):
    """The stage-2 work dir holds a checkpoint whose config trained another kernel: refused before any run."""
    from mmengine.config import Config
    other = Config.fromfile(osp.join(ROOT, 'configs', 'finetune_xcit_s12_linear.py'))
    folder = tmp_path / 'finetune_xcit_s12_poly3'
    folder.mkdir()
    torch.save({'meta': {'cfg': other.pretty_text, 'iter': 3}, 'state_dict': {}}, folder / 'iter_3.pth')
    (folder / 'last_checkpoint').write_text(str(folder / 'iter_3.pth'))
    proc = _dry_run('configs/maskrcnn_xcit_s12_poly3.py', '--work-root', str(tmp_path))
    assert proc.returncode == 2 and proc.stdout == ''
    line = proc.stderr.strip()
    assert line.startswith(
        f"error: {folder} holds another run than this command's stage 2 (fine-tune): model.backbone.attn_cfg.degree: "
        '<absent> -> 3; model.backbone.attn_cfg.type: linear -> poly; model.backbone.init_cfg.checkpoint: '
        'transfer_xcit_s12_linear -> stage 1 (transfer) run ') and line.endswith(
        ' (adopted from the config iter_3.pth saved): give the chain another --work-root, or move that folder away'), \
        proc.stderr


def test_train_py_alone_names_the_warm_start_command_first(tmp_path):
    """The line tools/train.py stops with (here through --dry-run, which says it without the data set); the tool
    that command starts says first where its default was measured when it is borrowed: CSWin-T's stripes borrow the
    windows' verdict, measured on the study's tiny Swin."""
    family = 'cswin_t'
    config = f'configs/maskrcnn_{family}_poly3.py'
    proc = subprocess.run([sys.executable, osp.join(ROOT, 'tools', 'train.py'), config,
                           '--dry-run', '--work-dir', str(tmp_path / 'w')], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (line,) = [ln for ln in proc.stdout.splitlines() if 'the run stops before training' in ln]
    assert f"pretrained checkpoint 'work_dirs/finetune_{family}_poly3' does not exist; make it with the warm start " \
           f'(docs/warm_start.md): `python tools/warm_start.py {config} --launcher pytorch ' \
           '--gpus 8` runs what is missing' in line, line
    # the tool that command starts runs with it (the ImageNet scale's 8 x 128 images a step)
    cmd = line.split('`')[1].split()[1:]
    proc = subprocess.run([sys.executable, *cmd, '--dry-run', '--work-root', str(tmp_path / 'w')],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout.splitlines()
    note = [i for i, ln in enumerate(out) if ln.startswith(
        "[warm-start] note: the warm start's default recipe here, `transfer`, was measured on the study's tiny "
        "Swin with 4x4 shifted windows (windows) at the digits scale, not on SoftFreeCSWin's stripes")]
    # said once, before the runs are listed (after the route and what each stage costs)
    first_run = next(i for i, ln in enumerate(out) if ln.startswith('[warm-start] 1/3 '))
    assert len(note) == 1 and note[0] < first_run and out[0].startswith('[warm-start] route: '), proc.stdout


def _softmax_classifier(work_dir, cwd):
    """The release of the demo chain: the demo's XCiT-T12 classifier with softmax, a few iterations."""
    proc = subprocess.run([sys.executable, osp.join(ROOT, 'tools', 'train.py'),
                           osp.join(ROOT, 'configs', 'demo', 'cls_xcit_t12_poly3_demo.py'), '--work-dir', work_dir,
                           '--cfg-options', 'model.backbone.attn_cfg=softmax', 'train_cfg.max_epochs=1',
                           'train_dataloader.dataset.indices=64', 'val_dataloader.dataset.indices=16'],
                          capture_output=True, text=True, timeout=600, cwd=cwd)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_the_demo_chain_runs_end_to_end_and_resumes_in_stage_2_after_a_kill(tmp_path):
    """A softmax demo classifier is the release; tools/warm_start.py on the warm-start demo detector runs stage 1,
    stage 2 and the detector. Killed (SIGKILL, the whole process group) once stage 2 has written its first
    checkpoint, the same command resumes stage 2 (its log says so), does not run stage 1 again, and stage 2 ends with
    the weights of its command run uninterrupted."""
    root = tmp_path / 'w'
    _softmax_classifier(str(root / 'softmax_cls'), str(tmp_path))
    config = osp.join(ROOT, 'configs', 'demo', 'maskrcnn_xcit_t12_poly3_warm_demo.py')
    cmd = [sys.executable, TOOL, config, '--work-root', str(root), '--release', str(root / 'softmax_cls'),
           '--iters', '6', '--stage1-options', 'train_dataloader.dataset.indices=64',
           '--stage2-options', 'train_dataloader.dataset.indices=64', 'val_dataloader.dataset.indices=16',
           'default_hooks.checkpoint.interval=1',
           '--cfg-options', 'train_cfg.max_iters=2', 'val_dataloader.dataset.indices=4', 'test_dataloader.dataset.indices=4']
    stage1, stage2 = root / 'transfer_xcit_t12_poly3_demo', root / 'finetune_xcit_t12_poly3_demo'
    out = open(tmp_path / 'first.log', 'w')  # a file, not a pipe nobody reads while it runs
    proc = subprocess.Popen(cmd, cwd=str(tmp_path), stdout=out, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    deadline = time.time() + 900

    def saved():  # the last checkpoint mmengine has finished writing (it names it after the file is complete)
        last = stage2 / 'last_checkpoint'
        name = osp.basename(last.read_text().strip()) if last.exists() else ''
        return int(name[len('iter_'):-len('.pth')]) if name.startswith('iter_') else 0

    while saved() < 2:
        assert proc.poll() is None, (tmp_path / 'first.log').read_text()[-3000:]
        assert time.time() < deadline
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(60)
    out.close()
    at_kill = saved()
    first = sorted(os.listdir(stage1))
    assert 'iter_2.pth' in first and not (stage2 / 'iter_4.pth').exists()
    done = subprocess.run(cmd, cwd=str(tmp_path), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert sorted(os.listdir(stage1)) == first  # stage 1 not run again: no new run folder, no new checkpoint
    assert 'stage 1 (transfer)' in done.stdout and 'not needed: stage 2 (fine-tune) resumes' in done.stdout
    assert 'stopped at iter' in done.stdout and 'resumes from' in done.stdout
    logs = sorted(p for p in stage2.iterdir() if p.is_dir())
    assert at_kill in (2, 3) and len(logs) == 2 and \
        re.search(rf'resumed epoch: 0, iter: {at_kill}\b', open(next(logs[-1].glob('*.log'))).read())
    assert (stage2 / 'iter_4.pth').exists() and (root / 'maskrcnn_xcit_t12_poly3_warm_demo' / 'iter_2.pth').exists()
    assert 'every run of the chain is done' in done.stdout
    # resumed, not restarted: stage 2 ends with the weights of an uninterrupted stage 2 (the command the chain ran it
    # with, in another work dir, without --resume)
    (line,) = [ln for ln in done.stdout.splitlines() if ln.startswith(f'[warm-start] 2/3 {stage2.name}: ')]
    argv = shlex.split(line.split(': ', 1)[1])
    argv[argv.index('--work-dir') + 1] = str(tmp_path / 'again' / stage2.name)
    argv.remove('--resume')
    ref = subprocess.run(argv, cwd=str(tmp_path), capture_output=True, text=True, timeout=900)
    assert ref.returncode == 0, ref.stdout[-3000:] + ref.stderr[-3000:]
    resumed, whole = (torch.load(d / 'iter_4.pth', map_location='cpu', weights_only=True)['state_dict']
                      for d in (stage2, tmp_path / 'again' / stage2.name))
    assert resumed.keys() == whole.keys() and all(torch.equal(resumed[k], whole[k]) for k in whole)


@pytest.mark.parametrize('layout', ['official', 'mmpretrain'])
def test_release_head_loads_the_releases_classifier_and_refuses_another_shape(layout, tmp_path):
    from mmengine.registry import WEIGHT_INITIALIZERS, DefaultScope
    import softfree_mm  # noqa: F401  (registers ReleaseHead)
    from mmpretrain.models.heads import LinearClsHead as _Head

    def LinearClsHead(*a, **k):  # its loss is built in mmpretrain's scope, whatever scope an earlier test left
        with DefaultScope.overwrite_default_scope('mmpretrain'):
            return _Head(*a, **k)
    w, b = torch.randn(10, 32), torch.randn(10)
    keys = ('head.weight', 'head.bias') if layout == 'official' else ('head.fc.weight', 'head.fc.bias')
    sd = {'backbone.x': torch.zeros(1), keys[0]: w, keys[1]: b}
    path = tmp_path / 'release.pth'
    torch.save({'model': sd} if layout == 'official' else {'state_dict': sd, 'meta': {}}, path)
    head = LinearClsHead(num_classes=10, in_channels=32)
    WEIGHT_INITIALIZERS.build(dict(type='ReleaseHead', checkpoint=str(path)))(head)
    assert torch.equal(head.fc.weight, w) and torch.equal(head.fc.bias, b)
    with pytest.raises(ValueError, match=r'holds a classifier of \(32, 10\) \(in, out\) features, LinearClsHead one '
                                         r'of \(32, 5\)'):
        WEIGHT_INITIALIZERS.build(dict(type='ReleaseHead', checkpoint=str(path)))(LinearClsHead(5, 32))
    torch.save({'model': {'backbone.x': torch.zeros(1)}}, tmp_path / 'no_head.pth')
    with pytest.raises(ValueError, match='holds no linear classifier'):
        WEIGHT_INITIALIZERS.build(dict(type='ReleaseHead', checkpoint=str(tmp_path / 'no_head.pth')))(head)


def test_a_release_of_another_architecture_is_one_line_before_any_run(tmp_path):
    """--release pointing at a softmax XCiT of another depth: refused before stage 1 starts."""
    import softfree_mm  # noqa: F401
    from tests.helpers.models import build_in
    model = build_in('softfree_mm', dict(type='SoftFreeXCiT', arch='t12', depth=6, out_type='cls_token',
                                         norm_cfg=dict(type='BN'), attn_cfg='softmax'))
    release = tmp_path / 'other.pth'
    torch.save({'state_dict': {f'backbone.{k}': v for k, v in model.state_dict().items()}}, release)
    proc = subprocess.run([sys.executable, TOOL, 'configs/demo/maskrcnn_xcit_t12_poly3_warm_demo.py', '--release',
                           str(release), '--work-root', str(tmp_path / 'w')], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    (line,) = [ln for ln in proc.stderr.strip().splitlines() if ln.startswith('error:')]
    assert "the release (stage 1's teacher)" in line and 'architecture' in line, line
    assert not (tmp_path / 'w').exists()  # nothing ran


def test_each_backbone_setup_takes_its_layout_classs_default():
    """The layout class follows the build arguments, not the family name alone: Swin with global windows is global
    token attention, CSWin's stripes are windows, PVT with spatial reduction is token attention; a type name alone
    stands for the family's default build."""
    from softfree_mm.engine import layout_defaults as ld
    cases = [(dict(type='SoftFreeSwin'), 'windows'), (dict(type='SoftFreeSwin', global_window=True), 'tokens'),
             ('SoftFreeSwin', 'windows'), (dict(type='SoftFreeCSWin'), 'windows'),
             (dict(type='SoftFreeCSWin', global_window=True), 'tokens'),
             (dict(type='SoftFreePVTv2', arch='b2'), 'tokens'),
             (dict(type='SoftFreePVTv2', arch='b2', sr_ratios=(1, 1, 1, 1)), 'tokens'),
             (dict(type='SoftFreeXCiT'), 'channels'), ('SoftFreeXCiT', 'channels')]
    for backbone, kind in cases:
        assert ld.layout_class(backbone) == kind, backbone
    shipped = dict(ld.LAYOUT_DEFAULTS)
    try:  # the classes' defaults differ: each backbone takes its own class's
        ld.LAYOUT_DEFAULTS.update(windows='transfer-final', tokens='transfer-attn')
        assert ws.default_recipe(dict(type='SoftFreeSwin')) == 'transfer-final'
        assert ws.default_recipe(dict(type='SoftFreeSwin', global_window=True)) == 'transfer-attn'
        assert ws.default_recipe(dict(type='SoftFreeCSWin')) == 'transfer-final'
    finally:
        ld.LAYOUT_DEFAULTS.clear()
        ld.LAYOUT_DEFAULTS.update(shipped)


def test_the_default_is_said_to_be_borrowed_exactly_where_the_layout_was_not_measured():
    """Every shipped stage-1 config: XCiT (channels) and PVTv2-b2 without spatial reduction (InLine, SOFT: global
    token attention) and Swin-T (windows) are layouts the grid measured; PVTv2-b2 with spatial reduction borrows
    global token attention's verdict, and CSWin-T's stripes the windows' (the tiny Swin's); the line names their
    layout and the one measured (SOFT's Swin-T and CSWin-T set-ups attend globally in stages 1-3: measured)."""
    import glob

    from mmengine.config import Config

    from softfree_mm.engine.layout_defaults import default_origin
    pvt_b0 = 'measured on PVTv2-b0 without spatial reduction (global tokens)'
    tiny_swin = "measured on the study's tiny Swin with 4x4 shifted windows (windows)"
    want = {'xcit_s12': None, 'pvt_v2_b2_inline': None, 'pvt_v2_b2_soft': None, 'swin_t_soft': None,
            'cswin_t_soft': None, 'pvt_v2_b2': ("'s reduced keys", pvt_b0), 'swin_t': None,
            'cswin_t': ("'s stripes", tiny_swin)}
    seen = set()
    for path in sorted(glob.glob(osp.join(ROOT, 'configs', 'transfer_*.py'))):
        name = osp.basename(path)[len('transfer_'):-3]
        key = name if name in want else name.rsplit('_', 1)[0]
        note = default_origin(Config.fromfile(path).model.backbone.to_dict())
        if want[key] is None:
            assert note is None, (path, note)
        else:
            assert note and all(part in note for part in want[key]), (path, note)
        seen.add(key)
    assert seen == set(want), seen
