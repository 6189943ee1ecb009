"""The Runner's set-up and run for tools/train.py and tools/test.py: the reliability hooks, building, running with
errors sorted into config errors (before the run starts) and the rest, and a clean end of a distributed job."""
import os

from mmengine.config import Config
from mmengine.hooks import Hook

from .config_checks import unknown_types
from .data_errors import data_file_error
from .errors import BadInput, NonFiniteLoss, UsageError, short_error


def add_reliability_hooks(cfg: Config, skip_nonfinite_loss: bool = False) -> None:
    """The RNG-state hook (kill-and-resume reproduces) and the non-finite-loss guard, unless the config has them."""
    hooks = list(cfg.get('custom_hooks') or [])
    names = {h.get('type') for h in hooks if isinstance(h, dict)}
    if 'RNGStateHook' not in names:
        hooks.append(dict(type='RNGStateHook'))
    if 'NonFiniteLossHook' not in names:
        hooks.append(dict(type='NonFiniteLossHook', skip=skip_nonfinite_loss))
    elif skip_nonfinite_loss:
        for h in hooks:
            if isinstance(h, dict) and h.get('type') == 'NonFiniteLossHook':
                h['skip'] = True
    cfg.custom_hooks = hooks


def enable_auto_scale_lr(cfg: Config) -> None:
    asl = cfg.get('auto_scale_lr')
    if not asl or 'base_batch_size' not in asl:
        raise UsageError('--auto-scale-lr: the config has no auto_scale_lr=dict(base_batch_size=...)')
    cfg.auto_scale_lr.enable = True


def build_runner(cfg: Config):
    from mmengine.registry import RUNNERS
    from mmengine.runner import Runner
    if 'runner_type' in cfg:
        return RUNNERS.build(cfg)
    return Runner.from_cfg(cfg)


class _RunStarted(Hook):
    """Marks the end of the Runner's lazy building: Runner.train() / test() build loops, dataloaders, datasets,
    evaluators, optimizer and schedulers before they call the before_run hooks."""

    def __init__(self):
        self.started = False

    def before_run(self, runner) -> None:
        self.started = True


def run(runner, method: str, config: str):
    """``runner.train()`` or ``runner.test()``; an error before the run starts is a config error (UsageError),
    one after it propagates unchanged. SOFTFREE_MM_TRACEBACK=1 re-raises config errors too."""
    mark = _RunStarted()
    runner.register_hook(mark, priority='LOWEST')
    try:
        return getattr(runner, method)()
    except (BadInput, NonFiniteLoss):
        raise
    except Exception as e:
        line = None if os.environ.get('SOFTFREE_MM_TRACEBACK') else data_file_error(e)
        if line:
            raise BadInput(line) from None
        if mark.started or os.environ.get('SOFTFREE_MM_TRACEBACK'):
            raise
        msg = short_error(e)
        if isinstance(e, TypeError) and 'None is not a callable' in msg:  # what mmengine says for an unknown optimizer
            keys = ('optim_wrapper', 'param_scheduler')
            unknown = [f'{path}={name!r}' for path, name in unknown_types(runner.cfg, keys)]
            if unknown:
                msg += f' (not a registered type: {", ".join(unknown)})'
        raise UsageError(f'{config}: {msg} (SOFTFREE_MM_TRACEBACK=1 shows the traceback)') from None


def finish_dist() -> None:
    """Wait for every process, then tear the process group down (a rank left with a live group may abort on
    exit)."""
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


RANK_ENV = ('RANK', 'SLURM_PROCID', 'OMPI_COMM_WORLD_RANK')


def print_error(line: str, every_rank: bool = False) -> None:
    """``error: line`` on stderr: once for a job (rank 0) when every process meets the same error (a config or
    device error, a non-finite loss all ranks agreed on), on each rank for an error of its own (a bad file in its
    shard of the data)."""
    import sys
    rank = next((os.environ[k] for k in RANK_ENV if k in os.environ), '0')
    if every_rank or rank == '0':
        print(f'error: {line}', file=sys.stderr)


def short_error(e: BaseException) -> str:
    msg = ' '.join(str(e).split())
    return f'{type(e).__name__}: {msg}' if msg else type(e).__name__
