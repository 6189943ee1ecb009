"""Kill and resume: a training killed with SIGKILL resumes with --resume from its last checkpoint and reproduces the
uninterrupted run exactly (deterministic mode, CPU): every iteration's losses, the final weights and the final
validation metric. One run is killed from outside in the middle of training, one dies while it writes a checkpoint
(its file writes are cut short by SIGKILL half-way, whatever file the writer opens): the last good checkpoint stays
(atomic replace, outdated checkpoints deleted only after the new one is written) and the resumed run goes on from it.

The smallest demo config (the classifier, tiny widths) on an iteration-based schedule, so that resuming advances
the dataloader mid-epoch; its data pipeline and batch augmentations draw random numbers (RandomResizedCrop, Mixup
/ CutMix), which the checkpoint's random states must reproduce.
"""
import glob
import importlib.util
import json
import os
import os.path as osp
import signal
import subprocess
import sys
import time

import pytest
import torch

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, osp.join(ROOT, 'tests'))
from _shared_demo import shared_demo_root  # noqa: E402

DEMO_CLS = osp.join(ROOT, 'configs', 'demo', 'cls_xcit_s12_poly3_demo.py')
ITERS = 6

# a script that runs a tool with every write to a file whose name holds MARK cut short: half the bytes reach the
# file, then the process gets SIGKILL (a death in the middle of writing a checkpoint, however it is written)
DIE_IN_SAVE = '''
import builtins, os, runpy, signal, sys
mark, tool = sys.argv[1], sys.argv[2]
real_open = builtins.open

class HalfThenDie:
    def __init__(self, f):
        self.f = f
    def write(self, data):
        self.f.write(data[:len(data) // 2])
        self.f.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    def __enter__(self):
        return self
    def __exit__(self, *exc):
        return self.f.__exit__(*exc)
    def __getattr__(self, name):
        return getattr(self.f, name)

def dying_open(file, mode='r', *args, **kwargs):
    f = real_open(file, mode, *args, **kwargs)
    return HalfThenDie(f) if 'w' in mode and mark in os.fspath(file) else f

builtins.open = dying_open
sys.argv = [tool] + sys.argv[3:]
runpy.run_path(tool, run_name='__main__')
'''


def _load_tool(name):
    sys.path.insert(0, osp.join(ROOT, 'tools'))
    spec = importlib.util.spec_from_file_location(f'softfree_tool_{name}', osp.join(ROOT, 'tools', f'{name}.py'))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope='module')
def setup(tmp_path_factory):
    folder = tmp_path_factory.mktemp('resume')
    root = shared_demo_root(tmp_path_factory)
    cfg = folder / 'cls_tiny_iters.py'
    cfg.write_text(f"""_base_ = {DEMO_CLS!r}
data_root = {root!r}
model = dict(backbone=dict(embed_dims=32, depth=2, num_heads=4, cls_attn_layers=1), head=dict(in_channels=32))
train_dataloader = dict(batch_size=4, sampler=dict(type='InfiniteSampler', shuffle=True),
                        dataset=dict(data_root=data_root, indices=12))
val_dataloader = dict(batch_size=4, dataset=dict(data_root=data_root, indices=8))
test_dataloader = val_dataloader
train_cfg = dict(_delete_=True, type='IterBasedTrainLoop', max_iters={ITERS}, val_interval={ITERS})
param_scheduler = [dict(type='LinearLR', start_factor=0.1, by_epoch=False, begin=0, end={ITERS})]
default_hooks = dict(logger=dict(interval=1), checkpoint=dict(by_epoch=False, interval=2, max_keep_ckpts=1))
log_processor = dict(by_epoch=False, window_size=1)
randomness = dict(seed=0, deterministic=True)
""")
    # the same number of CPU threads in every run: float sums may depend on it
    env = dict(os.environ, OMP_NUM_THREADS=str(torch.get_num_threads()))
    for k in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'SOFTFREE_MM_TRACEBACK'):
        env.pop(k, None)
    script = folder / 'die_in_save.py'
    script.write_text(DIE_IN_SAVE)
    return dict(cfg=str(cfg), folder=folder, env=env, script=str(script), train=_load_tool('train'))


