"""A kernel study: a grid of (config, kernel, seed) runs trained through tools/train.py, tabulated from their logs.

Each run is :mod:`.sweep`'s child config (the kernel set at ``key``) trained with ``randomness.seed`` set, through the
grids' :class:`~.grid_runner.Runner` (the one engine's: :mod:`.study_engine`, declared in :mod:`.studies`), in a
folder ``<work_root>/<config>/<kernel>/seed<S>/``; when it ends its row goes to ``result.json`` there, and a run
with that file is not trained again (a folder without it, left by a run that was killed, is emptied and trained
anew). The folder's ``run_identity.json`` says which run it holds (:mod:`.grid_identity`: the resolved child config
with its seed and options): a folder of another run is refused, never reused (one made before run identities is
kept by its key). Every number comes from the run's own log: ``vis_data/scalars.json`` (the validation records'
top-1, the training records' loss and time) and ``vis_data/attention_stats.json`` (AttentionStatsHook's norms per
layer). A kernel the backbone refuses, or a run that fails, is a 'failed' row with the error's last line.
"""
import math
import os.path as osp
import re
from collections import OrderedDict
from typing import Dict, List, Optional, Sequence

from ..attention import kernel_label
from . import grid_identity as gi
from .stats import mean_std
from .sweep import child_config, json_records, newest_scalars, read_scalars, safe_name

RESULT = 'result.json'
METRIC = 'accuracy/top1'
CHANCE = 10.0  # ten digit classes

KEY = ('config', 'kernel', 'seed')  # a run of the study (identities.csv names it by these)
RUN_FIELDS = ('config', 'kernel', 'seed', 'status', 'top1_final', 'top1_best', 'best_iter', 'loss_final',
              's_per_iter', 'peak_mem_mib', 'mem_kind', 'iters', 'wall_s', 'cpu_s', 'threads', 'error', 'log')
CURVE_FIELDS = ('config', 'kernel', 'seed', 'step', 'layer', 'rows', 'keys', 'fro', 'jac', 'fro_sqrt_n',
                'jac_sqrt_n')


# the tables' titles per study config (tools/analysis/study.py and the docs' generated tables)
TITLES = {'study_xcit_t12_digits': 'XCiT-T12 (channel attention, N = 48 channels per head)',
          'study_pvt_v2_b0_digits': 'PVTv2-b0 without spatial reduction (token attention, N = 256 / 64 / 16 / 4)'}
DIGITS_VAL_IMAGES = 500  # the digits task's validation set (the study configs' val_dataloader; a test counts it)


def describe(spec) -> str:
    """A reader's name for a kernel config ('poly:degree=3' -> 'poly x^3 / sqrt(N)')."""
    label = kernel_label(spec)
    cfg = dict(spec) if isinstance(spec, dict) else {'type': spec}
    t = cfg['type']
    if t == 'poly':
        p, c = cfg.get('degree', 3), cfg.get('scale', 'sqrt_n')
        x = 'x' if p == 1 else f'x^{p}'
        name = f'poly {x} / sqrt(N)' if c == 'sqrt_n' else (f'poly {x} unscaled' if c == 1 else f'poly {c:g} {x}')
        return name + (', q and k standardised' if cfg.get('qk_norm') else '')
    if t == 'relu':
        return 'relu(s) / N'
    if t == 'linear':
        return f"linear ({cfg.get('feature_map', 'elu+1')})"
    if t == 'inline':
        res = cfg.get('local_residual', 'channel')
        return 'InLine, no residual' if res is False else f'InLine + local residual ({res})'
    if t == 'soft':
        return 'SOFT' + (f" (landmark ratio {cfg['landmark_ratio']})" if 'landmark_ratio' in cfg else '')
    if t == 'synthesizer':
        return f"Synthesizer ({cfg.get('mode', 'random')})"
    if t == 'agent':
        return f"Agent attention ({cfg.get('agent_num', 49)} agents)"
    return label


# ---------------------------------------------------------------------------------------------- logs
def read_norm_curves(path: str, prefix: str = 'attn') -> List[dict]:
    """AttentionStatsHook's attention_stats.json -> one row per (step, layer): rows (N), keys, fro, jac (None
    when the kernel has no score map) and both divided by sqrt(rows)."""
    out = []
    for rec in json_records(path):
        layers = OrderedDict()
        for key, val in rec.items():
            if key.startswith(prefix + '/'):
                layer, _, what = key[len(prefix) + 1:].rpartition('/')
                layers.setdefault(layer, {})[what] = val
        for layer, d in layers.items():
            if 'fro' not in d or not d.get('rows'):
                continue
            root = math.sqrt(d['rows'])
            jac = d.get('jac')
            out.append(dict(step=rec['step'], layer=layer, rows=d['rows'], keys=d.get('keys'), fro=d['fro'],
                            jac=jac, fro_sqrt_n=d['fro'] / root, jac_sqrt_n=None if jac is None else jac / root))
    return out


