"""Long runs that survive: kill-and-resume that reproduces the uninterrupted run, and bad inputs that stop with one
line without losing work. tools/train.py and tools/test.py install these; each piece is usable on its own.

- :class:`RNGStateHook`: the checkpoint also holds every process's random number generator states (torch CPU and
  CUDA, numpy, Python); a resumed run restores them at the moment the uninterrupted run had them, right before it
  fetches the next batch (after mmengine's loop has advanced the dataloader past the trained batches, which re-runs
  the data transforms and moves their random state). Validation inside training runs on its own copy of the random
  state, so it does not shift the training stream. With mmengine's resume (weights, optimizer, schedulers,
  iteration counter, message hub) and a fixed seed, a run killed at any moment and resumed with ``--resume`` gives
  the losses and metrics of the uninterrupted run (deterministic mode; exact on CPU, tests/test_tools_resume.py).
- :class:`NonFiniteLossHook`: a NaN / inf loss stops the run before the update (weights and checkpoints untouched)
  with the iteration and the loss terms, or, with ``skip=True``, skips that update and goes on.
- :func:`name_failing_samples`: an error while loading or transforming a sample names its file
  (a truncated or unreadable image, a missing segmentation map) instead of failing deep in a transform.
- :func:`data_file_error`: the annotation file behind an error raised while a dataset loads its annotations.
- :func:`latest_checkpoint`, :func:`check_checkpoint`: resume from the newest readable checkpoint; refuse a
  corrupt file or one of another model with one line.
"""
import glob
import math
import os
import os.path as osp
import random
import re
import traceback
from typing import Dict, Iterator, List, Optional

import numpy as np
import torch
from mmengine.hooks import Hook


class BadInput(Exception):
    """A data file, annotation file or checkpoint that cannot be used; the message is one line naming it."""


class NonFiniteLoss(Exception):
    """The loss of an iteration is NaN or inf; the message names the iteration and the loss terms."""


def _short(e: BaseException, limit: int = 300) -> str:
    msg = ' '.join(str(e).split())
    msg = f'{type(e).__name__}: {msg}' if msg else type(e).__name__
    return msg if len(msg) <= limit else msg[:limit - 3] + '...'


# ------------------------------------------------------------------------------------------------- RNG states
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


# --------------------------------------------------------------------------------------------- non-finite loss
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


def error_line(e: BaseException) -> str:
    """The one line of a BadInput / NonFiniteLoss, also when a DataLoader worker re-raised it with the worker's
    traceback in the message."""
    msg = str(e)
    if 'Original Traceback' in msg:
        m = re.search(r'(?:BadInput|NonFiniteLoss): (.+?)\s*$', msg.strip())
        if m:
            return m.group(1)
    return ' '.join(msg.split())


# ------------------------------------------------------------------------------------------------ data errors
IMAGE_KEYS = ('img_path', 'seg_map_path', 'filename', 'img_file')


def _jpeg_cut_short(data: bytes) -> bool:
    """True when a JPEG's image data has no end-of-image marker: the marker segments are walked up to the first
    start-of-scan (so EXIF thumbnails do not count), and the scan data must be followed by FF D9 (entropy-coded data
    never holds it). Data after the marker (motion photos, trailers) is fine."""
    i, n = 2, len(data)
    while i + 4 <= n:
        if data[i] != 0xFF:
            return False  # not the layout expected here: the decoder decides
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
        elif marker == 0xDA:  # start of scan
            return data.find(b'\xff\xd9', i + 2) < 0
        elif marker in (0x01, 0xD8) or 0xD0 <= marker <= 0xD7:  # markers without a length
            i += 2
        else:
            i += 2 + int.from_bytes(data[i + 2:i + 4], 'big')
    return True  # the file ends before its image data


def _truncated(data: bytes) -> Optional[str]:
    """Why image bytes are cut short, or None: a JPEG whose scan has no end marker, a PNG without its IEND chunk."""
    if data[:2] == b'\xff\xd8':
        return 'truncated JPEG (no end-of-image marker)' if _jpeg_cut_short(data) else None
    if data[:8] == b'\x89PNG\r\n\x1a\n':
        return None if data.rfind(b'IEND') > 8 else 'truncated PNG (no IEND chunk)'
    return None


def name_failing_samples() -> None:
    """An error while a dataset loads a sample names the sample's file (all mmengine BaseDataset subclasses:
    mmdet, mmseg, mmpretrain); image bytes that are cut short raise instead of decoding a partly grey image."""
    import mmcv
    from mmengine.dataset import BaseDataset
    if getattr(BaseDataset.__getitem__, '_softfree_mm_patched', False):
        return
    getitem = BaseDataset.__getitem__

    def named_getitem(self, idx):
        try:
            return getitem(self, idx)
        except BadInput:
            raise
        except Exception as e:
            try:
                info = self.get_data_info(idx)
            except Exception:
                info = {}
            files = [str(info[k]) for k in IMAGE_KEYS if info.get(k)]
            what = files[0] if files else f'sample {idx} of {type(self).__name__}'
            raise BadInput(f'{what}: {_short(e)}') from e

    named_getitem._softfree_mm_patched = True
    BaseDataset.__getitem__ = named_getitem

    imfrombytes = mmcv.imfrombytes

    def checked_imfrombytes(content, *args, **kwargs):
        why = _truncated(content) if isinstance(content, (bytes, bytearray)) else None
        if why:
            raise ValueError(f'cannot decode the image: {why}')
        img = imfrombytes(content, *args, **kwargs)
        if img is None:
            raise ValueError('cannot decode the image (not an image, or a corrupt one)')
        return img

    mmcv.imfrombytes = checked_imfrombytes
    import mmcv.image
    mmcv.image.imfrombytes = checked_imfrombytes


