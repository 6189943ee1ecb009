"""Kill and resume: a training killed with SIGKILL resumes with --resume from its last checkpoint and reproduces the
uninterrupted run exactly (deterministic mode, CPU): every iteration's losses, the final weights and the final
validation metric. One run is killed from outside in the middle of training, one dies while it writes a checkpoint
(its file writes are cut short by SIGKILL half-way, whatever file the writer opens): the last good checkpoint stays
(atomic replace, outdated checkpoints deleted only after the new one is written) and the resumed run goes on from it.

The smallest demo config (the classifier, tiny widths) on an iteration-based schedule, so that resuming advances
the dataloader mid-epoch; its data pipeline and batch augmentations draw random numbers (RandomResizedCrop with
numpy, Mixup / CutMix with numpy and torch, the shuffling sampler), which the checkpoint's random states must
reproduce. The runs that get killed are forked from this process (tools/train.py's main() in the child, which then
dies by SIGKILL): a fresh interpreter per run would spend most of the test importing the mm stack. Every run uses one
CPU thread (float sums may depend on the thread count; a forked child must not use the parent's OpenMP pool).
"""
import glob
import itertools
import json
import os
import os.path as osp
import random
import signal
import time

import numpy as np
import pytest
import torch
from mmengine.model import BaseModel

from tests.helpers import ROOT, load_tool
from tests.helpers.demo import shared_demo_root

DEMO_CLS = osp.join(ROOT, 'configs', 'demo', 'cls_xcit_s12_poly3_demo.py')
ITERS = 6


class _HalfThenDie:
    """A file whose first write puts half the bytes on disk, then the process gets SIGKILL."""

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


def _fork_train(setup, work, *extra, die_in=None):
    """tools/train.py's main() in a forked child; with ``die_in``, the child's writes to a file whose name holds it
    are cut short half-way by SIGKILL (a death in the middle of writing a checkpoint, however it is written)."""
    pid = os.fork()
    if pid:
        return pid
    code = 70
    try:
        if die_in:
            import builtins
            real_open = builtins.open

            def dying_open(file, mode='r', *args, **kwargs):
                f = real_open(file, mode, *args, **kwargs)
                return _HalfThenDie(f) if 'w' in mode and die_in in os.fspath(file) else f

            builtins.open = dying_open
        code = setup['train'].main([setup['cfg'], '--work-dir', work, *extra, '--cfg-options',
                                    f'visualizer.name=vis_resume_{osp.basename(work)}_{os.getpid()}'])
    except BaseException:
        import traceback
        traceback.print_exc()
    finally:
        os._exit(code)


def _wait(pid, timeout=900):
    """The child's end: -signal number when a signal killed it, else its exit status."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    raise AssertionError(f'the forked training did not end within {timeout} s')


@pytest.fixture(scope='module')
def setup(tmp_path_factory):
    folder = tmp_path_factory.mktemp('resume')
    root = shared_demo_root(tmp_path_factory)
    cfg = folder / 'cls_tiny_iters.py'
    cfg.write_text(f"""_base_ = {DEMO_CLS!r}
data_root = {root!r}
model = dict(backbone=dict(embed_dims=32, depth=2, num_heads=4, cls_attn_layers=1), head=dict(in_channels=32),
             train_cfg=dict(augments=[dict(type='Mixup', alpha=0.8), dict(type='CutMix', alpha=1.0)]))
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
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with pytest.MonkeyPatch.context() as mp:
        for k in ('RANK', 'WORLD_SIZE', 'SOFTFREE_MM_TRACEBACK'):
            mp.delenv(k, raising=False)
        yield dict(cfg=str(cfg), folder=folder, train=load_tool('train'))
    torch.set_num_threads(threads)


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
    rc = setup['train'].main([setup['cfg'], '--work-dir', work, *extra, '--cfg-options',
                              f'visualizer.name=vis_resume_{osp.basename(work)}_{len(extra)}'])
    assert rc == 0