# ---------------------------------------------------------------------------------------------- runs
def config_name(config: str) -> str:
    """A study config's name: its file's ('study_pvt_v2_b0_digits'); the runs' folders and rows are named by it."""
    return osp.splitext(osp.basename(config))[0]


def _run(config: str, spec, seed: int, cfg_options: Sequence[str], key: str):
    """(the runner's key, the child config's text and file name, the options) of a study run."""
    name, label = config_name(config), safe_name(kernel_label(spec))
    return (f'{name}/{label}/seed{seed}', child_config(config, spec, key), f'{name}__{label}.py',
            list(cfg_options) + [f'randomness.seed={seed}'])


def run_dir(work_root: str, config: str, spec, seed: int) -> str:
    return osp.join(work_root, config_name(config), safe_name(kernel_label(spec)), f'seed{seed}')


def run_record(config: str, spec, seed: int, cfg_options: Sequence[str] = (),
               key: str = 'model.backbone.attn_cfg') -> dict:
    """The record of a study run (:mod:`.grid_identity`): its child config with the seed and the options, as
    tools/train.py reads it (the visualizer's name an in-process run adds is not part of a run)."""
    _, text, file, opts = _run(config, spec, seed, cfg_options, key)
    return gi.record(text, opts, name=file)


def held(config: str, spec, seed: int, work_root, cfg_options: Sequence[str] = (),
         key: str = 'model.backbone.attn_cfg') -> Optional[dict]:
    """The run's record where its folder has a run_identity.json that is this run's; None where it has none (no
    folder, or one made before run identities); another run's: a UsageError naming the keys that differ.
    ``work_root``: the study's folder, or its :class:`~.grid_runner.Runner`."""
    from .grid_runner import Runner
    runner = work_root if isinstance(work_root, Runner) else Runner(work_root, '', echo=lambda m: None)
    rkey, text, file, opts = _run(config, spec, seed, cfg_options, key)
    return runner.held(rkey, text, opts, name=file)[1]


def _row(config: str, spec, seed: int, runner, in_process: bool):
    """``Runner.train``'s ``read``: the study's row of a finished training (RUN_FIELDS) from the runner's."""
    def read(got: dict, res: dict, wd: str) -> dict:
        ok = res['returncode'] == 0
        row = dict(config=config_name(config), kernel=kernel_label(spec), seed=seed, status='ok' if ok else 'failed',
                   threads=None if in_process else runner.threads, identity=got.get('identity'),
                   error='' if ok else (res['error'] or f'exit status {res["returncode"]}'), wall_s=res['seconds'],
                   cpu_s=res.get('cpu_s'), top1_final=None, top1_best=None, best_iter=None, loss_final=None,
                   s_per_iter=None, peak_mem_mib=None, mem_kind='', iters=0, log='',
                   checkpoint=got.get('checkpoint'))
        log = newest_scalars(wd)
        if log:
            scal = read_scalars(log)
            row.update({k: scal[k] for k in ('top1_final', 'top1_best', 'best_iter', 'loss_final', 's_per_iter',
                                             'iters')})
            row['log'] = osp.relpath(log, runner.root)
            if scal['cuda_memory_mib'] is not None:
                row.update(peak_mem_mib=scal['cuda_memory_mib'], mem_kind='CUDA max allocated')
        if ok and row['top1_final'] is None:
            row.update(status='failed', error=f'the run wrote no {METRIC} record')
        if row['peak_mem_mib'] is None and res.get('peak_rss_mib') is not None and ok:
            row.update(peak_mem_mib=res['peak_rss_mib'], mem_kind='peak RSS of the training process')
        runner.echo(f'[study] {row["config"]} {row["kernel"]} seed {seed}: {row["status"]} '
                    + (f'top-1 {row["top1_final"]:.1f}' if row['status'] == 'ok' else row['error']))
        return row
    return read


def run_one(config: str, spec, seed: int, runner, cfg_options: Sequence[str] = (),
            key: str = 'model.backbone.attn_cfg', in_process: bool = False) -> dict:
    """Train one (config, kernel, seed) through ``runner`` (:class:`~.grid_runner.Runner`) unless its folder holds
    its result; its row (also written to result.json there). A report-only runner: the finished row, or 'not run'."""
    rkey, text, file, opts = _run(config, spec, seed, cfg_options, key)
    got = runner.train(rkey, text, opts, name=file, log='train.log', in_process=in_process,
                       read=_row(config, spec, seed, runner, in_process))
    if got.get('status') == 'not run':
        return dict(got, config=config_name(config), kernel=kernel_label(spec), seed=seed)
    return got


