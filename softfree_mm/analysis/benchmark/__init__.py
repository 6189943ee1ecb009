"""Speed, memory and FLOPs of attention kernels, backbones and detectors: the code behind ``tools/benchmark.py``.

One module a mode (``kernels``, ``backbones`` with ``flops``, ``comparison``, ``detector``), the reference models
apart (``references``), how things are measured in ``timing`` and written out in ``output``. Every ratio comes from
one run on one machine, the two sides alternating.
"""
