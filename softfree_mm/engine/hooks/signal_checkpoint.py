"""``CheckpointOnSignalHook``: a signal (a cluster's warning before a job's time limit: submitit's USR2 for
``tools/warm_start.py --submit``, or ``sbatch --signal=USR1@300`` for a job of one's own) makes the run save one
checkpoint at the end of the iteration it is in and stop, so that ``--resume`` (a requeued job) goes on from there.

- Every process takes the same decision at the same iteration (one all-reduce of a flag per iteration: the signal
  reaches the tasks of a job at slightly different moments); each process's random state goes into the checkpoint
  (:class:`RNGStateHook`'s gather, as for an interval checkpoint).
- The checkpoint is ``iter_<N>.pth`` holding iteration N (mmengine counts N iterations done in its meta); a signal
  in an epoch's last batch lets the epoch end as usual and saves ``epoch_<E>.pth`` at its end (or takes the
  CheckpointHook's, when it saved that epoch).
- **Iteration-based loops** stop at once (mmengine's loop checks ``stop_training`` after every iteration) and resume
  exactly there.
- **Epoch-based loops** (the Mask R-CNN configs) check ``stop_training`` only between epochs in mmengine: this hook
  gives the running loop an epoch that stops within the iteration, skips the epoch's validation (the epoch did not
  end) and does not count the epoch as done. A run resumed from such a checkpoint continues mid-epoch: the batches
  the epoch trained before the stop are skipped by index (the sampler's order for that epoch is drawn again, the
  skipped batches are not loaded) and nothing is repeated, so the run ends at the uninterrupted run's epoch and
  iteration counters. The log says which batches were skipped. This holds for any resume from a mid-epoch
  checkpoint of a run that has this hook (the tools add it to every training, see :func:`add_signal_hook`).
- After training the signal's previous handler is put back; :data:`STOPPED` records the stop (the signal and the
  checkpoint) for the process that runs the training in-process (``softfree_mm.engine.chain_job``: submitit's
  handler then requeues the job).

The tools give the hook its signal when ``SOFTFREE_MM_CHECKPOINT_SIGNAL`` names one; without it the hook only does
the mid-epoch resume.
"""
import math
import os.path as osp
import signal as signals
import time
from itertools import islice
from types import MethodType
from typing import Dict, Optional

import torch
from mmengine.hooks import Hook

ENV = 'SOFTFREE_MM_CHECKPOINT_SIGNAL'
STOPPED: Dict = {}  # after a stop on the signal: {'signal': number, 'checkpoint': path, 'iter': N}


def signal_number(name) -> int:
    """'USR1', 'SIGUSR1' or a number -> the signal's number; anything else is a ValueError naming it."""
    text = str(name).strip().upper()
    if text.isdigit():
        return int(text)
    sig = getattr(signals, text if text.startswith('SIG') else f'SIG{text}', None)
    if not isinstance(sig, signals.Signals):
        raise ValueError(f'{ENV}={name!r} is no signal; use a name such as USR1, USR2, TERM, or a number')
    return int(sig)


class _SkipBatches:
    """A batch sampler that drops the first ``skip`` batches of its next pass (indices drawn, no data loaded)."""

    def __init__(self, inner, skip: int):
        self.inner, self.skip = inner, skip

    def __iter__(self):
        return islice(iter(self.inner), self.skip, None)

    def __len__(self):
        return len(self.inner)


def _stoppable_run_epoch(loop) -> None:
    """mmengine's ``EpochBasedTrainLoop.run_epoch`` that stops within the iteration ``stop_training`` is set in and
    starts a resumed epoch at the batch after the last one trained."""
    runner = loop.runner
    runner.call_hook('before_train_epoch')
    runner.model.train()
    skip, loop._softfree_mm_skip = getattr(loop, '_softfree_mm_skip', 0), 0
    loader = loop.dataloader
    sampler = getattr(loader, 'batch_sampler', None)
    if skip and sampler is not None:  # DataLoader refuses a new batch_sampler through its own __setattr__
        object.__setattr__(loader, 'batch_sampler', _SkipBatches(sampler, skip))
    try:
        batches = iter(loader)
        if skip and sampler is None:  # no batch sampler to skip by index: the batches are loaded and dropped
            for _ in range(skip):
                next(batches)
        per_epoch = len(loader)
        for idx, data_batch in enumerate(batches, start=skip):
            loop.run_iter(idx, data_batch)
            if loop.stop_training and idx + 1 < per_epoch:  # at the epoch's last batch the epoch ends as usual
                loop.val_begin = math.inf  # no validation after an epoch that did not end
                return
    finally:
        if skip and sampler is not None:
            object.__setattr__(loader, 'batch_sampler', sampler)
    runner.call_hook('after_train_epoch')
    loop._epoch += 1


