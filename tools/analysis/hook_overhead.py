#!/usr/bin/env python
"""What AttentionStatsHook costs: per iteration between records, and on a recorded iteration, measured in one run.

    python tools/analysis/hook_overhead.py CONFIG [--batch 8] [--size 64] [--repeats 5] [--calls 200000]
        [--cfg-options K=V ...] [--csv PATH]

Between records: the hook's before_train_iter + after_train_iter on iterations it does not record, timed over
--calls iterations (microseconds per iteration). A recorded iteration: one training step of the config's backbone
(forward + backward of the mean of its outputs on --batch random images of --size px) with the capture and every
layer's norms inside the forward pass, against the same step without, alternating, --repeats pairs (medians). It
also counts the forward pre-hooks left on the kernels afterwards (0 expected). Prints a table; --csv PATH writes
its rows (measure, value, unit). Bad input: one line, exit status 2.
"""
import os.path as osp
import statistics
import sys
import time
import types

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
from _cli import Parser, fail, run  # noqa: E402


def main(argv=None):
    from mmengine.config import DictAction
    p = Parser(__doc__)
    p.add_argument('config')
    p.add_argument('--batch', type=int, default=8)
    p.add_argument('--size', type=int, default=64)
    p.add_argument('--repeats', type=int, default=5)
    p.add_argument('--calls', type=int, default=200000)
    p.add_argument('--cfg-options', nargs='+', action=DictAction)
    p.add_argument('--csv', default=None, help='also write the table\'s rows (measure, value, unit) here')
    args = p.parse_args(argv)
    for name in ('batch', 'size', 'repeats', 'calls'):
        if getattr(args, name) < 1:
            fail(f'--{name} must be >= 1, got {getattr(args, name)}')
    import torch

    from softfree_mm.analysis import probe
    from softfree_mm.engine.hooks.matrix_norms import call_stats
    from softfree_mm.engine.hooks import AttentionCapture, AttentionStatsHook
    cfg = probe.load_checked(args.config, args.cfg_options)
    model = probe.build_model(cfg, 'none', args.config)
    backbone = getattr(model, 'backbone', model).train()
    torch.manual_seed(0)
    x = torch.randn(args.batch, 3, args.size, args.size)

    hook = AttentionStatsHook(interval=10 ** 9, first=False)
    runner = types.SimpleNamespace(iter=0, model=backbone)
    start = time.perf_counter()
    for i in range(args.calls):
        runner.iter = i + 1
        hook.before_train_iter(runner, i)
        hook.after_train_iter(runner, i)
    between_us = (time.perf_counter() - start) / args.calls * 1e6

    def step():
        out = backbone(x)
        sum(o.float().mean() for o in (out if isinstance(out, (tuple, list)) else [out])).backward()
        backbone.zero_grad(set_to_none=True)

    def recorded():
        stats = {}
        with AttentionCapture(backbone, on_call=lambda c: stats.__setitem__(c.name, call_stats(c)), store=False):
            step()
        return stats

    step()
    recorded()  # warm-up
    plain, rec = [], []
    for _ in range(args.repeats):
        t = time.perf_counter()
        step()
        plain.append(time.perf_counter() - t)
        t = time.perf_counter()
        recorded()
        rec.append(time.perf_counter() - t)
    p_s, r_s = statistics.median(plain), statistics.median(rec)
    left = sum(len(m._forward_pre_hooks) for m in backbone.modules())
    rows = [('hook between records, per iteration', f'{between_us:.2f}', 'us'),
            (f'training step (forward + backward), median of {args.repeats}', f'{p_s:.3f}', 's'),
            ('recorded step (capture + norms of every layer), median', f'{r_s:.3f}', 's'),
            ('recorded / plain', f'{r_s / p_s:.2f}', ''),
            ('between records / step', f'{between_us * 1e-6 / p_s * 100:.6f}', '%'),
            ('forward pre-hooks left on the model', f'{left}', '')]
    print(f'{osp.basename(args.config)}: batch {args.batch} x {args.size} px, threads {torch.get_num_threads()}')
    print('| measure | value |')
    print('|---|---|')
    for measure, value, unit in rows:
        print(f'| {measure} | {value}{" " + unit if unit else ""} |')
    if args.csv:
        import csv
        with open(args.csv, 'w', newline='') as f:
            w = csv.writer(f)
            w.writerow(['measure', 'value', 'unit'])
            w.writerows(rows)
        print(f'csv: {args.csv}')
    return 0


if __name__ == '__main__':
    sys.exit(run(main))
