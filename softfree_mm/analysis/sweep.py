"""Train one config once per attention kernel and tabulate final metric, seconds per iteration and peak memory.

Each kernel gets a child config beside the runs (``_base_`` = the config, the kernel set at ``key`` with
``_delete_=True``), trained through tools/train.py: in a fresh process by default (a failure stays that kernel's;
peak memory is that process's), or in this process (``in_process``: faster start). Numbers come from the run's own
log (``vis_data/scalars.json``): the last validation record's metric, the mean logged ``time`` (s/iter) after the
first record, CUDA's logged ``memory`` (max allocated, MiB) on a GPU, else the peak resident memory of the training
process (MiB).
"""
import json
import os
import os.path as osp
import re
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence

from ..attention import kernel_label, normalize_cfg
from .rss import reset_peak, status_kib

METRIC_PREFERENCE = ('accuracy/top1', 'mIoU', 'coco/bbox_mAP', 'coco/segm_mAP', 'aAcc')
NOT_METRICS = ('step', 'time', 'data_time', 'lr', 'base_lr', 'memory', 'epoch', 'iter')


def child_config(config: str, spec: dict, key: str = 'model.backbone.attn_cfg') -> str:
    """Text of a config that inherits ``config`` and sets the kernel ``spec`` at ``key`` (dotted path)."""
    spec = normalize_cfg(spec)
    parts = key.split('.')
    value = 'dict(_delete_=True, ' + ', '.join(f'{k}={v!r}' for k, v in spec.items()) + ')'
    for part in reversed(parts[1:]):
        value = f'dict({part}={value})'
    return f'_base_ = {osp.abspath(config)!r}\n{parts[0]} = {value}\n'


def safe_name(label: str) -> str:
    return re.sub(r'[^A-Za-z0-9_.=-]+', '_', label)


def _peak_rss_mib() -> Optional[float]:
    kib = status_kib('self', 'VmHWM')
    return None if kib is None else kib / 1024.0


def timing(train: Sequence[dict]) -> dict:
    """From a run's training records (mmengine's scalars.json): s_per_iter (the mean iteration time, the first left
    out where there are more) and cuda_memory_mib (the largest logged), each only where logged."""
    out = {}
    times = [r['time'] for r in train if 'time' in r]
    if times:
        rest = times[1:] if len(times) > 1 else times
        out['s_per_iter'] = sum(rest) / len(rest)
    mem = [r['memory'] for r in train if 'memory' in r]
    if mem:
        out['cuda_memory_mib'] = float(max(mem))
    return out


def train_one(train_py: str, config_path: str, work_dir: str, cfg_options: Sequence[str] = (),
              in_process: bool = False, log_path: Optional[str] = None, env: Optional[dict] = None) -> dict:
    """Run tools/train.py on ``config_path``; dict(returncode, seconds, cpu_s (user + system CPU seconds of the
    training), peak_rss_mib, error). ``env``: the child process's environment (not for ``in_process``)."""
    argv = [config_path, '--work-dir', work_dir]
    if cfg_options:
        argv += ['--cfg-options', *cfg_options]
    start = time.time()
    if in_process:
        import importlib.util
        import io
        from contextlib import redirect_stderr
        spec = importlib.util.spec_from_file_location('softfree_sweep_train', train_py)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        reset = reset_peak()
        cpu0 = _cpu_self()
        err = io.StringIO()
        try:
            with redirect_stderr(err):
                rc = mod.main(argv)
        except Exception as e:  # a kernel that fails mid-training fails only its row
            rc, err = 1, io.StringIO(f'{type(e).__name__}: {e}')
        return dict(returncode=rc, seconds=time.time() - start, cpu_s=_cpu_self() - cpu0,
                    peak_rss_mib=_peak_rss_mib() if reset else None, error=_last_error(err.getvalue()))
    log_path = log_path or os.devnull
    err_path = osp.join(work_dir, 'train.stderr') if log_path == os.devnull else log_path + '.stderr'
    with open(log_path, 'w') as log, open(err_path, 'w') as err:
        proc = subprocess.Popen([sys.executable, train_py, *argv], stdout=log, stderr=err, env=env)
        # reap the child ourselves: its rusage holds its own peak resident memory (ru_maxrss, KiB on Linux)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    with open(err_path) as err:
        stderr = err.read()
    return dict(returncode=proc.returncode, seconds=time.time() - start, cpu_s=usage.ru_utime + usage.ru_stime,
                peak_rss_mib=usage.ru_maxrss / 1024.0, error=_last_error(stderr) if proc.returncode else '')


def _cpu_self() -> float:
    import resource
    use = resource.getrusage(resource.RUSAGE_SELF)
    return use.ru_utime + use.ru_stime


