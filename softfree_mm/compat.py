"""Named repairs of the frozen OpenMMLab stack (mmengine 0.10.7, mmcv 2.1.0) on a current torch.

Each repair is one function that says what it fixes and why, applied once when ``softfree_mm`` is imported
(:func:`apply_all`, :data:`APPLIED`), and tested in tests/test_compat.py and tests/test_compat_ops.py.
"""
import functools
import os

import numpy as np
import torch

from .files import atomic_write

APPLIED = []
CHECKPOINT_SAFE_GLOBALS = []  # what allow_mmengine_checkpoint_types adds to torch's weights-only unpickler


def _numpy_safe_globals():
    # numpy scalars pickle as multiarray.scalar(dtype, bytes); numpy 2 moved numpy.core to numpy._core
    core = np._core if hasattr(np, '_core') else np.core
    dtype_classes = [type(np.dtype(t)) for t in
                     (np.float16, np.float32, np.float64, np.int8, np.int16, np.int32, np.int64, np.uint8,
                      np.bool_, np.complex64, np.complex128)]
    return [(core.multiarray.scalar, 'numpy.core.multiarray.scalar'), core.multiarray.scalar,
            (core.multiarray._reconstruct, 'numpy.core.multiarray._reconstruct'), core.multiarray._reconstruct,
            np.ndarray, np.dtype, *dtype_classes]


def allow_mmengine_checkpoint_types():
    """Since torch 2.6 ``torch.load`` defaults to ``weights_only=True``, and an mmengine checkpoint holds numpy
    scalars / dtypes and mmengine's ``HistoryBuffer``, so ``--resume``, tools/test.py and ``init_cfg`` of such files
    fail. Exactly those types are allow-listed in torch's safe unpickler (files from elsewhere keep the protection);
    a HistoryBuffer's pickled state leaves out its table of functions (pickled through ``getattr``, which must never
    be allow-listed), rebuilt on load."""
    from mmengine.logging import HistoryBuffer

    def __getstate__(self):
        # the statistics table holds functions (pickled via builtins.getattr): leave it to the class
        return {k: v for k, v in self.__dict__.items() if k != '_statistics_methods'}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._set_default_statistics()

    HistoryBuffer.__getstate__ = __getstate__
    HistoryBuffer.__setstate__ = __setstate__
    safe = [HistoryBuffer, *_numpy_safe_globals()]
    CHECKPOINT_SAFE_GLOBALS[:] = safe
    torch.serialization.add_safe_globals(safe)
    APPLIED.append('allow_mmengine_checkpoint_types')


def init_dist_without_cuda():
    """mmengine's torchrun and slurm start-ups call ``torch.cuda.set_device`` unconditionally ("Found no NVIDIA
    driver" on CPU machines); without CUDA that call is skipped and gloo replaces nccl (which needs CUDA)."""
    from mmengine.dist import utils as dist_utils

    def cpu_safe(original):
        if getattr(original, '_softfree_mm_patched', False):
            return original

        @functools.wraps(original)
        def init(backend, *args, **kwargs):
            if torch.cuda.is_available():
                return original(backend, *args, **kwargs)
            set_device = torch.cuda.set_device
            torch.cuda.set_device = lambda device: None
            try:
                return original('gloo' if backend == 'nccl' else backend, *args, **kwargs)
            finally:
                torch.cuda.set_device = set_device

        init._softfree_mm_patched = True
        return init

    dist_utils._init_dist_pytorch = cpu_safe(dist_utils._init_dist_pytorch)
    dist_utils._init_dist_slurm = cpu_safe(dist_utils._init_dist_slurm)
    APPLIED.append('init_dist_without_cuda')


# ----------------------------------------------------------------------------------- mmcv ops on torchvision
ROUTED_OPS = ('nms', 'roi_align_forward', 'roi_align_backward')
ROUTE_ENV = 'SOFTFREE_MM_TORCHVISION_OPS'


def mmcv_ext_is_standin() -> bool:
    """Whether ``mmcv._ext`` is softfree_mm's stand-in (mmcv-lite, the default set-up) rather than compiled ops."""
    from .mmcv_ext import is_standin
    try:
        import mmcv._ext as ext
    except ImportError:
        return False
    return is_standin(ext)


@functools.lru_cache(maxsize=None)
def mmcv_has_cuda_ops() -> bool:
    """Whether the installed mmcv was compiled with CUDA ops."""
    try:
        from mmcv.ops import get_compiling_cuda_version
    except ImportError:
        return False
    return get_compiling_cuda_version() not in ('not available', '')


class TorchvisionOps:
    """Stands in for a compiled mmcv's extension module (``ext_module``) inside ``mmcv.ops.nms`` and
    ``mmcv.ops.roi_align``. ``nms``, ``roi_align_forward`` and ``roi_align_backward`` run on the stand-in's
    torchvision kernels (softfree_mm/mmcv_ext/ops.py) when :meth:`routes` says so (CUDA tensors and an mmcv without
    CUDA ops, or forced), else on mmcv's; every other name is mmcv's. ``calls`` counts the calls each way:
    ``('torchvision', 'nms')``, ``('mmcv', 'nms')``..."""

    def __init__(self, ext):
        from .mmcv_ext import ops as standin
        self._ext = ext
        self._standin = standin
        self.calls = {}
        self.logged = False

    def __getattr__(self, name):
        if name in ROUTED_OPS:
            return functools.partial(self._call, name)
        return getattr(self._ext, name)

    def routes(self, t) -> bool:
        mode = os.environ.get(ROUTE_ENV, '')
        if mode == '1':
            return True
        if mode == '0':
            return False
        return t.is_cuda and not mmcv_has_cuda_ops()

    def _call(self, name, first, *args, **kwargs):
        how = 'torchvision' if self.routes(first) else 'mmcv'
        self.calls[(how, name)] = self.calls.get((how, name), 0) + 1
        if how == 'torchvision' and not self.logged:
            self.logged = True
            from mmengine.logging import print_log
            why = 'forced by ' + ROUTE_ENV if os.environ.get(ROUTE_ENV) == '1' else 'mmcv was built without CUDA ops'
            print_log(f'[softfree_mm] mmcv nms / roi_align run on torchvision\'s kernels ({why}); see '
                      'softfree_mm/compat.py', logger='current', level=30)
        return getattr(self._standin if how == 'torchvision' else self._ext, name)(first, *args, **kwargs)


