"""The demo's steps as tools/run_demo.py runs them: each one an ordinary command of this repository in a subprocess
(or a block of code in this process), with one progress line, its whole output in W/logs/<step>.log, its time, and
the command listed in W/commands.sh."""
import contextlib
import os
import os.path as osp
import re
import shlex
import subprocess
import sys
import time

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))


def fmt_duration(seconds):
    return f'{int(seconds // 60)} min {seconds % 60:04.1f} s'


STEPS = dict(all=('data', 'pretrain', 'detector', 'det-eval', 'segmentor', 'seg-eval', 'pictures'),
             det=('data', 'pretrain', 'detector', 'det-eval', 'pictures'),
             seg=('data', 'pretrain', 'segmentor', 'seg-eval', 'pictures'))
# mmengine's loop lines: 'Epoch(train) [3][ 50/141] ... eta: 0:01:06  time: 0.2444', 'Iter(train) [ 50/400] ...'
LOOP = re.compile(r'(?:Epoch|Iter)\(\w+\)\s+(?:\[(\d+)\])?\[\s*(\d+)/(\d+)\]')
ETA = re.compile(r'\beta: (?:(\d+) days?, )?(\d+):(\d\d):(\d\d)')


class Progress:
    """One line for one step: a bar with its share done and the ETA, read from the step's log lines as they come:
    the share from the loop's own count (``[i/n]``; an epoch-based loop's ``[e][i/n]`` over ``epochs``, the
    config's), the ETA mmengine's own, else from the rate so far. On a terminal the line is redrawn in place;
    elsewhere it is printed at each quarter, and once at the end."""

    WIDTH = 24

    def __init__(self, index, count, name, out, epochs=None):
        self.label = f'[demo] {index}/{count} {name:<10}'
        self.out, self.tty = out, out.isatty()
        self.epochs = epochs
        self.start = time.time()
        self.share, self.eta, self.shown, self.drawn_at = 0.0, None, -1, 0.0

    def feed(self, line):
        loop = LOOP.search(line)
        if not loop:
            return
        epoch, i, n = (int(g) if g else None for g in loop.groups())
        if not n:
            return
        if epoch and self.epochs:
            self.share = min(((epoch - 1) * n + i) / (self.epochs * n), 1.0)
        else:
            self.share = min(i / n, 1.0)
        eta = ETA.search(line)
        if eta:
            days, h, mi, sec = (int(g or 0) for g in eta.groups())
            self.eta = ((days * 24 + h) * 60 + mi) * 60 + sec
        else:
            elapsed = time.time() - self.start
            self.eta = elapsed * (1 - self.share) / self.share if self.share > 0 else None
        self.draw()

    def _line(self, tail):
        full = int(round(self.share * self.WIDTH))
        return f'{self.label} |{"#" * full}{"." * (self.WIDTH - full)}| {self.share * 100:3.0f}%  {tail}'

    def draw(self):
        now = time.time()
        eta = f'ETA {fmt_duration(self.eta)}' if self.eta is not None else ''
        if self.tty:
            if now - self.drawn_at >= 0.2:
                self.drawn_at = now
                self.out.write('\r' + self._line(f'{fmt_duration(now - self.start)} elapsed  {eta}').ljust(100))
                self.out.flush()
        elif int(self.share * 4) > self.shown and self.share < 1.0:
            self.shown = int(self.share * 4)
            if self.shown:
                print(self._line(f'{fmt_duration(now - self.start)} elapsed  {eta}'), file=self.out, flush=True)

    def end(self, ok, note=''):
        self.share = 1.0 if ok else self.share
        tail = f'{"done" if ok else "FAILED"} in {fmt_duration(time.time() - self.start)}{note}'
        self.out.write(('\r' if self.tty else '') + self._line(tail).ljust(100 if self.tty else 0) + '\n')
        self.out.flush()


class Demo:
    """The steps of one demo run (``task``: all, det or seg) under ``work``: their times, logs and commands."""

    def __init__(self, work, verbose=False, task='all'):
        self.times = {}
        self.work, self.verbose = work, verbose
        self.steps = STEPS[task]
        self.logs = osp.join(work, 'logs')
        os.makedirs(self.logs, exist_ok=True)
        self.commands = ['#!/usr/bin/env bash', '# the steps of the last make demo, as it ran them (from the repository)',
                         'set -e']

    def log_path(self, step):
        return osp.join(self.logs, f'{step}.log')

    def _failed(self, step, status):
        with open(self.log_path(step)) as f:
            tail = f.readlines()[-30:]
        sys.stderr.write(''.join(tail))
        print(f'[demo] {step} failed (exit status {status}); its whole output: {self.log_path(step)}', file=sys.stderr,
              flush=True)
        raise SystemExit(status)

    def run(self, step, cmd, epochs=None):
        """``cmd`` (a tool of this repository and its arguments) as the step; ``epochs``: its training loop's epoch
        count, when epoch-based (for the progress line)."""
        line = 'python ' + ' '.join(shlex.quote(c) for c in cmd)
        self.commands.append(line)
        progress = Progress(self.steps.index(step) + 1, len(self.steps), step, sys.stdout, epochs)
        if self.verbose:
            print(f'\n[demo] {step}: {line}', flush=True)
        t = time.time()
        with open(self.log_path(step), 'w') as log:
            log.write(f'$ {line}\n')
            log.flush()
            proc = subprocess.Popen([sys.executable, *cmd], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True, bufsize=1)
            for out in proc.stdout:
                log.write(out)
                if self.verbose:
                    sys.stdout.write(out)
                else:
                    progress.feed(out)
            status = proc.wait()
        self.times[step] = time.time() - t
        if not self.verbose:
            progress.end(status == 0)
        if status:
            self._failed(step, status)

    @contextlib.contextmanager
    def in_process(self, step, what):
        """A step run in this process (the pictures): its output (the OpenMMLab logger's, warnings, C-level writes)
        goes to its log file at the level of the file descriptors."""
        self.commands.append(f'# {step}: {what}')
        progress = Progress(self.steps.index(step) + 1, len(self.steps), step, sys.stdout)
        if self.verbose:
            print(f'\n[demo] {step}: {what}', flush=True)
            yield
            return
        sys.stdout.flush()
        sys.stderr.flush()
        saved = [os.dup(1), os.dup(2)]
        progress.out = os.fdopen(os.dup(saved[0]), 'w')
        ok = False
        with open(self.log_path(step), 'w') as log:
            log.write(f'# {what}\n')
            log.flush()
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
            try:
                yield
                ok = True
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
                for fd in saved:
                    os.close(fd)
                progress.end(ok)
                progress.out.close()

    def write_commands(self):
        path = osp.join(self.work, 'commands.sh')
        with open(path, 'w') as f:
            f.write('\n'.join(self.commands) + '\n')
        return path