def _last_error(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    for ln in reversed(lines):
        if ln.startswith('error:') or 'Error' in ln.split(':')[0]:
            return ln
    return lines[-1] if lines else ''


def newest_scalars(work_dir: str) -> Optional[str]:
    import glob
    found = glob.glob(osp.join(work_dir, '*', 'vis_data', 'scalars.json'))
    return max(found, key=osp.getmtime) if found else None


def json_records(path: str):
    """The records of an mmengine JSON-lines log (scalars.json, attention_stats.json), one dict a line."""
    with open(path) as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def read_log(path: str, metric: Optional[str] = None) -> dict:
    """dict(metric_name, metric, s_per_iter, cuda_memory_mib, iters) from a run's scalars.json."""
    train, val = [], []
    for rec in json_records(path):
        if 'loss' in rec:
            train.append(rec)
        elif any(not k.startswith('attn/') and k not in NOT_METRICS for k in rec):
            val.append(rec)
    out = dict(metric_name=metric, metric=None, s_per_iter=None, cuda_memory_mib=None,
               iters=max((r['step'] for r in train), default=0))
    out.update(timing(train))
    if val:
        last = val[-1]
        name = metric or next((m for m in METRIC_PREFERENCE if m in last), None) or next(
            (k for k in last if k not in NOT_METRICS and not k.startswith('attn/')), None)
        out['metric_name'] = name
        out['metric'] = last.get(name)
    return out


def sweep(config: str, kernels: Sequence, work_root: str, train_py: str, cfg_options: Sequence[str] = (),
          key: str = 'model.backbone.attn_cfg', metric: Optional[str] = None, in_process: bool = False,
          echo=None) -> List[dict]:
    """Train ``config`` once per kernel; one row per kernel (status 'ok' or the failure's last line)."""
    rows = []
    name = osp.splitext(osp.basename(config))[0]
    for spec in kernels:
        label = kernel_label(spec)
        wd = osp.join(work_root, name, safe_name(label))
        os.makedirs(wd, exist_ok=True)
        child = osp.join(wd, f'{name}__{safe_name(label)}.py')
        with open(child, 'w') as f:
            f.write(child_config(config, spec, key))
        opts = list(cfg_options)
        if in_process:  # one visualizer instance per run in one process
            opts.append(f'visualizer.name=sweep_{safe_name(label)}_{os.getpid()}_{time.time_ns()}')
        if echo:
            echo(f'[sweep] {name}: {label} ...')
        res = train_one(train_py, child, wd, opts, in_process, osp.join(wd, 'train.log'))
        row = dict(config=name, kernel=label, status='ok' if res['returncode'] == 0 else 'failed',
                   error=res['error'] if res['returncode'] else '', wall_s=res['seconds'],
                   metric_name=metric, metric=None, s_per_iter=None, peak_mem_mib=None, mem_kind='', iters=0)
        log = newest_scalars(wd)
        if log:
            got = read_log(log, metric)
            row.update(metric_name=got['metric_name'], metric=got['metric'], s_per_iter=got['s_per_iter'],
                       iters=got['iters'])
            if got['cuda_memory_mib'] is not None:
                row.update(peak_mem_mib=got['cuda_memory_mib'], mem_kind='CUDA max allocated')
        if row['peak_mem_mib'] is None and res['peak_rss_mib'] is not None and res['returncode'] == 0:
            row.update(peak_mem_mib=res['peak_rss_mib'], mem_kind='peak RSS of the training process')
        if echo:
            echo(f'[sweep] {name}: {label}: {row["status"]} {row["error"]}'.rstrip())
        rows.append(row)
    return rows


FIELDS = ('config', 'kernel', 'status', 'metric_name', 'metric', 's_per_iter', 'peak_mem_mib', 'mem_kind', 'iters',
          'wall_s', 'error')


def markdown(rows: List[dict]) -> str:
    metric = next((r['metric_name'] for r in rows if r['metric_name']), 'metric')
    kinds = sorted({r['mem_kind'] for r in rows if r['mem_kind']})
    out = [f'| config | kernel | {metric} | s/iter | peak memory MiB | iterations (last logged) |',
           '|---|---|---|---|---|---|']
    for r in rows:
        if r['status'] != 'ok':
            out.append(f"| {r['config']} | {r['kernel']} | failed: {r['error']} | | | |")
            continue
        out.append(f"| {r['config']} | {r['kernel']} | {_fmt(r['metric'], 2)} | {_fmt(r['s_per_iter'], 3)} | "
                   f"{_fmt(r['peak_mem_mib'], 0)} | {r['iters']} |")
    if kinds:
        out.append('')
        out.append(f'memory: {"; ".join(kinds)}')
    return '\n'.join(out)


def _fmt(v, digits):
    return '' if v is None else f'{v:.{digits}f}'


def series(rows: List[dict]) -> Dict[str, Dict[str, list]]:
    configs = list(dict.fromkeys(r['config'] for r in rows))
    kernels = list(dict.fromkeys(r['kernel'] for r in rows))
    out = {}
    for k in kernels:
        out[k] = {key: [next((r[key] for r in rows if r['config'] == c and r['kernel'] == k and r['status'] == 'ok'),
                             None) for c in configs] for key in ('metric', 's_per_iter', 'peak_mem_mib')}
    return out


def read_scalars(path: str, metric: str = 'accuracy/top1') -> dict:
    """A run's scalars.json -> top1_final, top1_best, best_iter, loss_final, s_per_iter (mean logged time after
    the first training record), cuda_memory_mib, iters (last logged training step), val (list of (step, top-1))."""
    train, val = [], []
    for rec in json_records(path):
        if 'loss' in rec:
            train.append(rec)
        elif metric in rec:
            val.append((rec['step'], rec[metric]))
    out = dict(top1_final=None, top1_best=None, best_iter=None, loss_final=None, s_per_iter=None,
               cuda_memory_mib=None, iters=max((r['step'] for r in train), default=0), val=val)
    if val:
        out['top1_final'] = val[-1][1]
        best = max(val, key=lambda sv: sv[1])  # the first of equal maxima
        out['top1_best'], out['best_iter'] = best[1], best[0]
    if train:
        out['loss_final'] = train[-1]['loss']
    out.update(timing(train))
    return out
