"""Checkpoints a run can trust: the newest readable one to resume from, a file refused with one line when it is
corrupt or belongs to another model, and the temporaries of a save that died (the atomic replace is compat.py's)."""
import glob
import os
import os.path as osp
import re
from typing import List, Optional

import torch

from .errors import BadInput


def _readable(path: str) -> bool:
    try:
        torch.load(path, map_location='cpu')
        return True
    except Exception:
        return False


def latest_checkpoint(work_dir: str, check: bool = True) -> Optional[str]:
    """The checkpoint to resume from: the one ``last_checkpoint`` names when it exists (and loads, with
    ``check``), else the newest ``iter_*.pth`` / ``epoch_*.pth`` that does."""
    from softfree_mm.models.converters import checkpoints_in
    return next((p for p in checkpoints_in(work_dir) if not check or _readable(p)), None)


def remove_stale_temporaries(work_dir: str) -> List[str]:
    """Temporary checkpoint files left by a process that died while saving."""
    from softfree_mm.files import TMP_MARK
    gone = []
    for path in glob.glob(osp.join(work_dir, f'*{TMP_MARK}*')):
        pid = path.rsplit(TMP_MARK, 1)[-1]
        if pid.isdigit() and int(pid) != os.getpid() and not osp.exists(f'/proc/{pid}'):
            os.remove(path)
            gone.append(path)
    return gone


def load_state_dict_of(path: str) -> dict:
    """The weights in a checkpoint file; BadInput naming the file when it cannot be read."""
    try:
        ckpt = torch.load(path, map_location='cpu')
    except Exception as e:
        first = re.split(r'(?<=[.:])\s', ' '.join(str(e).split()), maxsplit=1)[0]  # torch's first sentence
        raise BadInput(f'checkpoint {path} cannot be read (corrupt, truncated, or not a PyTorch checkpoint): '
                       f'{type(e).__name__}: {first[:200]}') from None
    state = ckpt.get('state_dict', ckpt) if isinstance(ckpt, dict) else None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        held = sorted(ckpt)[:5] if isinstance(ckpt, dict) else type(ckpt).__name__
        raise BadInput(f'checkpoint {path} holds no state_dict of tensors (keys: {held})')
    return {re.sub(r'^module\.', '', k): v for k, v in state.items()}


CHECK_MODES = ('resume', 'test', 'load')


def check_checkpoint(path: str, model: torch.nn.Module, mode: str) -> None:
    """The checkpoint is readable and belongs to this model. ``'resume'``: every weight of the model, each of its
    shape (resuming continues the same model); ``'test'``: no weight of another shape and at least half of the
    model's weights (evaluating a partly random model reports garbage); ``'load'`` (load_from in training, e.g.
    fine-tuning with another number of classes): at least one weight of the model, name and shape (mmengine warns
    about the rest). In every mode a softfree_mm backbone's weights of another architecture are one error naming
    it and the fitting preset. An empty state_dict passes (nothing to load)."""
    if mode not in CHECK_MODES:
        raise ValueError(f'check_checkpoint: mode must be one of {CHECK_MODES}, got {mode!r}')
    state = load_state_dict_of(path)
    if not state:
        return
    from ..models.converters import check_model_checkpoint
    try:  # a backbone of other depths / widths / heads: one error naming them (not every weight of another shape)
        check_model_checkpoint(model, state, path)
    except ValueError as e:
        raise BadInput(' '.join(str(e).split())) from None
    own = model.state_dict()
    shared = [k for k in own if k in state]
    wrong = [f'{k} {tuple(state[k].shape)} vs {tuple(own[k].shape)}' for k in shared
             if tuple(state[k].shape) != tuple(own[k].shape)]
    missing = [k for k in own if k not in state]
    fitting = len(shared) - len(wrong)
    bad = {'resume': bool(wrong or missing), 'test': bool(wrong) or len(shared) < 0.5 * len(own),
           'load': fitting == 0}[mode]
    if bad:
        parts = []
        if wrong:
            parts.append(f'{len(wrong)} weights of another shape (e.g. {wrong[0]})')
        if missing:
            parts.append(f"{len(missing)} of the model's {len(own)} weights missing (e.g. {missing[0]})")
        extra = [k for k in state if k not in own]
        if extra:
            parts.append(f'{len(extra)} unknown to the model (e.g. {extra[0]})')
        raise BadInput(f'checkpoint {path} does not fit this model: {"; ".join(parts)}; it belongs to another '
                       'model or config')


def read_meta(path: str) -> dict:
    """A checkpoint's ``meta``, read with ``weights_only=True`` (nothing is executed; mmengine's own types are
    allowed by softfree_mm.compat), memory-mapped where torch can (the optimiser is not read into memory)."""
    import softfree_mm.compat  # noqa: F401  (mmengine's own types in the weights-only unpickler)
    try:
        ckpt = torch.load(path, map_location='cpu', weights_only=True, mmap=True)
    except (TypeError, RuntimeError):  # a torch without mmap, a file of the legacy format
        ckpt = torch.load(path, map_location='cpu', weights_only=True)
    return (ckpt.get('meta') if isinstance(ckpt, dict) else None) or {}
