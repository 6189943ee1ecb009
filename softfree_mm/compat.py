"""Named repairs of the frozen OpenMMLab stack (mmengine 0.10.7, mmcv 2.1.0) on a current torch.

Each repair is a function, applied once when ``softfree_mm`` is imported, and tested in tests/test_compat.py.

1. ``allow_mmengine_checkpoint_types``: since torch 2.6 ``torch.load`` defaults to ``weights_only=True``, and a
   checkpoint that mmengine saves holds numpy scalars/dtypes and mmengine's ``HistoryBuffer`` (message hub), so
   ``--resume``, ``tools/test.py`` and ``init_cfg`` of such files fail. We allow-list exactly those types in torch's
   safe unpickler; nothing else is unpickled, so files from elsewhere keep the weights-only protection. A
   HistoryBuffer also pickled its class-level table of statistics functions through ``getattr`` (which must never
   be allow-listed): its pickled state now leaves that table out (it is rebuilt on load).
2. ``init_dist_without_cuda``: mmengine's ``_init_dist_pytorch`` and ``_init_dist_slurm`` call
   ``torch.cuda.set_device`` unconditionally ("Found no NVIDIA driver" on CPU machines). Without CUDA we skip it
   and use the gloo backend.
"""
import functools

import numpy as np
import torch

APPLIED = []


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
    torch.serialization.add_safe_globals(safe)
    APPLIED.append('allow_mmengine_checkpoint_types')


def init_dist_without_cuda():
    """mmengine's torchrun and slurm start-ups call ``torch.cuda.set_device`` unconditionally; without CUDA we
    skip that call and use gloo instead of nccl (which cannot run without CUDA)."""
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


def apply_all():
    if APPLIED:
        return APPLIED
    allow_mmengine_checkpoint_types()
    init_dist_without_cuda()
    return APPLIED


apply_all()