def test_killed_runs_resume_and_reproduce_the_uninterrupted_run(setup):
    folder = setup['folder']
    ref_work = str(folder / 'uninterrupted')
    _train_in_process(setup, ref_work)
    ref_losses, ref_metrics = _losses(ref_work), _metrics(ref_work)
    ref_state = torch.load(osp.join(ref_work, f'iter_{ITERS}.pth'), map_location='cpu')['state_dict']
    assert sorted(ref_losses) == list(range(1, ITERS + 1)) and ref_metrics is not None

    work = str(folder / 'killed')
    # 1. dies while it writes the checkpoint of iteration 4 (half the bytes written, then SIGKILL)
    assert _wait(_fork_train(setup, work, die_in='iter_4.pth')) == -signal.SIGKILL
    assert not osp.exists(osp.join(work, 'iter_4.pth'))  # never appeared under its final name
    assert len(glob.glob(osp.join(work, 'iter_4.pth.tmp-*'))) == 1  # the half-written temporary file
    with open(osp.join(work, 'last_checkpoint')) as f:
        assert osp.basename(f.read().strip()) == 'iter_2.pth'
    assert torch.load(osp.join(work, 'iter_2.pth'), map_location='cpu')['meta']['iter'] == 2  # intact

    # 2. resumes from iteration 2, killed from outside as soon as the checkpoint of iteration 4 is in place
    pid = _fork_train(setup, work, '--resume')
    marker = osp.join(work, 'last_checkpoint')
    deadline = time.time() + 900
    while time.time() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        assert not done, f'the resumed run ended (status {status}) before the checkpoint of iteration 4'
        if osp.isfile(marker) and open(marker).read().strip().endswith('iter_4.pth'):
            break
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    assert _wait(pid, 60) == -signal.SIGKILL

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


# ------------------------------------------------------------------ the reliability hooks on a tiny mmengine Runner
# A one-weight model on a list of numbers: runs in a fraction of a second, so every random stream and every kind of
# non-finite loss gets its own run.
_NAMES = itertools.count()


class _Draws(BaseModel):
    """Each forward draws from Python's random, numpy and torch (as data transforms and batch augmentations do)
    and records the draws."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.draws = []

    def forward(self, inputs, data_samples=None, mode='tensor'):
        d = (random.random(), float(np.random.rand()), float(torch.rand(())))
        self.draws.append(d)
        return dict(loss=((self.w - sum(d)) ** 2).sum())


class _BlowUp(BaseModel):
    """loss (w - 1)^2, multiplied by ``factor`` in forward call ``at``; records w at every forward."""

    def __init__(self, factor, at=3):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.factor, self.at, self.seen = factor, at, []

    def forward(self, inputs, data_samples=None, mode='tensor'):
        self.seen.append(float(self.w))
        loss = ((self.w - 1) ** 2).sum()
        return dict(loss=loss * self.factor if len(self.seen) == self.at else loss)


class _DrawsInValidation(_Draws):
    """:class:`_Draws` whose validation draws from the three generators too (as test-time augmentations may)."""

    def __init__(self):
        super().__init__()
        self.val_draws = []

    def forward(self, inputs, data_samples=None, mode='tensor'):
        if mode == 'predict':
            self.val_draws.append((random.random(), float(np.random.rand()), float(torch.rand(()))))
            return [dict(x=float(v)) for v in inputs]
        return super().forward(inputs, data_samples, mode)


def _validation(every):
    """What a run that validates every ``every`` iterations (epochs) adds to the Runner: 2 batches of 2 samples."""
    from mmengine.evaluator import BaseMetric, Evaluator

    class Seen(BaseMetric):
        def process(self, data_batch, data_samples):
            self.results.extend(data_samples)

        def compute_metrics(self, results):
            return dict(seen=len(results))

    data = [dict(inputs=torch.tensor([float(i)])) for i in range(4)]
    return dict(val_dataloader=dict(dataset=data, sampler=dict(type='DefaultSampler', shuffle=False), batch_size=2,
                                    collate_fn=dict(type='default_collate')),
                val_cfg=dict(type='ValLoop'), val_evaluator=Evaluator([Seen()]), val_interval=every)


def _tiny_runner(work_dir, model, hooks, by_epoch=False, iters=8, ckpt_every=4, resume_from=None, validation=None):
    """2 samples a batch of 4 shuffled ones; ``iters`` iterations (or ``iters // 2`` epochs), a checkpoint every
    ``ckpt_every`` iterations (epochs); seed 0; ``validation``: :func:`_validation`'s additions."""
    from mmengine.runner import Runner
    data = [dict(inputs=torch.tensor([float(i)])) for i in range(4)]
    loop = dict(by_epoch=True, max_epochs=iters // 2) if by_epoch else dict(by_epoch=False, max_iters=iters)
    validation = dict(validation or {})
    if validation:
        loop['val_interval'] = validation.pop('val_interval')
    return Runner(model=model, work_dir=str(work_dir), experiment_name=f'tiny_{next(_NAMES)}', **validation,
                  train_dataloader=dict(dataset=data, sampler=dict(type='DefaultSampler', shuffle=True), batch_size=2,
                                        collate_fn=dict(type='default_collate')),
                  optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.1)), train_cfg=loop,
                  default_hooks=dict(checkpoint=dict(type='CheckpointHook', interval=ckpt_every, by_epoch=by_epoch),
                                     logger=dict(type='LoggerHook', interval=100)),
                  custom_hooks=list(hooks), randomness=dict(seed=0), resume=resume_from is not None,
                  load_from=resume_from, default_scope='mmengine')


