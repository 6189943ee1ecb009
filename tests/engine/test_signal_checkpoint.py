"""The signal that warns a job before its time limit (issue 69): one checkpoint, a stop within the iteration, an exact
resume, for iteration- and epoch-based loops.

A real mmengine Runner on a tiny linear model (8 shuffled samples, 2 a batch, SGD, seed 0): a hook sends the signal to
this process during iteration K; the run saves ``iter_K.pth`` holding iteration K (meta iter = K: the name is not the
previous iteration's), stops there (an epoch-based run too: mmengine alone would run the epoch to its end, saving every
iteration), leaves no epoch checkpoint and runs no validation of the unfinished epoch. A run resumed from that file
trains the batches the uninterrupted run trained after K, in the same order and none twice, and ends at its epoch and
iteration counters with its weights. A run of the hook without a signal (what every tools/train.py run has) resumes
mid-epoch too.
"""
import itertools
import os
import os.path as osp
import signal

import pytest
import torch
from mmengine.hooks import Hook
from mmengine.model import BaseModel

from softfree_mm.engine.hooks import CheckpointOnSignalHook, RNGStateHook
from softfree_mm.engine.hooks.signal_checkpoint import STOPPED

_NAMES = itertools.count()


class _Line(BaseModel):
    """y = w x + b against 2 x + 1, recording the inputs of each training batch."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)  # every run starts from the same weights
        self.lin = torch.nn.Linear(1, 1)
        self.seen = []

    def forward(self, inputs, data_samples=None, mode='tensor'):
        x = inputs.float().view(-1, 1)
        if mode == 'loss':
            self.seen.append(x.view(-1).tolist())
            return dict(loss=((self.lin(x) - (2 * x + 1)) ** 2).mean())
        return [dict(y=float(v)) for v in self.lin(x).view(-1)]


class _SignalAt(Hook):
    """Sends ``signum`` to this process during iteration ``at`` (1-based), before the hooks that look for it."""

    priority = 'VERY_HIGH'

    def __init__(self, at, signum=signal.SIGUSR2):
        self.at, self.signum = at, signum

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        if runner.iter + 1 == self.at:
            os.kill(os.getpid(), self.signum)


def _runner(work_dir, model, hooks, by_epoch, resume_from=None, validate=False):
    from mmengine.evaluator import BaseMetric, Evaluator
    from mmengine.runner import Runner

    class Seen(BaseMetric):
        def process(self, data_batch, data_samples):
            self.results.extend(data_samples)

        def compute_metrics(self, results):
            return dict(seen=len(results))
    data = [dict(inputs=torch.tensor([float(i) / 8])) for i in range(8)]
    loop = dict(by_epoch=True, max_epochs=3) if by_epoch else dict(by_epoch=False, max_iters=12)
    extra = {}
    if validate:
        loop['val_interval'] = 1 if by_epoch else 4
        extra = dict(val_dataloader=dict(dataset=data[:2], sampler=dict(type='DefaultSampler', shuffle=False),
                                         batch_size=2, collate_fn=dict(type='default_collate')),
                     val_cfg=dict(type='ValLoop'), val_evaluator=Evaluator([Seen()]))
    return Runner(model=model, work_dir=str(work_dir), experiment_name=f'signal_{next(_NAMES)}',
                  train_dataloader=dict(dataset=data, sampler=dict(type='DefaultSampler', shuffle=True), batch_size=2,
                                        collate_fn=dict(type='default_collate')),
                  optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.1)), train_cfg=loop,
                  default_hooks=dict(checkpoint=dict(type='CheckpointHook', interval=100, by_epoch=by_epoch),
                                     logger=dict(type='LoggerHook', interval=100)),
                  custom_hooks=list(hooks), randomness=dict(seed=0), resume=resume_from is not None,
                  load_from=resume_from, default_scope='mmengine', **extra)


def _weights(model):
    return torch.cat([p.detach().view(-1) for p in model.parameters()])


@pytest.fixture(autouse=True)
def _default_handler():
    before = signal.getsignal(signal.SIGUSR2)
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)  # a signal outside training must not end the test process
    yield
    signal.signal(signal.SIGUSR2, before)


@pytest.mark.parametrize('by_epoch', [False, True], ids=['iterations', 'epochs'])
def test_the_signal_saves_once_stops_within_the_iteration_and_the_resume_ends_as_the_uninterrupted_run(
        tmp_path, by_epoch):
    whole = _Line()
    _runner(tmp_path / 'whole', whole, [RNGStateHook(), CheckpointOnSignalHook(None)], by_epoch).train()
    assert len(whole.seen) == 12

    stopped = _Line()
    run = _runner(tmp_path / 'stopped', stopped, [RNGStateHook(), CheckpointOnSignalHook('USR2'), _SignalAt(6)],
                  by_epoch, validate=True)
    run.train()
    files = sorted(f for f in os.listdir(tmp_path / 'stopped') if f.endswith('.pth'))
    assert files == ['iter_6.pth'], files  # one checkpoint, no epoch checkpoint of the unfinished epoch
    assert len(stopped.seen) == 6 and run.train_loop.iter == 6  # stopped within iteration 6 (epoch 2, batch 2)
    meta = torch.load(tmp_path / 'stopped' / 'iter_6.pth', map_location='cpu', weights_only=False)['meta']
    assert meta['iter'] == 6 and meta['epoch'] == (1 if by_epoch else 0)
    assert STOPPED == dict(signal=int(signal.SIGUSR2), checkpoint=str(tmp_path / 'stopped' / 'iter_6.pth'), iter=6)
    assert signal.getsignal(signal.SIGUSR2) == signal.SIG_IGN  # the handler before training is back
    assert open(tmp_path / 'stopped' / 'last_checkpoint').read() == str(tmp_path / 'stopped' / 'iter_6.pth')

    resumed = _Line()
    again = _runner(tmp_path / 'resumed', resumed, [RNGStateHook(), CheckpointOnSignalHook('USR2')], by_epoch,
                    resume_from=str(tmp_path / 'stopped' / 'iter_6.pth'))
    again.train()
    assert resumed.seen == whole.seen[6:]  # the batches after the stop, in order, none twice
    assert again.train_loop.iter == 12 and again.train_loop.epoch == (3 if by_epoch else 0)
    assert torch.equal(_weights(resumed), _weights(whole))


def test_a_signal_in_an_epochs_last_batch_ends_the_epoch_and_saves_it_once(tmp_path):
    whole = _Line()
    _runner(tmp_path / 'whole', whole, [RNGStateHook(), CheckpointOnSignalHook(None)], True).train()
    stopped = _Line()
    run = _runner(tmp_path / 'stopped', stopped, [RNGStateHook(), CheckpointOnSignalHook('USR2'), _SignalAt(4)], True)
    run.train()
    files = sorted(f for f in os.listdir(tmp_path / 'stopped') if f.endswith('.pth'))
    assert files == ['epoch_1.pth'] and len(stopped.seen) == 4, files
    meta = torch.load(tmp_path / 'stopped' / 'epoch_1.pth', map_location='cpu', weights_only=False)['meta']
    assert (meta['epoch'], meta['iter']) == (1, 4)
    resumed = _Line()
    again = _runner(tmp_path / 'resumed', resumed, [RNGStateHook(), CheckpointOnSignalHook('USR2')], True,
                    resume_from=str(tmp_path / 'stopped' / 'epoch_1.pth'))
    again.train()
    assert resumed.seen == whole.seen[4:] and (again.train_loop.epoch, again.train_loop.iter) == (3, 12)
    assert torch.equal(_weights(resumed), _weights(whole))


def test_an_epoch_resumed_mid_epoch_without_a_signal_goes_on_at_the_next_batch_and_says_so(tmp_path):
    whole = _Line()
    _runner(tmp_path / 'whole', whole, [CheckpointOnSignalHook(None)], True).train()
    _runner(tmp_path / 'stopped', _Line(), [CheckpointOnSignalHook('USR2'), _SignalAt(3)], True).train()
    resumed = _Line()
    again = _runner(tmp_path / 'resumed', resumed, [CheckpointOnSignalHook(None)], True,
                    resume_from=str(tmp_path / 'stopped' / 'iter_3.pth'))
    again.train()
    assert resumed.seen == whole.seen[3:]
    log = open(again.logger.handlers[-1].baseFilename).read() if hasattr(again.logger.handlers[-1],
                                                                        'baseFilename') else ''
    log = log or ''.join(open(osp.join(r, f)).read() for r, _, fs in os.walk(tmp_path / 'resumed')
                         for f in fs if f.endswith('.log'))
    assert 'resumed mid-epoch: epoch 1 goes on at batch 4 of 4; the 3 batches it trained before the stop are ' \
           'skipped' in log


def test_a_signal_name_that_is_no_signal_is_refused():
    with pytest.raises(ValueError, match=r"SOFTFREE_MM_CHECKPOINT_SIGNAL='USR9' is no signal"):
        CheckpointOnSignalHook('USR9')
