"""What each kernel costs as images grow (``tools/benchmark.py backbone --layouts ...``): backbones in the layouts their
detection and segmentation configs use (``cost_layouts.py``), per kernel, inference time and peak memory at growing
image sizes (forward + backward at the smallest), whole Mask R-CNN and Semantic FPN points beside them; each case in a
process of its own under a time limit and a memory limit (over either: a row saying so), the CSV appended row by row and
a finished case never measured again; the crossover with softmax and the largest size each kernel runs.

Memory: the limit is enforced from outside, on the case's process: its resident set size is read from /proc every
20 ms and the process is killed above the limit; the figure reported is the process's own peak resident set size
during the timed passes (VmHWM, reset before them), minus its resident size before them (weights, inputs,
libraries): what the pass itself added. On a GPU (``--device cuda``, ``--dtype bf16`` under autocast) the figure is
the CUDA allocator's peak beyond what was allocated before the passes, and the time CUDA events'.
"""
import json
import os
import os.path as osp
import signal
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

from ..rss import reset_peak, status_kib
from .cost_layouts import layout_backbone, layout_class, model_config

COCO_ASPECT = 1333 / 800
SHORT_SIDES = (512, 800, 1024)
LARGE_SIDE = 1600  # for the kernels still within the limits at the largest of SHORT_SIDES
SEG_SIZE = (512, 2048)
MODELS = (('maskrcnn', 'swin_t', 'softmax'), ('maskrcnn', 'swin_t', 'linear'), ('semfpn', 'swin_t', 'softmax'),
          ('semfpn', 'swin_t', 'linear'))
# class: the declared class of the backbone's kernels (``layout_class``), read when the row is measured
COLUMNS = ('what', 'layout', 'kernel', 'config', 'pass', 'size', 'short_side', 'status', 'ms', 'peak_MiB',
           'rss_MiB', 'error', 'tensor_MiB', 'class')