def study(configs: Sequence[str], kernels: Sequence, seeds: Sequence[int], runner, cfg_options: Sequence[str] = (),
          key: str = 'model.backbone.attn_cfg', in_process: bool = False, kept=None) -> List[dict]:
    """Every (config, kernel, seed), one row each, listed config-major, then kernel, then seed: the engine's cross
    (:func:`.study_engine.cross`), trained seed by seed (so that a study stopped part way has whole seeds of the
    grid), the runner's ``jobs`` processes at a time; a run ``kept`` has (``KeptStudy.get``) is its row, not trained;
    a folder that holds another run is refused (UsageError) before anything trains."""
    from .study_engine import cross
    if in_process and runner.jobs != 1:
        raise ValueError(f'study: jobs must be 1 when training in this process; got jobs={runner.jobs}')
    return cross(runner, dict(config=list(configs), kernel=list(kernels), seed=list(seeds)),
                 lambda p: run_one(p['config'], p['kernel'], p['seed'], runner, cfg_options, key, in_process),
                 pairing='seed',
                 kept=(lambda p: kept.get(config_name(p['config']), kernel_label(p['kernel']), p['seed'])) if kept
                 else None,
                 check=lambda p: held(p['config'], p['kernel'], p['seed'], runner, cfg_options, key))


def norm_curves(rows: List[dict], work_root: str) -> List[dict]:
    """The per-layer norm curves of every successful run (CURVE_FIELDS), read from its attention_stats.json."""
    out = []
    for r in rows:
        if r['status'] != 'ok' or not r['log']:
            continue
        path = osp.join(work_root, osp.dirname(r['log']), 'attention_stats.json')
        if not osp.isfile(path):
            continue
        for c in read_norm_curves(path):
            out.append(dict(config=r['config'], kernel=r['kernel'], seed=r['seed'], **c))
    return out


# ---------------------------------------------------------------------------------------------- summary
def summarise(rows: List[dict], descriptions: Optional[Dict[str, str]] = None, reference: str = 'softmax'
              ) -> List[dict]:
    """One entry per (config, kernel), in study order: n (seeds that trained), failed (seeds that did not),
    mean and sample standard deviation (n - 1) over the seeds of final / best top-1 and final loss, mean s/iter and
    peak memory, the first error; and the final top-1 minus ``reference``'s paired by seed (mean and sample std of
    the per-seed differences over the seeds both trained, how many of them are above)."""
    groups = OrderedDict()
    for r in rows:
        groups.setdefault((r['config'], r['kernel']), []).append(r)
    out = []
    for (config, kernel), rs in groups.items():
        ok = [r for r in rs if r['status'] == 'ok']
        e = dict(config=config, kernel=kernel, what=(descriptions or {}).get(kernel, kernel), n=len(ok),
                 failed=len(rs) - len(ok), seeds=[r['seed'] for r in ok],
                 error=next((r['error'] for r in rs if r['status'] != 'ok'), ''))
        for key in ('top1_final', 'top1_best', 'loss_final'):
            e[key], e[key + '_std'] = mean_std([r[key] for r in ok])[:2]
        e['s_per_iter'] = mean_std([r['s_per_iter'] for r in ok])[0]
        e['peak_mem_mib'] = mean_std([r['peak_mem_mib'] for r in ok])[0]
        e['top1_by_seed'] = {r['seed']: r['top1_final'] for r in ok}
        out.append(e)
    for e in out:  # a seed fixes the initialisation and the data order: the same seed's runs pair up
        ref = next((r for r in out if r['config'] == e['config'] and r['kernel'] == reference), None)
        d = [] if ref is None or ref is e else [e['top1_by_seed'][s] - ref['top1_by_seed'][s]
                                                for s in e['top1_by_seed'] if s in ref['top1_by_seed']]
        e['delta_paired'], e['delta_paired_std'] = mean_std(d)[:2]
        e['seeds_paired'], e['seeds_above'] = len(d), sum(x > 0 for x in d)
    return out


def standard_error(p_percent: float, n: int) -> float:
    """Standard error (percentage points) of an accuracy p measured on n independent images."""
    p = p_percent / 100.0
    return 100.0 * math.sqrt(p * (1.0 - p) / n)


