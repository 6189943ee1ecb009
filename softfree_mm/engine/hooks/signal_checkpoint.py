"""``CheckpointOnSignalHook``: a signal (Slurm's warning before a job's time limit, ``sbatch --signal=USR1@300``)
makes the run save a checkpoint at the end of the iteration it is in and stop, so that ``--resume`` (a requeued job)
goes on from there instead of from the last interval checkpoint.

Every process takes the same decision at the same iteration (one all-reduce of a flag per iteration: the signal
reaches the tasks of a job at slightly different moments). An iteration-based run resumes exactly where it stopped;
an epoch-based one keeps its iteration count and redoes the interrupted epoch (mmengine resumes at an epoch's start).
The tools add it when ``SOFTFREE_MM_CHECKPOINT_SIGNAL`` names a signal (``tools/warm_start.py --submit`` sets it).
"""
import os.path as osp
import signal

import torch
from mmengine.hooks import Hook

ENV = 'SOFTFREE_MM_CHECKPOINT_SIGNAL'


def signal_number(name) -> int:
    """'USR1', 'SIGUSR1' or a number -> the signal's number; anything else is a ValueError naming it."""
    text = str(name).strip().upper()
    if text.isdigit():
        return int(text)
    sig = getattr(signal, text if text.startswith('SIG') else f'SIG{text}', None)
    if not isinstance(sig, signal.Signals):
        raise ValueError(f'{ENV}={name!r} is no signal; use a name such as USR1, USR2, TERM, or a number')
    return int(sig)


class CheckpointOnSignalHook(Hook):
    """On ``signal`` (a name such as 'USR1'): a checkpoint at the end of the current iteration, then the run stops
    (``last_checkpoint`` names it, as the interval checkpoints are named)."""

    priority = 'LOWEST'  # after this iteration's own CheckpointHook

    def __init__(self, signal: str = 'USR1'):
        self.signum = signal_number(signal)
        self.name = signal
        self._got = False

    def before_train(self, runner) -> None:
        self._got = False

        def note(signum, frame):
            self._got = True
        signal.signal(self.signum, note)

    def _agreed(self) -> bool:
        from mmengine.dist import all_reduce, get_world_size
        if get_world_size() == 1:
            return self._got
        flag = torch.tensor([1.0 if self._got else 0.0])
        all_reduce(flag, op='max')  # gloo and nccl alike: CPU tensor under gloo, mmengine moves it for nccl
        return bool(flag.item() > 0)

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        if not self._agreed():
            return
        from mmengine.dist import is_main_process
        name = f'iter_{runner.iter + 1}.pth'
        runner.save_checkpoint(runner.work_dir, name, save_optimizer=True, save_param_scheduler=True, by_epoch=False)
        path = osp.join(runner.work_dir, name)
        if is_main_process():
            with open(osp.join(runner.work_dir, 'last_checkpoint'), 'w') as f:
                f.write(path)
        runner.logger.warning(f'SIG{self.name.upper().removeprefix("SIG")} received: saved {path} at iteration '
                              f'{runner.iter + 1}; the run stops here (--resume goes on from it)')
        runner.train_loop.stop_training = True