TORCHVISION_OPS = None


def mmcv_ops_on_torchvision():
    """A compiled mmcv 2.1.0 built without nvcc has CPU ops only, so a Mask R-CNN on CUDA dies at its first NMS.
    The shipped configs call exactly three compiled ops (``nms``, ``roi_align_forward`` / ``_backward``; UperNet,
    Semantic FPN and the classifiers none): one :class:`TorchvisionOps` replaces ``ext_module`` in
    ``mmcv.ops.nms`` and ``mmcv.ops.roi_align`` (where every caller ends), and routes CUDA calls to torchvision's
    kernels, which compute the same. ``SOFTFREE_MM_TORCHVISION_OPS=1`` routes every call (CPU too; for tests),
    ``=0`` none. Not needed, and not applied, where ``mmcv._ext`` is the stand-in (every op already runs on
    torchvision, on every device)."""
    global TORCHVISION_OPS
    import importlib
    try:
        import torchvision  # noqa: F401  (registers torch.ops.torchvision)
        modules = [importlib.import_module(f'mmcv.ops.{name}') for name in ('nms', 'roi_align')]
    except ImportError:  # no mmcv ops or no torchvision: nothing to route
        return
    if mmcv_ext_is_standin():
        return
    ext = modules[0].ext_module
    TORCHVISION_OPS = ext if isinstance(ext, TorchvisionOps) else TorchvisionOps(ext)
    for mod in modules:
        mod.ext_module = TORCHVISION_OPS
    APPLIED.append('mmcv_ops_on_torchvision')


# ----------------------------------------------------------------------------------- atomic checkpoints
def checkpoints_replace_atomically():
    """mmengine writes a checkpoint straight into its final file, and its CheckpointHook deletes the outdated ones
    (``max_keep_ckpts``, the previous best) BEFORE writing the new one: a job killed during the save kept no usable
    checkpoint. Local files are now written by :func:`atomic_write`, and the outdated checkpoints are deleted only
    after the new one and ``last_checkpoint`` are written."""
    from mmengine.fileio.backends.local_backend import LocalBackend
    from mmengine.hooks import CheckpointHook

    if not getattr(LocalBackend.put, '_softfree_mm_patched', False):
        def put(self, obj, filepath):
            atomic_write(obj, str(filepath))

        def put_text(self, obj, filepath, encoding='utf-8'):
            atomic_write(obj.encode(encoding), str(filepath))

        put._softfree_mm_patched = True
        LocalBackend.put, LocalBackend.put_text = put, put_text

    def deletes_after(original):
        if getattr(original, '_softfree_mm_patched', False):
            return original

        @functools.wraps(original)
        def save(self, runner, *args, **kwargs):
            backend, deferred = self.file_backend, []
            if 'remove' in vars(backend):  # inside another deferring save: that one deletes at its end
                return original(self, runner, *args, **kwargs)
            backend.remove = lambda path: deferred.append(('remove', path))
            backend.rmtree = lambda path: deferred.append(('rmtree', path))
            try:
                original(self, runner, *args, **kwargs)
            finally:  # the instance attributes go; the class's methods are back
                del backend.remove, backend.rmtree
            for how, path in deferred:  # only once the new checkpoint is safely written
                getattr(backend, how)(path)

        save._softfree_mm_patched = True
        return save

    CheckpointHook._save_checkpoint_with_step = deletes_after(CheckpointHook._save_checkpoint_with_step)
    CheckpointHook._save_best_checkpoint = deletes_after(CheckpointHook._save_best_checkpoint)
    APPLIED.append('checkpoints_replace_atomically')


def distutils_for_mmengine():
    """mmengine 0.10.7's ``collect_env`` (the environment every Runner logs at its start) imports ``distutils``, which
    Python 3.12 removed from the standard library. setuptools (a requirement) carries it and serves it through the
    shim its ``distutils-precedence.pth`` installs, which does not run where site-packages' .pth files are not read
    (an environment that sees the packages through another folder). There the same shim is put in place; it imports
    nothing until ``distutils`` is imported."""
    import sys
    if sys.version_info >= (3, 12) and not any(type(f).__name__ == 'DistutilsMetaFinder' for f in sys.meta_path):
        try:
            import _distutils_hack
        except ImportError:  # no setuptools at all: mmengine's own error stays
            return
        _distutils_hack.add_shim()
    APPLIED.append('distutils_for_mmengine')


def apply_all():
    if APPLIED:
        return APPLIED
    distutils_for_mmengine()
    allow_mmengine_checkpoint_types()
    init_dist_without_cuda()
    mmcv_ops_on_torchvision()
    checkpoints_replace_atomically()
    return APPLIED


apply_all()
