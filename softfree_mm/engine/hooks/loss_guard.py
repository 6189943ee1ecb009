"""``NonFiniteLossHook``: a NaN / inf loss stops the run before the update (weights and checkpoints untouched),
naming the iteration and the loss terms, or with ``skip=True`` skips that update and goes on."""
import math
from typing import Dict, List

import torch
from mmengine.hooks import Hook

from ..checkpoints import latest_checkpoint
from ..errors import NonFiniteLoss


class NonFiniteLossHook(Hook):
    """Checks the loss before every update. NaN or inf: raise :class:`NonFiniteLoss` naming the iteration and the
    loss terms (nothing is updated, no checkpoint is written), or with ``skip=True`` skip that update, log it and
    go on. All processes take the same decision (one all-reduce of a flag per iteration)."""

    priority = 'VERY_HIGH'

    def __init__(self, skip: bool = False):
        if not isinstance(skip, bool):
            raise TypeError(f'NonFiniteLossHook: skip must be True or False, got {skip!r}')
        self.skip = skip
        self.skipped: List[int] = []
        self._terms: Dict[str, float] = {}

    def before_train(self, runner) -> None:
        from mmengine.model import is_model_wrapper
        from mmengine.optim import OptimWrapper
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        wrapper = runner.optim_wrapper
        if not isinstance(wrapper, OptimWrapper) or getattr(wrapper, '_softfree_mm_guarded', False):
            return
        parse_losses = model.parse_losses

        def parse_and_keep(losses):
            parsed, log_vars = parse_losses(losses)
            self._terms = log_vars
            return parsed, log_vars

        model.parse_losses = parse_and_keep
        update_params = wrapper.update_params

        def guarded(loss, step_kwargs=None, zero_kwargs=None):
            if self._all_finite(loss):
                return update_params(loss, step_kwargs=step_kwargs, zero_kwargs=zero_kwargs)
            it = runner.iter + 1
            terms = ', '.join(f'{k}={float(v):.4g}' for k, v in self._terms.items() if 'loss' in k)
            if not self.skip:
                raise NonFiniteLoss(self._message(runner, it, loss, terms))
            self.skipped.append(it)
            runner.logger.warning(f'iteration {it}: the loss is not finite ({terms}); update skipped '
                                  f'({len(self.skipped)} skipped so far)')
            from mmengine.dist import get_world_size
            if get_world_size() > 1:  # DDP expects a backward in every iteration: a zero one, then no step
                wrapper.backward(loss * 0.0)
            else:
                wrapper._inner_count += 1
            wrapper.zero_grad()

        wrapper.update_params = guarded
        wrapper._softfree_mm_guarded = True

    @staticmethod
    def _all_finite(loss) -> bool:
        ok = torch.isfinite(loss.detach()).all().to(torch.float32)
        from mmengine.dist import all_reduce, get_world_size
        if get_world_size() > 1:
            all_reduce(ok, op='min')
        return bool(ok.item() > 0)

    @staticmethod
    def _message(runner, it, loss, terms) -> str:
        value = float(loss.detach().float().sum()) if loss.numel() else float('nan')
        kind = 'nan' if math.isnan(value) else ('-inf' if value < 0 else 'inf') if math.isinf(value) else 'not finite'
        last = latest_checkpoint(runner.work_dir, check=False)
        kept = f'the last checkpoint {last} is kept' if last else 'no checkpoint was written yet'
        amp = ''
        wrapper = runner.optim_wrapper
        if type(wrapper).__name__ == 'AmpOptimWrapper' and getattr(wrapper, 'cast_dtype', None) in (None,
                                                                                                   torch.float16):
            amp = ('; under --amp float16 a value beyond 65504 overflows to inf: try --amp-dtype bfloat16 or no '
                   '--amp')
        return (f'iteration {it}: the loss is {kind} ({terms}); stopped before the update, {kept}{amp}; '
                '--skip-nonfinite-loss skips such updates instead')