def _pm(mean, std, digits=1):
    if mean is None:
        return ''
    return f'{mean:.{digits}f}' + ('' if std is None else f' ± {std:.{digits}f}')


def _f(v, digits):
    return '' if v is None else f'{v:.{digits}f}'


def difference(e: dict, ref: dict):
    """Final top-1 of ``e`` minus that of ``ref`` and the standard error of that difference from the seeds' spreads,
    sqrt(s_e^2 / n_e + s_ref^2 / n_ref) (None without two seeds on each side)."""
    delta = e['top1_final'] - ref['top1_final']
    if e['top1_final_std'] is None or ref['top1_final_std'] is None:
        return delta, None
    return delta, math.sqrt(e['top1_final_std'] ** 2 / e['n'] + ref['top1_final_std'] ** 2 / ref['n'])


def markdown(summary: List[dict], val_images: Dict[str, Optional[int]], titles: Optional[Dict[str, str]] = None,
             chance: float = CHANCE, reference: str = 'softmax') -> str:
    """One table per config: mean ± sample std over seeds; the chance level and the validation set's standard
    error stated above each table, the standard error at each row's mean in its own column, and each kernel's
    difference to ``reference`` (final top-1) with the standard error of that difference."""
    out = []
    for config in dict.fromkeys(e['config'] for e in summary):
        n_val = val_images.get(config)
        ref = next((e for e in summary if e['config'] == config and e['kernel'] == reference and e['n']), None)
        out.append(f'### {(titles or {}).get(config, config)}')
        out.append('')
        se = (f'; validation set {n_val} images: the standard error of one top-1 measurement is '
              f'sqrt(p (1 - p) / {n_val}), {standard_error(50.0, n_val):.1f} points at p = 50 %' if n_val else '')
        out.append(f'Chance: {chance:.1f} % top-1{se}. Mean ± sample standard deviation over the seeds that trained '
                   f'(n); s/iter and peak memory: means. Δ: final top-1 minus {reference}\'s, ± the standard error '
                   'of that difference from the two spreads, sqrt(s1^2 / n1 + s2^2 / n2). Paired Δ: the same '
                   'difference seed by seed (one seed gives both runs the same initialisation and data order), mean '
                   f'± sample std over the seeds both trained, and in how many of them the kernel is above {reference}.')
        out.append('')
        out.append(f'| kernel | spec | n | final top-1 % | best top-1 % | val SE at the mean | Δ vs {reference} | '
                   'paired Δ | final loss | s/iter | peak MiB |')
        out.append('|---|---|---|---|---|---|---|---|---|---|---|')
        for e in summary:
            if e['config'] != config:
                continue
            if not e['n']:
                out.append(f"| {e['what']} | `{e['kernel']}` | 0 | failed: {error_cell(e['error'])} | | | | | | | |")
                continue
            se_row = _f(standard_error(e['top1_final'], n_val), 1) if n_val else ''
            note = f" ({e['failed']} failed)" if e['failed'] else ''
            paired = ''
            if ref is None:
                diff = ''
            elif e is ref:
                diff = 'reference'
            else:
                delta, d_se = difference(e, ref)
                diff = f'{delta:+.1f}' + ('' if d_se is None else f' ± {d_se:.1f}')
                if e['seeds_paired']:
                    std = e['delta_paired_std']
                    paired = (f"{e['delta_paired']:+.1f}" + ('' if std is None else f' ± {std:.1f}') +
                              f", {e['seeds_above']} of {e['seeds_paired']} above")
            out.append(f"| {e['what']} | `{e['kernel']}` | {e['n']}{note} | "
                       f"{_pm(e['top1_final'], e['top1_final_std'])} | {_pm(e['top1_best'], e['top1_best_std'])} | "
                       f"{se_row} | {diff} | {paired} | {_pm(e['loss_final'], e['loss_final_std'], 3)} | "
                       f"{_f(e['s_per_iter'], 3)} | {_f(e['peak_mem_mib'], 0)} |")
        out.append('')
    return '\n'.join(out).rstrip() + '\n'


def error_cell(text: str) -> str:
    """An error line for a table cell: without 'error:', the child config's path, the exception's class and the
    traceback hint."""
    text = re.sub(r'^error:\s*', '', text.strip())
    text = re.sub(r'^\S+\.py:\s*', '', text)
    text = re.sub(r'^[A-Za-z]+(Error|Exception):\s*', '', text)
    text = re.sub(r'\s*\(SOFTFREE_MM_TRACEBACK=1[^)]*\)\s*$', '', text)
    return text.replace('|', '/').replace('\n', ' ')
