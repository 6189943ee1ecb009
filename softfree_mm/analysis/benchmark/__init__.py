"""Speed, memory and FLOPs of attention kernels, backbones and detectors: the code behind ``tools/benchmark.py``.

One module a mode (``kernels``, ``backbones`` with ``flops``, ``comparison``, ``detector``), the reference models
apart (``references``), how things are measured in ``timing`` and written out in ``output``. Every ratio comes from
one run on one machine, the two sides alternating.
"""
# every name that tools/, the tests and the docs used from the former one-file module
from .backbones import (BACKBONE_COLUMNS, backbone_point, backbone_presets, build_backbone,  # noqa: F401
                        flops_table, run_backbones)
from .comparison import COMPARE_COLUMNS, compare, kept_for_backward  # noqa: F401
from .detector import (DETECTOR_COLUMNS, DETECTOR_KERNELS, DETECTOR_SIZE, DETECTORS, detector_batch,  # noqa: F401
                       detector_config, detector_point, detector_ratios, run_detectors)
from .kernels import (IO_TENSORS, KERNEL_COLUMNS, build_kernel, crossover, device_ceilings,  # noqa: F401
                      fit_slope, io_bytes, kernel_label, run_kernels, scaling)
from .output import markdown, plot, write_csv  # noqa: F401
from .references import (MMDET_BACKBONES, PARITY_SIZE, REFERENCES, mmdet_pvt_to_official,  # noqa: F401
                         official_deconvs, reference_pair)
from .timing import (CLOCKS, DTYPES, PASSES, cuda_event_seconds, in_fresh_process, peak_memory,  # noqa: F401
                     saved_bytes, synchronize, timed, timer)
