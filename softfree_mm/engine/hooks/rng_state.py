"""``RNGStateHook``: kill-and-resume that reproduces the uninterrupted run's random streams.

Each checkpoint also holds every process's generator states (Python, numpy, torch CPU and CUDA); a resumed run
restores them where the uninterrupted run had them: right before the next batch is fetched, after mmengine's loop
has skipped the trained batches (re-running their data transforms moves the random state). Validation inside
training runs on its own copy, so it does not shift the training stream.
"""
import random

import numpy as np
import torch
from mmengine.hooks import Hook


def capture_rng() -> dict:
    state = dict(python=random.getstate(), numpy=np.random.get_state(), torch=torch.get_rng_state())
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        # this process's device only (every device's state would open a CUDA context on each GPU in every process)
        state['cuda'] = torch.cuda.get_rng_state()
    return state


def restore_rng(state: dict) -> None:
    random.setstate(state['python'])
    np.random.set_state(state['numpy'])
    torch.set_rng_state(state['torch'])
    cuda = state.get('cuda')
    if cuda is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(cuda)


def _rng_to_checkpoint(state: dict) -> dict:
    """A form torch's weights-only loader accepts: tensors, lists, ints, strings."""
    py = state['python']
    name, keys, pos, has_gauss, gauss = state['numpy']
    out = dict(python=[py[0], list(py[1]), py[2]],
               numpy=dict(name=name, keys=torch.from_numpy(np.asarray(keys, dtype=np.int64)), pos=int(pos),
                          has_gauss=int(has_gauss), gauss=float(gauss)),
               torch=state['torch'])
    if 'cuda' in state:
        out['cuda'] = state['cuda']
    return out


def _rng_from_checkpoint(saved: dict) -> dict:
    py = saved['python']
    npy = saved['numpy']
    state = dict(python=(py[0], tuple(py[1]), py[2]),
                 numpy=(npy['name'], npy['keys'].cpu().numpy().astype(np.uint32), npy['pos'], npy['has_gauss'],
                        npy['gauss']),
                 torch=saved['torch'].cpu())
    if 'cuda' in saved:
        state['cuda'] = saved['cuda'].cpu()
    return state


class _RestoreAfter:
    """Wraps the loop's dataloader iterator: after ``skip`` batches (mmengine's advance past the trained data),
    the random state is restored, then the wrapper steps aside."""

    def __init__(self, loop, skip: int, state: dict):
        self.loop, self.inner, self.skip, self.state = loop, loop.dataloader_iterator, skip, state
        if skip == 0:
            self._restore()

    def _restore(self):
        restore_rng(self.state)
        self.loop.dataloader_iterator = self.inner

    def __iter__(self):
        return self

    def __next__(self):
        batch = next(self.inner)
        self.skip -= 1
        if self.skip == 0:
            self._restore()
        return batch


class RNGStateHook(Hook):
    """Saves every process's random states in each checkpoint and restores them on resume where the uninterrupted
    run had them; validation during training runs on a copy of the random state (it leaves the training stream
    alone, as a resumed run has no validation to replay)."""

    priority = 'VERY_HIGH'
    KEY = 'softfree_mm_rng'

    def __init__(self):
        self._resumed = None  # states read from the checkpoint, not yet restored
        self._val_state = None  # the training stream's state while validation runs
        self._gathered = None  # every rank's state, gathered for rank 0's checkpoint

    # -- saving
    def _mine(self) -> dict:
        return self._val_state if self._val_state is not None else capture_rng()

    def _gather(self):
        from mmengine.dist import all_gather_object, get_world_size
        if get_world_size() > 1:
            self._gathered = [_rng_to_checkpoint(s) for s in all_gather_object(self._mine())]

    def _checkpoint_due(self, runner, by_epoch: bool) -> bool:
        from mmengine.hooks import CheckpointHook
        for h in runner.hooks:
            if isinstance(h, CheckpointHook) and h.by_epoch == by_epoch and h.interval > 0:
                if by_epoch and (h.every_n_epochs(runner, h.interval, h.save_begin)
                                 or (h.save_last and h.is_last_train_epoch(runner))):
                    return True
                if not by_epoch and (h.every_n_train_iters(runner, h.interval, h.save_begin)
                                     or (h.save_last and h.is_last_train_iter(runner))):
                    return True
        return False

    def gather_for_checkpoint(self) -> None:
        """Every rank, before a checkpoint saved outside the CheckpointHook's schedule (a collective): the next
        checkpoint holds every process's state."""
        self._gather()

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        # all ranks, before the CheckpointHook (rank 0 only) saves: a collective is allowed here
        if self._checkpoint_due(runner, by_epoch=False):
            self._gather()

    def after_train_epoch(self, runner) -> None:
        if self._checkpoint_due(runner, by_epoch=True):
            self._gather()

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        checkpoint[self.KEY] = self._gathered or [_rng_to_checkpoint(self._mine())]
        self._gathered = None

    # -- validation during training: on its own random state
    def before_val(self, runner) -> None:
        if getattr(runner, '_softfree_mm_training', False):
            self._val_state = capture_rng()
            self._gather()  # a best checkpoint may be saved during validation

    def after_val(self, runner) -> None:
        if self._val_state is not None:
            restore_rng(self._val_state)
            self._val_state = None

    def before_train(self, runner) -> None:
        runner._softfree_mm_training = True

    def after_train(self, runner) -> None:
        runner._softfree_mm_training = False

    # -- resuming
    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        states = checkpoint.get(self.KEY)
        if not states:
            return
        from mmengine.dist import get_rank, get_world_size
        if len(states) != get_world_size():
            runner.logger.warning(f'the checkpoint holds the random states of {len(states)} processes, this run has '
                                  f'{get_world_size()}: the resumed run continues with fresh random states')
            return
        self._resumed = _rng_from_checkpoint(states[get_rank()])

    def before_train_epoch(self, runner) -> None:
        if self._resumed is None:
            return
        state, self._resumed = self._resumed, None
        loop = runner.train_loop
        if hasattr(loop, 'dataloader_iterator'):  # iteration based: the loop now skips loop.iter batches
            loop.dataloader_iterator = _RestoreAfter(loop, loop.iter, state)
        else:  # epoch based: resumed at an epoch's start, before the epoch's iterator exists
            restore_rng(state)