class CheckpointOnSignalHook(Hook):
    """On ``signal`` (a name such as 'USR2'; None: no signal, the mid-epoch resume only): one checkpoint at the end
    of the current iteration, then the run stops (``last_checkpoint`` names it, as the interval checkpoints are
    named). See the module's text for epoch-based loops."""

    priority = 'LOWEST'  # after this iteration's own CheckpointHook

    def __init__(self, signal: Optional[str] = 'USR1'):
        self.signum = signal_number(signal) if signal is not None else None
        self.name = (signals.Signals(self.signum).name if self.signum in set(signals.Signals) else str(self.signum)) \
            if self.signum is not None else None
        self._got = False
        self._previous = None
        self._at_epoch_end = None  # the time a signal came at an epoch's last batch (saved at the epoch's end)

    def before_train(self, runner) -> None:
        self._got = False
        STOPPED.clear()
        from mmengine.runner import EpochBasedTrainLoop
        loop = runner.train_loop
        # mmengine's epoch loop (a loop class with its own run_epoch keeps it: it may stop only between epochs)
        if isinstance(loop, EpochBasedTrainLoop) and type(loop).run_epoch is EpochBasedTrainLoop.run_epoch:
            loop.run_epoch = MethodType(_stoppable_run_epoch, loop)
            per_epoch = len(loop.dataloader)
            skip = loop._iter - loop._epoch * per_epoch
            if 0 < skip < per_epoch:
                loop._softfree_mm_skip = skip
                runner.logger.info(f'resumed mid-epoch: epoch {loop._epoch + 1} goes on at batch {skip + 1} of '
                                   f'{per_epoch}; the {skip} batches it trained before the stop are skipped (drawn '
                                   'in the same order, not loaded), nothing is repeated')
        if self.signum is not None:
            self._previous = signals.signal(self.signum, self._note)

    def _note(self, signum, frame) -> None:
        self._got = True

    def after_train(self, runner) -> None:
        if self.signum is not None and self._previous is not None:
            signals.signal(self.signum, self._previous)  # e.g. submitit's handler, which requeues the job
            self._previous = None

    def _agreed(self) -> bool:
        from mmengine.dist import all_reduce, get_world_size
        if get_world_size() == 1:
            return self._got
        flag = torch.tensor([1.0 if self._got else 0.0])
        all_reduce(flag, op='max')  # gloo and nccl alike: CPU tensor under gloo, mmengine moves it for nccl
        return bool(flag.item() > 0)

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        loop = runner.train_loop
        if self.signum is None or loop.stop_training or not self._agreed():
            return
        done = runner.iter + 1  # mmengine counts this iteration after the hooks; its meta says iter = done
        note = ''
        if not hasattr(loop, 'dataloader_iterator'):  # epoch-based
            per_epoch = len(loop.dataloader)
            batch = done - runner.epoch * per_epoch
            if batch >= per_epoch:  # the epoch's last batch: it ends as usual, saved at its end
                self._at_epoch_end = time.time()
                loop.stop_training = True
                return
            note = f' (epoch {runner.epoch + 1}, batch {batch} of {per_epoch}: a resume goes on at the next batch)'
        self._save(runner, f'iter_{done}.pth', False, done, note)

    def after_train_epoch(self, runner) -> None:
        if not self._at_epoch_end:
            return
        flagged, self._at_epoch_end = self._at_epoch_end, None
        name = f'epoch_{runner.epoch + 1}.pth'
        path = osp.join(runner.work_dir, name)
        if osp.isfile(path) and osp.getmtime(path) >= flagged - 1:  # the CheckpointHook saved this epoch just now
            self._stopped(runner, path, runner.iter, ' (the end of an epoch: its own checkpoint)')
            return
        self._save(runner, name, True, runner.iter, ' (the end of an epoch)')

    def _save(self, runner, name: str, by_epoch: bool, done: int, note: str) -> None:
        from mmengine.dist import is_main_process

        from .rng_state import RNGStateHook
        for hook in runner.hooks:  # every process's random state, as for an interval checkpoint (a collective)
            if isinstance(hook, RNGStateHook):
                hook.gather_for_checkpoint()
        runner.save_checkpoint(runner.work_dir, name, save_optimizer=True, save_param_scheduler=True,
                               by_epoch=by_epoch)
        path = osp.join(runner.work_dir, name)
        if is_main_process():
            with open(osp.join(runner.work_dir, 'last_checkpoint'), 'w') as f:
                f.write(path)
        self._stopped(runner, path, done, note)

    def _stopped(self, runner, path: str, done: int, note: str) -> None:
        runner.logger.warning(f'SIG{self.name.removeprefix("SIG")} received: saved {path} at iteration {done}{note}; '
                              'the run stops here (--resume goes on from it)')
        STOPPED.update(signal=self.signum, checkpoint=path, iter=done)
        self._got = False
        runner.train_loop.stop_training = True