def coco_size(short: int) -> Tuple[int, int]:
    """(h, w) of a landscape COCO image of short side ``short`` (1333:800), both multiples of 32 as the pipelines
    pad them."""
    def up(x):
        return int(-(-x // 32) * 32)
    return up(short), up(round(short * COCO_ASPECT))


# ---------------------------------------------------------------------------------------------- one case
def _rss_kib(pid: int, field: str = 'VmRSS') -> int:
    return status_kib(pid, field) or 0


def measure_case(spec: dict) -> dict:
    """In this process (the case's own): build, one warm-up pass, then ``repeats`` timed passes; the peak resident
    memory the pass adds."""
    import statistics

    import torch

    import softfree_mm  # noqa: F401

    from .timing import DTYPES, peak_memory, timed
    torch.manual_seed(0)
    h, w = spec['size']
    passes = spec['pass']
    device = spec.get('device', 'cpu')
    dtype = DTYPES[spec.get('dtype', 'fp32')]
    cuda = torch.device(device).type == 'cuda'
    if spec['what'] == 'backbone':
        from mmengine.registry import DefaultScope

        from ...registry import MODELS
        with DefaultScope.overwrite_default_scope('softfree_mm'):
            model = MODELS.build(spec['cfg'])
        model.to(device).train()  # BN with batch statistics, as in training
        x = torch.randn(1, 3, h, w, device=device)

        def step():
            if passes == 'fwd':
                with torch.no_grad():
                    model(x)
            else:
                model.zero_grad(set_to_none=True)
                outs = model(x)
                sum(o.float().sum() for o in outs).backward()
    else:
        model, step = _whole_model(spec)

    def run():
        if dtype in (torch.bfloat16, torch.float16):
            with torch.autocast(torch.device(device).type, dtype=dtype):
                step()
        else:
            step()

    run()  # warm-up
    base = _rss_kib(os.getpid())
    reset_peak()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    times = [timed(run, device) for _ in range(spec['repeats'])]
    peak = _rss_kib(os.getpid(), 'VmHWM')
    added = (torch.cuda.max_memory_allocated() - before) / 2 ** 20 if cuda else max(0, peak - base) / 1024
    # on a CPU the resident set moves with the allocator's habits (+-20 % between runs of one case); one more pass,
    # untimed, under torch's profiler: the peak of the bytes its tensors hold, exact
    tensors = added if cuda else peak_memory(run, device) / 2 ** 20
    return dict(ms=statistics.median(times) * 1e3, peak_MiB=added, rss_MiB=peak / 1024, tensor_MiB=tensors,
                threads=torch.get_num_threads())


def _whole_model(spec):
    """A detector's or segmentor's inference on one random image of the case's size."""
    import torch
    from mmengine.registry import DefaultScope
    task, h, w = spec['task'], *spec['size']
    scope = 'mmdet' if task == 'maskrcnn' else 'mmseg'
    registry = __import__(f'{scope}.registry', fromlist=['MODELS']).MODELS
    __import__(f'{scope}.models')
    from mmengine.config import ConfigDict
    with DefaultScope.overwrite_default_scope(scope):  # ConfigDict: the heads read test_cfg.rpn, test_cfg.mode
        model = registry.build(ConfigDict(spec['cfg']))
    model.to(spec.get('device', 'cpu')).eval()
    img = torch.randint(0, 256, (3, h, w), dtype=torch.uint8)
    if task == 'maskrcnn':
        from mmdet.structures import DetDataSample
        sample = DetDataSample(metainfo=dict(img_shape=(h, w), ori_shape=(h, w), scale_factor=(1.0, 1.0),
                                             pad_shape=(h, w), batch_input_shape=(h, w)))
    else:
        from mmseg.structures import SegDataSample
        sample = SegDataSample(metainfo=dict(img_shape=(h, w), ori_shape=(h, w), pad_shape=(h, w),
                                             padding_size=[0, 0, 0, 0]))
    data = model.data_preprocessor(dict(inputs=[img], data_samples=[sample]), False)

    def run():
        with torch.no_grad():
            model(**data, mode='predict')
    return model, run


def _die_with_parent() -> None:
    """In the case's process before it runs: the kernel kills it when the sweep dies, however it dies (SIGKILL
    too), so an interrupted sweep leaves no case running on (Linux; elsewhere the sweep's own clean-up does)."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (AttributeError, OSError):
        pass


def run_case(spec: dict, time_limit: float, mem_limit_gib: float) -> dict:
    """``spec`` measured in a fresh process under the limits: its row (status 'ok', 'over the time limit', 'over
    the memory limit' or 'failed' with the last line of its error)."""
    env = dict(os.environ, PYTHONWARNINGS='ignore')
    proc = subprocess.Popen([sys.executable, '-m', 'softfree_mm.analysis.benchmark.cost', json.dumps(spec)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True, preexec_fn=_die_with_parent if sys.platform == 'linux' else None)
    try:
        return _watch(proc, time_limit, mem_limit_gib)
    finally:  # interrupted (Ctrl-C, SIGTERM made an exit by the tool): the case goes with the sweep
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _watch(proc, time_limit: float, mem_limit_gib: float) -> dict:
    limit_kib = mem_limit_gib * 2 ** 20
    start, peak, why = time.time(), 0, None
    while proc.poll() is None:
        peak = max(peak, _rss_kib(proc.pid))
        if peak > limit_kib:
            why = f'over the memory limit ({mem_limit_gib:g} GiB resident: killed)'
        elif time.time() - start > time_limit:
            why = f'over the time limit ({time_limit:g} s: killed)'
        if why:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return dict(status=why.split(' (')[0], error=why, rss_MiB=peak / 1024)
        time.sleep(0.02)
    out, err = proc.communicate()
    lines = [ln for ln in out.splitlines() if ln.startswith('{')]
    if proc.returncode or not lines:
        last = (err.strip().splitlines() or [f'exit status {proc.returncode}'])[-1]
        status = 'over the memory limit' if 'MemoryError' in last or "can't allocate" in last else 'failed'
        return dict(status=status, error=last)
    return dict(json.loads(lines[-1]), status='ok', error='')


# ---------------------------------------------------------------------------------------------- the sweep
def case_key(row: dict) -> tuple:
    return tuple(str(row.get(k, '')) for k in ('what', 'layout', 'kernel', 'pass', 'size'))


def read_rows(path: str) -> List[dict]:
    import csv
    if not path or not osp.isfile(path):
        return []
    with open(path, newline='') as f:
        return list(csv.DictReader(f))


def _append(path: str, row: dict) -> None:
    import csv
    new = not osp.isfile(path)
    if not new:  # a CSV of an older sweep without this sweep's columns: written again with them (left empty)
        with open(path, newline='') as f:
            header = next(csv.reader(f), [])
        if tuple(header) != COLUMNS:
            rows = read_rows(path)
            with open(path, 'w', newline='') as f:
                w = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction='ignore')
                w.writeheader()
                w.writerows({k: r.get(k) or '' for k in COLUMNS} for r in rows)
    with open(path, 'a', newline='') as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction='ignore')
        if new:
            w.writeheader()
        w.writerow({k: '' if row.get(k) is None else row[k] for k in COLUMNS})


def plan(layouts: Sequence[str], kernels: Sequence[str], sides: Sequence[int] = SHORT_SIDES,
         large: Optional[int] = LARGE_SIDE, seg: Optional[Tuple[int, int]] = SEG_SIZE,
         backward_side: Optional[int] = None, models: Sequence[tuple] = MODELS) -> List[dict]:
    """The cases, in order: per layout and kernel, inference at each short side (then ``large`` where the largest
    of ``sides`` ran within the limits, decided when it comes), the segmentation size, forward + backward at
    ``backward_side`` (default: the smallest side; 0: none); then the whole models."""
    out = []
    backward_side = min(sides) if backward_side is None else backward_side
    for layout in layouts:
        for kernel in kernels:
            base = dict(what='backbone', layout=layout, kernel=kernel)
            for s in sides:
                out.append(dict(base, **{'pass': 'fwd'}, size=coco_size(s), short_side=s))
            if large:
                out.append(dict(base, **{'pass': 'fwd'}, size=coco_size(large), short_side=large,
                                after=coco_size(max(sides))))
            if seg:
                out.append(dict(base, **{'pass': 'fwd'}, size=tuple(seg), short_side=min(seg)))
            if backward_side:
                out.append(dict(base, **{'pass': 'fwdbwd'}, size=coco_size(backward_side), short_side=backward_side))
    for task, backbone, kernel in models:
        for s in sides:
            out.append(dict(what=task, layout=backbone, kernel=kernel, **{'pass': 'fwd'}, size=coco_size(s),
                            short_side=s, task=task))
        if seg and task != 'maskrcnn':
            out.append(dict(what=task, layout=backbone, kernel=kernel, **{'pass': 'fwd'}, size=tuple(seg),
                            short_side=min(seg), task=task))
    return out


def sweep(cases: List[dict], csv_path: str, time_limit: float, mem_limit_gib: float, repeats: int = 3,
          log=None, device: str = 'cpu', dtype: str = 'fp32') -> List[dict]:
    """Every case not in ``csv_path`` yet, appended there as it finishes; the rows of all cases."""
    done = {case_key(r): r for r in read_rows(csv_path)}
    fits = {}
    rows = []
    for case in cases:
        key = case_key(dict(case, size='x'.join(map(str, case['size']))))
        if key in done:
            rows.append(done[key])
            continue
        row = dict({k: v for k, v in case.items() if k not in ('after', 'task')},
                   size='x'.join(map(str, case['size'])))
        if case['what'] == 'backbone':
            fk = (case['layout'], case['kernel'])
            if fk not in fits:
                fits[fk] = layout_backbone(*fk)
            cfg, source, err = fits[fk]
            row['config'] = source
            if cfg is not None:
                row['class'] = layout_class(*fk)
            if cfg is None:
                row.update(status='does not fit', error=err)
            elif 'after' in case:
                prev = done.get(case_key(dict(case, size='x'.join(map(str, case['after'])))))
                prev = prev or next((r for r in rows if case_key(r) == case_key(dict(
                    case, size='x'.join(map(str, case['after'])))) and r is not None), None)
                if not prev or prev.get('status') != 'ok':
                    row.update(status='not run', error=f'not within the limits at {prev and prev.get("size")}')
            if 'status' not in row:
                row.update(run_case(dict(case, cfg=cfg, repeats=repeats, device=device, dtype=dtype), time_limit,
                                    mem_limit_gib))
        else:
            _, model = model_config(case['task'], case['layout'], case['kernel'])
            row['config'] = f"configs/{case['task']}_{case['layout']}_{case['kernel']}.py"
            row.update(run_case(dict(case, cfg=model, repeats=repeats, device=device, dtype=dtype), time_limit,
                                mem_limit_gib))
        row = {k: row.get(k) for k in COLUMNS}
        _append(csv_path, row)
        done[case_key(row)] = row
        rows.append(row)
        if log:
            log(row)
    return rows


if __name__ == '__main__':
    spec = json.loads(sys.argv[1])
    spec['size'] = tuple(spec['size'])
    print(json.dumps(measure_case(spec)))