@pytest.mark.parametrize('by_epoch', [False, True], ids=['iterations', 'epochs'])
def test_resumed_run_continues_python_numpy_and_torch_random_streams(tmp_path, by_epoch):
    """8 iterations without interruption; then a new run resumed from the checkpoint of iteration 4 (epoch 2) draws
    in iterations 5-8 what the uninterrupted run drew there, from each of the three generators (mmengine's resume
    alone re-seeds them: the draws of iterations 1-4 again)."""
    from softfree_mm.engine.hooks import RNGStateHook
    every = 2 if by_epoch else 4
    whole = _Draws()
    _tiny_runner(tmp_path / 'whole', whole, [RNGStateHook()], by_epoch=by_epoch, ckpt_every=every).train()
    assert len(whole.draws) == 8
    ckpt = tmp_path / 'whole' / ('epoch_2.pth' if by_epoch else 'iter_4.pth')
    resumed = _Draws()
    random.seed(1), np.random.seed(1), torch.manual_seed(1)  # whatever the process held before
    _tiny_runner(tmp_path / 'resumed', resumed, [RNGStateHook()], by_epoch=by_epoch, ckpt_every=every,
                 resume_from=str(ckpt)).train()
    assert len(resumed.draws) == 4
    for i, name in enumerate(('python random', 'numpy', 'torch')):
        assert [d[i] for d in resumed.draws] == [d[i] for d in whole.draws[4:]], name
        assert [d[i] for d in resumed.draws] != [d[i] for d in whole.draws[:4]], name  # not merely re-seeded


@pytest.mark.parametrize('by_epoch', [False, True], ids=['iterations', 'epochs'])
def test_validation_during_training_leaves_the_training_streams_as_a_run_without_it_and_its_resume(tmp_path,
                                                                                                    by_epoch):
    """Validation every 2 iterations (every epoch) that draws from Python's random, numpy and torch: the training
    draws equal those of the same run without validation, and a run resumed from its checkpoint of iteration 4
    (epoch 2) draws in iterations 5-8 what both drew there."""
    from softfree_mm.engine.hooks import RNGStateHook
    every = 2 if by_epoch else 4
    plain = _Draws()
    _tiny_runner(tmp_path / 'plain', plain, [RNGStateHook()], by_epoch=by_epoch, ckpt_every=every).train()
    validated = _DrawsInValidation()
    _tiny_runner(tmp_path / 'validated', validated, [RNGStateHook()], by_epoch=by_epoch, ckpt_every=every,
                 validation=_validation(1 if by_epoch else 2)).train()
    assert len(validated.val_draws) == 4 * 2  # 4 validations of 2 batches: they did draw
    assert validated.draws == plain.draws
    ckpt = tmp_path / 'validated' / ('epoch_2.pth' if by_epoch else 'iter_4.pth')
    resumed = _DrawsInValidation()
    random.seed(1), np.random.seed(1), torch.manual_seed(1)  # whatever the process held before
    _tiny_runner(tmp_path / 'resumed', resumed, [RNGStateHook()], by_epoch=by_epoch, ckpt_every=every,
                 validation=_validation(1 if by_epoch else 2), resume_from=str(ckpt)).train()
    assert len(resumed.val_draws) == 2 * 2
    assert resumed.draws == plain.draws[4:]


@pytest.mark.parametrize('factor', [float('nan'), float('inf'), float('-inf')], ids=['nan', 'inf', '-inf'])
def test_nonfinite_loss_guard_stops_or_skips_nan_inf_and_minus_inf_alike(tmp_path, factor):
    from softfree_mm.engine.errors import NonFiniteLoss
    from softfree_mm.engine.hooks import NonFiniteLossHook
    model = _BlowUp(factor)
    with pytest.raises(NonFiniteLoss, match=rf'^iteration 3: the loss is {factor} \(loss={factor}\); stopped before'
                                            ' the update'):
        _tiny_runner(tmp_path / 'stop', model, [NonFiniteLossHook()], iters=5, ckpt_every=100).train()
    assert len(model.seen) == 3 and float(model.w) == model.seen[2]  # iteration 3 updated nothing
    assert model.seen[2] != model.seen[1]  # the finite ones did

    model, hook = _BlowUp(factor), NonFiniteLossHook(skip=True)
    _tiny_runner(tmp_path / 'skip', model, [hook], iters=5, ckpt_every=100).train()
    assert hook.skipped == [3] and len(model.seen) == 5
    assert model.seen[3] == model.seen[2] and model.seen[4] != model.seen[3] and model.seen[2] != model.seen[1]
