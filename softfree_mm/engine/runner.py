"""The Runner's set-up and run for tools/train.py and tools/test.py: the reliability hooks, building, running with
errors sorted into config errors (before the run starts) and the rest, the one-line reports, and a clean end of
a distributed job."""
import os
import os.path as osp
import sys
from typing import Tuple

from mmengine.config import Config
from mmengine.hooks import Hook

from .config_checks import check_launcher, load_config, unknown_types
from .data_errors import data_file_error
from .errors import BadInput, NonFiniteLoss, UsageError, error_line, short_error


def tool_config(tool: str, args) -> Tuple[Config, str]:
    """The config every run of tools/train.py or tools/test.py starts from: the launcher's environment, the device
    and the config file (with --cfg-options) checked, the launcher and the work dir set; and the device ('cuda' or
    'cpu'). ``args``: the tool's config, cfg_options, launcher, device and work_dir."""
    from .device import select_device
    check_launcher(args.launcher, tool)
    on = select_device(args.device, args.launcher)
    cfg = load_config(args.config, args.cfg_options)
    cfg.launcher = args.launcher
    if args.work_dir is not None:
        cfg.work_dir = args.work_dir
    elif cfg.get('work_dir') is None:
        cfg.work_dir = osp.join('./work_dirs', osp.splitext(osp.basename(args.config))[0])
    return cfg, on


SIGNAL_ENV = 'SOFTFREE_MM_CHECKPOINT_SIGNAL'  # a signal name: the run saves a checkpoint and stops when it comes


def add_reliability_hooks(cfg: Config, skip_nonfinite_loss: bool = False) -> None:
    """The RNG-state hook (kill-and-resume reproduces), the non-finite-loss guard and the hook that resumes a
    mid-epoch checkpoint mid-epoch, unless the config has them; with ``SOFTFREE_MM_CHECKPOINT_SIGNAL`` set (e.g.
    USR2), that hook also saves a checkpoint and stops on that signal."""
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
    on_signal = os.environ.get(SIGNAL_ENV) or None
    if 'CheckpointOnSignalHook' not in names:
        # every training: a resume from a mid-epoch checkpoint goes on mid-epoch; with SOFTFREE_MM_CHECKPOINT_SIGNAL
        # (a job warned before its time limit), that signal saves and stops
        from .hooks.signal_checkpoint import signal_number
        try:
            on_signal is None or signal_number(on_signal)
        except ValueError as e:
            raise UsageError(str(e)) from None
        hooks.append(dict(type='CheckpointOnSignalHook', signal=on_signal))
    cfg.custom_hooks = hooks


def enable_auto_scale_lr(cfg: Config) -> None:
    asl = cfg.get('auto_scale_lr')
    if not asl or 'base_batch_size' not in asl:
        raise UsageError('--auto-scale-lr: the config has no auto_scale_lr=dict(base_batch_size=...)')
    cfg.auto_scale_lr.enable = True


def build_runner(cfg: Config):
    """The Runner of ``cfg``; its work dir gets versions.json (the libraries and softfree_mm's commit; rank 0)."""
    from mmengine.registry import RUNNERS
    from mmengine.runner import Runner
    runner = RUNNERS.build(cfg) if 'runner_type' in cfg else Runner.from_cfg(cfg)
    if getattr(runner, 'rank', 0) == 0:
        from .versions import write_versions
        write_versions(runner.work_dir, carried_from=(runner.work_dir, ))  # its earlier runs' sets are kept
    return runner


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
    rank = next((os.environ[k] for k in RANK_ENV if k in os.environ), '0')
    if every_rank or rank == '0':
        print(f'error: {line}', file=sys.stderr)


class one_line_errors:
    """``with one_line_errors(config, setup=True) as step: ...``: an error the tools report in one line is printed
    (``error: ...`` on stderr, once per job or on each rank for a rank's own bad file) and ``step.status`` becomes 2;
    any other error propagates. ``setup``: a KeyError / ValueError / TypeError too, which while the parts are built
    means a setting was rejected (e.g. a kernel the backbone cannot use); SOFTFREE_MM_TRACEBACK=1 re-raises it."""

    def __init__(self, config: str, setup: bool = False):
        self.config, self.setup, self.status = config, setup, 0

    def __enter__(self):
        return self

    def __exit__(self, kind, e, tb) -> bool:
        if e is None:
            return False
        if isinstance(e, UsageError):
            print_error(str(e))
        elif isinstance(e, BadInput):
            print_error(error_line(e), every_rank=True)
        elif isinstance(e, NonFiniteLoss):
            print_error(error_line(e))
        elif self.setup and isinstance(e, (KeyError, ValueError, TypeError)) \
                and not os.environ.get('SOFTFREE_MM_TRACEBACK'):
            print(f'error: {self.config}: {short_error(e)} (SOFTFREE_MM_TRACEBACK=1 shows the traceback)',
                  file=sys.stderr)
        else:
            return False
        self.status = 2
        return True