def _losses(work):
    """{iteration: logged values} over every run in the work dir (a killed run's logged iterations included)."""
    out = {}
    for path in glob.glob(osp.join(work, '*', 'vis_data', 'scalars.json')):
        with open(path) as f:
            for line in f:
                rec = json.loads(line)
                if 'loss' in rec:
                    it = rec['step']
                    vals = {k: v for k, v in rec.items() if k.startswith('loss') or k in ('lr', 'grad_norm')}
                    assert out.setdefault(it, vals) == vals, f'iteration {it} logged twice with different values'
    return out


def _metrics(work):
    for path in sorted(glob.glob(osp.join(work, '*', 'vis_data', 'scalars.json'))):
        with open(path) as f:
            for line in f:
                rec = json.loads(line)
                if 'accuracy/top1' in rec:
                    return rec
    return None


def _train_in_process(setup, work, *extra):
    torch.set_num_threads(int(setup['env']['OMP_NUM_THREADS']))
    rc = setup['train'].main([setup['cfg'], '--work-dir', work, *extra, '--cfg-options',
                              f'visualizer.name=vis_resume_{osp.basename(work)}_{len(extra)}'])
    assert rc == 0


def _spawn(setup, work, *extra, die_in=None):
    args = [sys.executable]
    if die_in:
        args += [setup['script'], die_in]
    args += [osp.join(ROOT, 'tools', 'train.py'), setup['cfg'], '--work-dir', work, *extra]
    return subprocess.Popen(args, env=setup['env'], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_killed_runs_resume_and_reproduce_the_uninterrupted_run(setup):
    folder = setup['folder']
    ref_work = str(folder / 'uninterrupted')
    _train_in_process(setup, ref_work)
    ref_losses, ref_metrics = _losses(ref_work), _metrics(ref_work)
    ref_state = torch.load(osp.join(ref_work, f'iter_{ITERS}.pth'), map_location='cpu')['state_dict']
    assert sorted(ref_losses) == list(range(1, ITERS + 1)) and ref_metrics is not None

    work = str(folder / 'killed')
    # 1. dies while it writes the checkpoint of iteration 4 (half the bytes written, then SIGKILL)
    proc = _spawn(setup, work, die_in='iter_4.pth')
    out, err = proc.communicate(timeout=900)
    assert proc.returncode == -signal.SIGKILL, err[-3000:]
    assert not osp.exists(osp.join(work, 'iter_4.pth'))  # never appeared under its final name
    assert len(glob.glob(osp.join(work, 'iter_4.pth.tmp-*'))) == 1  # the half-written temporary file
    with open(osp.join(work, 'last_checkpoint')) as f:
        assert osp.basename(f.read().strip()) == 'iter_2.pth'
    assert torch.load(osp.join(work, 'iter_2.pth'), map_location='cpu')['meta']['iter'] == 2  # intact

    # 2. resumes from iteration 2, killed from outside as soon as the checkpoint of iteration 4 is in place
    proc = _spawn(setup, work, '--resume')
    marker = osp.join(work, 'last_checkpoint')
    deadline = time.time() + 900
    while time.time() < deadline and proc.poll() is None:
        if osp.isfile(marker) and open(marker).read().strip().endswith('iter_4.pth'):
            break
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    proc.kill()
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL

    # 3. resumes again and finishes
    _train_in_process(setup, work, '--resume')
    losses = _losses(work)
    assert not glob.glob(osp.join(work, '*.tmp-*'))  # the dead process's temporary file is cleaned up on resume
    assert sorted(losses) == list(range(1, ITERS + 1))
    for it in ref_losses:
        assert losses[it] == ref_losses[it], f'iteration {it}: {losses[it]} != {ref_losses[it]}'
    assert _metrics(work)['accuracy/top1'] == ref_metrics['accuracy/top1']
    state = torch.load(osp.join(work, f'iter_{ITERS}.pth'), map_location='cpu')['state_dict']
    assert state.keys() == ref_state.keys()
    for k in ref_state:
        assert torch.equal(state[k], ref_state[k]), k