COCO_FIELDS = dict(images=('id', 'file_name', 'width', 'height'),
                   annotations=('id', 'image_id', 'category_id', 'bbox'), categories=('id', 'name'))


def json_problem(path: str) -> Optional[str]:
    """What is wrong with a JSON annotation file (read only once something failed): invalid JSON, or for a COCO
    file a missing list or a record without a required field; None when nothing is found."""
    import json
    try:
        with open(path) as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        return f'not valid JSON ({e})'
    except (OSError, UnicodeDecodeError) as e:
        return f'cannot be read ({_short(e, 120)})'
    if not isinstance(data, dict) or not any(k in data for k in COCO_FIELDS):
        return None
    for key, fields in COCO_FIELDS.items():
        records = data.get(key)
        if not isinstance(records, list):
            return f"a field is missing: no {key!r} list (a COCO file needs {', '.join(COCO_FIELDS)})"
        for i, rec in enumerate(records):
            missing = [f for f in fields if not isinstance(rec, dict) or f not in rec]
            if missing:
                rid = rec.get('id') if isinstance(rec, dict) else None
                return f"a field is missing: {key}[{i}] (id {rid}) has no {', '.join(repr(m) for m in missing)}"
    return None


def _chain(e: BaseException) -> Iterator[BaseException]:
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def data_file_error(e: BaseException) -> Optional[str]:
    """One line naming the annotation file when ``e`` was raised while a dataset loaded its annotations (invalid
    JSON, a missing field...), else None."""
    from mmengine.dataset import BaseDataset
    for exc in _chain(e):
        if isinstance(exc, BadInput):
            return str(exc)
        for frame, _ in traceback.walk_tb(exc.__traceback__):
            ds = frame.f_locals.get('self')
            if isinstance(ds, BaseDataset) and frame.f_code.co_name in ('full_init', 'load_data_list',
                                                                        'parse_data_info'):
                ann = getattr(ds, 'ann_file', '') or getattr(ds, 'data_root', '')
                problem = json_problem(ann) if str(ann).endswith('.json') and osp.isfile(ann) else None
                if problem is None:
                    kind = 'a field is missing: ' if isinstance(exc, KeyError) else ''
                    problem = f'{kind}{_short(exc)}'
                return f'{ann}: cannot read the annotations of {type(ds).__name__}: {problem}'
    # a worker process re-raises with the original traceback as text: our BadInput line is its last line
    for exc in _chain(e):
        m = re.search(r'BadInput: (.+)$', str(exc).strip())
        if m:
            return m.group(1).strip()
    return None


# ------------------------------------------------------------------------------------------------ checkpoints
_CKPT_RE = re.compile(r'^(?:iter|epoch)_(\d+)\.pth$')


def _readable(path: str) -> bool:
    try:
        torch.load(path, map_location='cpu')
        return True
    except Exception:
        return False


def latest_checkpoint(work_dir: str, check: bool = True) -> Optional[str]:
    """The checkpoint to resume from: the one ``last_checkpoint`` names when it exists (and loads, with
    ``check``), else the newest ``iter_*.pth`` / ``epoch_*.pth`` that does."""
    named = None
    marker = osp.join(work_dir, 'last_checkpoint')
    if osp.isfile(marker):
        with open(marker) as f:
            named = f.read().strip() or None
    if named and osp.isfile(named) and (not check or _readable(named)):
        return named
    found = []
    for path in glob.glob(osp.join(work_dir, '*.pth')):
        m = _CKPT_RE.match(osp.basename(path))
        if m:
            found.append((int(m.group(1)), osp.getmtime(path), path))
    for _, _, path in sorted(found, reverse=True):
        if not check or _readable(path):
            return path
    return None


def remove_stale_temporaries(work_dir: str) -> List[str]:
    """Temporary checkpoint files left by a process that died while saving."""
    from softfree_mm.compat import TMP_MARK
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
        raise BadInput(f'checkpoint {path} holds no state_dict of tensors (keys: {sorted(ckpt)[:5] if isinstance(ckpt, dict) else type(ckpt).__name__})')
    return {re.sub(r'^module\.', '', k): v for k, v in state.items()}


CHECK_MODES = ('resume', 'test', 'load')


def check_checkpoint(path: str, model: torch.nn.Module, mode: str) -> None:
    """The checkpoint is readable and belongs to this model. ``'resume'``: every weight of the model, each of its
    shape (resuming continues the same model); ``'test'``: no weight of another shape and at least half of the
    model's weights (evaluating a partly random model reports garbage); ``'load'`` (load_from in training, e.g.
    fine-tuning with another number of classes): at least one weight of the model, name and shape (mmengine warns
    about the rest). An empty state_dict passes (nothing to load)."""
    if mode not in CHECK_MODES:
        raise ValueError(f'check_checkpoint: mode must be one of {CHECK_MODES}, got {mode!r}')
    state = load_state_dict_of(path)
    if not state:
        return
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
