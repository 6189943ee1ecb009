"""The runner every grid takes (the warm-start grid, the task study): each run a ``tools/train.py`` or
``tools/test.py`` process in its own folder under a work root, its result cached in the folder's result.json, so the
same command resumes a stopped grid and never repeats a finished run; and the child configs that put a kernel into a
study config."""
import json
import os
import os.path as osp
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Optional, Sequence, Tuple

from ..engine.errors import UsageError
from . import grid_identity as gi
from .sweep import newest_scalars, read_scalars, safe_name, train_one

RESULT = 'result.json'


def kernel_config(base: str, kernel) -> str:
    """``base`` with ``kernel`` in its backbone in place of its own (a classifier from scratch, a detector from a
    start): one kernel config dict, or a list of them (one per stage; a list replaces the base's whole)."""
    attn = [dict(k) for k in kernel] if isinstance(kernel, (list, tuple)) else dict(_delete_=True, **kernel)
    return f"_base_ = {base!r}\nmodel = dict(backbone=dict(attn_cfg={attn!r}))\n"


class Runner:
    """Runs the study's commands in a work root, one folder each, ``jobs`` processes at a time with ``threads``
    torch threads each; results cached in each folder's result.json. ``report_only``: nothing runs, a run not finished
    is ``status='not run'`` (and so is what needs it). Each run is identified by its record
    (:mod:`.grid_identity`): a folder holding another run is refused (UsageError, one line) before that run trains,
    and once one is refused no other run starts."""

    def __init__(self, root: str, tools: str, jobs: int = 2, threads: int = 1, echo=print,
                 report_only: bool = False):
        self.root, self.tools, self.jobs, self.threads, self.echo = root, tools, jobs, threads, echo
        self.report_only = report_only
        self.refused: Optional[str] = None  # the first refusal: no run starts after it
        self._told_old = False

    def folder(self, key: str) -> str:
        return osp.join(self.root, key)

    def done(self, key: str) -> Optional[dict]:
        path = osp.join(self.folder(key), RESULT)
        if osp.isfile(path):
            with open(path) as f:
                return json.load(f)
        return None

    def _env(self):
        if self.threads is None:  # torch's default
            return None
        return dict(os.environ, OMP_NUM_THREADS=str(self.threads), MKL_NUM_THREADS=str(self.threads))

    def _fresh(self, key: str, config_text: str, name: Optional[str] = None):
        """(the run's folder, emptied: a run that did not finish starts again; its child config written there)."""
        wd = self.folder(key)
        if osp.isdir(wd):
            shutil.rmtree(wd)
        os.makedirs(wd)
        cfg = osp.join(wd, name or f'{safe_name(key)}.py')
        with open(cfg, 'w') as f:
            f.write(config_text)
        return wd, cfg

    def _finish(self, key: str, row: dict) -> dict:
        row = dict(row, key=key)
        with open(osp.join(self.folder(key), RESULT), 'w') as f:
            json.dump(row, f, indent=1)
        self.echo(f'[warm-start] {key}: {row["status"]}' + (f' ({row.get("error")})' if row['status'] != 'ok' else ''))
        return row

    def held(self, key: str, config_text: str, options: Sequence[str] = (), checkpoint: Optional[str] = None,
             name: Optional[str] = None) -> Tuple[Optional[dict], Optional[dict]]:
        """(the folder's finished result, or None: run it; the run's record, None where not computed yet). A folder
        whose run_identity.json is another run's is refused (UsageError); a finished one without it (made before run
        identities) is its key's run, as before. ``name``: the child config's file name (default: the key's)."""
        if self.refused:
            raise UsageError(self.refused)
        wd, rec = self.folder(key), None
        if osp.isfile(osp.join(wd, gi.ri.FILE)):
            rec = gi.record(config_text, options, checkpoint, name or f'{safe_name(key)}.py')
            try:
                gi.check(wd, rec)
            except UsageError as e:
                self.refused = str(e)
                raise
        got = self.done(key)
        if got is not None and rec is None and not self._told_old:
            self._told_old = True
            self.echo(f'[grid] {wd}: made before run identities (no {gi.ri.FILE}): kept by its key, as before '
                      '(so are the other such folders; their rows have no identity)')
        return got, rec

    def _begin(self, key: str, config_text: str, options: Sequence[str], checkpoint: Optional[str],
               rec: Optional[dict], name: Optional[str] = None):
        """The run's folder emptied, its child config and run_identity.json written: (folder, config, identity)."""
        rec = rec or gi.record(config_text, options, checkpoint, name or f'{safe_name(key)}.py')
        wd, cfg = self._fresh(key, config_text, name)
        return wd, cfg, gi.begin(wd, rec)

    def train(self, key: str, config_text: str, options: Sequence[str] = (), name: Optional[str] = None,
              log: str = 'run.log', in_process: bool = False, read=None) -> dict:
        """Train one run unless its folder holds its result (report only: 'not run'). ``name``: the child config's
        file name (default: the key's); ``log``: the process's output; ``in_process``: in this process (one
        visualizer per run); ``read(row, res, folder)``: the study's own row from the runner's and train_one's
        (returns it). A run killed by a signal writes no result: the next call runs it again."""
        got, rec = self.held(key, config_text, options, name=name)
        if got is not None and not self.report_only:
            self.echo(f'[grid] {key}: finished before ({got.get("status")}), not trained again')
        if got is not None or self.report_only:
            return got or dict(status='not run', key=key)
        wd, cfg, ident = self._begin(key, config_text, options, None, rec, name)
        opts = list(options)
        if in_process:  # one visualizer instance per run in one process (not part of the run's identity)
            opts.append(f'visualizer.name=run_{safe_name(key)}_{os.getpid()}_{time.time_ns()}')
        res = train_one(osp.join(self.tools, 'train.py'), cfg, wd, opts, in_process=in_process, log_path=osp.join(wd, log),
                        env=None if in_process else self._env())
        row = dict(status='ok' if res['returncode'] == 0 else 'failed', error=res['error'], wall_s=res['seconds'],
                   cpu_s=res.get('cpu_s'), identity=ident)
        log = newest_scalars(wd)
        if log:
            row['log'] = log
            got = read_scalars(log)
            row.update(top1_final=got['top1_final'], loss_final=got['loss_final'], iters=got['iters'],
                       s_per_iter=got['s_per_iter'])
        ckpt = osp.join(wd, 'last_checkpoint')
        if osp.isfile(ckpt):
            with open(ckpt) as f:
                row['checkpoint'] = f.read().strip()
        if row['status'] == 'ok' and not row.get('checkpoint'):
            row.update(status='failed', error='no checkpoint written')
        if read is not None:
            row = read(row, res, wd)
        if res['returncode'] < 0:  # killed by a signal: no result, so that the next call runs it again
            return dict(row, key=key)
        return self._finish(key, row)

    def from_classifier(self, key: str, config_text: str, seed: int, classifier: dict) -> dict:
        """A detector / segmentor started from a classifier run: trained (its backbone from the classifier's
        checkpoint), then tested (``key + '/test'``); the test's result with both runs' seconds. A classifier that
        did not finish: 'not run' where it was not run (report only), else 'failed' naming its error."""
        if classifier.get('status') == 'not run':
            return dict(status='not run', error='', key=key)
        if classifier.get('status') != 'ok':
            return dict(status='failed', error=f'no classifier: {classifier.get("error")}', key=key)
        trained = self.train(key, config_text, [f'randomness.seed={seed}',
                                                f'model.backbone.init_cfg.checkpoint={classifier["checkpoint"]}'])
        if trained.get('status') != 'ok':
            return trained
        tested = self.test(key + '/test', config_text, trained['checkpoint'], [f'randomness.seed={seed}'])
        return dict(tested, wall_s=(trained.get('wall_s') or 0) + (tested.get('wall_s') or 0))

    def test(self, key: str, config_text: str, checkpoint: str, options: Sequence[str] = ()) -> dict:
        got, rec = self.held(key, config_text, options, checkpoint)
        if got is not None or self.report_only:
            return got or dict(status='not run', key=key)
        wd, cfg, ident = self._begin(key, config_text, options, checkpoint, rec)
        cmd = [sys.executable, osp.join(self.tools, 'test.py'), cfg, checkpoint, '--work-dir', wd]
        if options:
            cmd += ['--cfg-options', *options]
        t = time.time()
        with open(osp.join(wd, 'run.log'), 'w') as log:
            proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=self._env())
        row = dict(status='ok' if proc.returncode == 0 else 'failed', wall_s=time.time() - t, error='',
                   identity=ident)
        metrics = osp.join(wd, 'test_metrics.json')
        if osp.isfile(metrics):
            with open(metrics) as f:
                row['metrics'] = json.load(f)
        elif proc.returncode == 0:
            row.update(status='failed', error='no test_metrics.json')
        if proc.returncode:
            with open(osp.join(wd, 'run.log')) as f:
                lines = [ln.strip() for ln in f if ln.strip()]
            row['error'] = lines[-1] if lines else f'exit status {proc.returncode}'
        return self._finish(key, row)

    def map(self, fn, items):
        """``fn`` over ``items``, ``jobs`` at a time (threads that each wait on one process; one: in this thread,
        as an in-process run needs)."""
        if self.jobs == 1:
            return [fn(item) for item in items]
        with ThreadPoolExecutor(max_workers=self.jobs) as pool:
            return list(pool.map(fn, items))


def top1(row: Optional[dict]) -> Optional[float]:
    if not row or row.get('status') != 'ok':
        return None
    if 'metrics' in row:
        return row['metrics'].get('accuracy/top1')
    return row.get('top1_final')
