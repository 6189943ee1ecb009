"""How the benchmark measures: time (perf counter, process CPU time, CUDA events), peak memory beyond the inputs,
the bytes autograd saves for backward, and one point run in a fresh process."""
import contextlib
import json
import os
import subprocess
import sys
import time
from typing import Callable, Dict, Sequence

import torch

DTYPES = {'fp32': torch.float32, 'bf16': torch.bfloat16, 'fp16': torch.float16, 'fp64': torch.float64}
PASSES = ('fwd', 'fwdbwd')
CLOCKS = ('wall', 'cpu')


def synchronize(device) -> None:
    if torch.device(device).type == 'cuda':
        torch.cuda.synchronize(device)


def timer(device, clock: str = 'wall') -> str:
    """What :func:`timed` measures with: 'cuda-events' on a CUDA device, else 'process-time' (clock='cpu') or
    'perf-counter'."""
    if clock == 'cpu':
        return 'process-time'
    return 'cuda-events' if torch.device(device).type == 'cuda' else 'perf-counter'


def cuda_event_seconds(fn: Callable, device) -> float:
    """Seconds of the GPU work of one call between two CUDA events on the current stream (the queue is drained
    first, so the start event is not waiting behind earlier work)."""
    synchronize(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def timed(fn: Callable, device, clock: str = 'wall') -> float:
    """Seconds of one call: wall time (device work included; on CUDA between CUDA events), or ``clock='cpu'``:
    this process's CPU time (on a machine shared with other jobs, with one thread, it counts only our own work;
    with several threads it also counts their spinning; CPU devices only)."""
    how = timer(device, clock)
    if how == 'process-time':
        t0 = time.process_time()
        fn()
        return time.process_time() - t0
    if how == 'cuda-events':
        return cuda_event_seconds(fn, device)
    synchronize(device)
    t0 = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - t0


@contextlib.contextmanager
def _quiet_profiler():
    """Kineto writes start/stop lines to stderr (fd 2) on every profile: hide them for the memory runs."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(devnull)
        os.close(saved)


def peak_memory(fn: Callable, device) -> int:
    """Bytes the call holds at its peak beyond what was allocated before it (inputs, weights). CUDA: the
    allocator's peak; CPU: the running sum of the allocations and frees torch's profiler records, at its largest."""
    dev = torch.device(device)
    if dev.type == 'cuda':
        synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        base = torch.cuda.memory_allocated(dev)
        fn()
        synchronize(dev)
        return int(torch.cuda.max_memory_allocated(dev) - base)
    from torch.profiler import ProfilerActivity, profile

    with _quiet_profiler(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == '[memory]' and e.device_type() ==
              torch.autograd.DeviceType.CPU]
    current = peak = 0
    for e in sorted(events, key=lambda e: e.start_ns()):
        current += e.nbytes()
        peak = max(peak, current)
    return int(peak)


def saved_bytes(fn: Callable, storages: bool = False, exclude: Sequence[torch.Tensor] = ()) -> int:
    """Bytes of the distinct tensors autograd saves for backward during ``fn``. ``storages=True``: the bytes those
    saved tensors keep allocated until backward, i.e. each distinct storage counted whole (a saved view keeps its
    whole base), leaving out the storages of ``exclude`` (a model's parameters and buffers, allocated anyway)."""
    total, seen = 0, set()
    skip = {t.untyped_storage().data_ptr() for t in exclude}

    def pack(t):
        nonlocal total
        st = t.untyped_storage()
        key = st.data_ptr() if storages else (st.data_ptr(), t.dtype, tuple(t.shape))
        if key not in seen and not (storages and (key in skip or key == 0)):
            seen.add(key)
            total += st.nbytes() if storages else t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return total


def in_fresh_process(mode: str, spec: Dict, failed: Dict) -> Dict:
    """The row that ``python -m softfree_mm.analysis.benchmark MODE JSON`` prints for one point, measured in a
    process of its own (one point's peak memory and caches do not reach the next); ``failed`` with the last line
    of its stderr as ``error`` where it printed none."""
    proc = subprocess.run([sys.executable, '-m', __package__, mode, json.dumps(spec)], capture_output=True,
                          text=True, env=dict(os.environ, PYTHONWARNINGS='ignore'))
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith('{')]
    if proc.returncode != 0 or not lines:
        return dict(failed, error=(proc.stderr.strip().splitlines() or ['no output'])[-1])
    return json.loads(lines[-1])
