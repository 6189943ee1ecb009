"""The warm-start grid's figures (docs/warm_start.md): top-1 against iterations per start, the stage-1 losses per
block, each recipe against scratch paired by seed."""
import os.path as osp
from typing import Dict, List, Optional

from .warm_start_rows import SCRATCH_ITERS, own_groups, paired


def plots(summary: List[dict], curves: List[dict], out: str, groups: str = '') -> List[str]:
    """accuracy.png (top-1 against the iterations of each start, per backbone and kernel) and
    transfer_curves.png (each block's stage-1 loss over its iterations, mean over seeds, of the runs that train
    ``groups``)."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    made = []
    bbs = list(dict.fromkeys(r['backbone'] for r in summary))
    if bbs:
        fig, axes = plt.subplots(1, len(bbs), figsize=(6 * len(bbs), 4.2), squeeze=False)
        for ax, bb in zip(axes[0], bbs):
            kernels = [k for k in dict.fromkeys(r['kernel'] for r in summary if r['backbone'] == bb) if k != 'softmax']
            for i, k in enumerate(kernels):
                color = f'C{i}'
                for start, style in (('swap', '--'), ('transfer', '-')):
                    pts = sorted((r['iters'], r['top1_mean']) for r in summary if r['backbone'] == bb and
                                 r['kernel'] == k and r['start'] == start and r['top1_mean'] is not None)
                    if pts:
                        ax.plot(*zip(*pts), style, marker='o', color=color, label=f'{k} {start}')
                sc = [r for r in summary if r['backbone'] == bb and r['kernel'] == k and r['start'] == 'scratch']
                if sc and sc[0]['top1_mean'] is not None:
                    ax.plot([sc[0]['iters']], [sc[0]['top1_mean']], marker='*', markersize=12, color=color,
                            linestyle='none')
            ax.set_title(f'{bb}: swap (--), transfer (-), scratch (*)')
            ax.set_xlabel('iterations (transfer included)')
            ax.set_ylabel('top-1 %')
            ax.legend(fontsize=6)
        fig.tight_layout()
        path = osp.join(out, 'accuracy.png')
        fig.savefig(path, dpi=110)
        plt.close(fig)
        made.append(path)
    if groups:  # the main runs' stage 1 (the groups comparison's other runs left out)
        curves = [c for c in curves if c['groups'] == groups]
    if curves:
        rows = list(dict.fromkeys(c['backbone'] for c in curves))
        cols = max(len({c['kernel'] for c in curves if c['backbone'] == bb}) for bb in rows)
        fig, axes = plt.subplots(len(rows), cols, figsize=(3.2 * cols, 3.0 * len(rows)), squeeze=False)
        big = max(c['iters'] for c in curves)
        for i, bb in enumerate(rows):
            kernels = list(dict.fromkeys(c['kernel'] for c in curves if c['backbone'] == bb))
            for ax in axes[i][len(kernels):]:
                ax.axis('off')
            for ax, k in zip(axes[i], kernels):
                sel = [c for c in curves if c['backbone'] == bb and c['kernel'] == k and c['iters'] == big]
                for b in sorted({c['block'] for c in sel}):
                    pts: Dict[int, list] = {}
                    for c in sel:
                        if c['block'] == b and c['iter'] is not None:
                            pts.setdefault(c['iter'], []).append(c['loss'])
                    xs = sorted(pts)
                    ax.plot(xs, [sum(pts[x]) / len(pts[x]) for x in xs], color=matplotlib.cm.viridis(b / 12),
                            lw=1)
                ax.set_yscale('log')
                ax.set_title(f'{bb} {k} (block 0 dark .. last light)', fontsize=7)
                ax.set_xlabel('stage-1 iteration', fontsize=7)
            axes[i][0].set_ylabel('block loss (relative error)', fontsize=8)
        fig.tight_layout()
        path = osp.join(out, 'transfer_curves.png')
        fig.savefig(path, dpi=110)
        plt.close(fig)
        made.append(path)
    return made


def recipes_plot(rows: List[dict], default: str, out: str) -> Optional[str]:
    """recipes.png: per backbone (columns) and budget (rows), each recipe's paired difference to scratch per kernel
    (bar: mean over seeds, line: its 95 % interval), the 1-point target dashed; None without a second recipe."""
    recs = list(dict.fromkeys([default] + [r.get('recipe') or default for r in rows if r['start'] == 'transfer'
                                           and own_groups(r, default)]))
    if len(recs) < 2:
        return None
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    scratch = {(r['backbone'], r['kernel'], r['seed']): r['top1'] for r in rows if r['start'] == 'scratch'}
    bbs = list(dict.fromkeys(r['backbone'] for r in rows if r['start'] == 'transfer' and (r.get('recipe') or default)
                             != default))
    budgets = sorted({r['iters'] for r in rows if r['start'] == 'transfer'})
    fig, axes = plt.subplots(len(budgets), len(bbs), figsize=(5.5 * len(bbs), 3.4 * len(budgets)), squeeze=False)
    width = 0.8 / len(recs)
    for i, b in enumerate(budgets):
        for j, bb in enumerate(bbs):
            ax = axes[i][j]
            kernels = list(dict.fromkeys(r['kernel'] for r in rows if r['backbone'] == bb and r['start'] == 'transfer'
                                         and (r.get('recipe') or default) != default))
            for n, rec in enumerate(recs):
                for x, k in enumerate(kernels):
                    vals = {r['seed']: r['top1'] for r in rows if (r['backbone'], r['kernel'], r['iters']) == (bb, k, b)
                            and r['start'] == 'transfer' and (r.get('recipe') or default) == rec
                            and own_groups(r, default)}
                    m, half, _ = paired(vals, {s: scratch.get((bb, k, s)) for s in vals})
                    if m is None:
                        continue
                    pos = x - 0.4 + width * (n + 0.5)
                    ax.bar(pos, m, width, color=f'C{n}', label=rec if x == 0 else None)
                    if half is not None:
                        ax.plot([pos, pos], [m - half, m + half], color='black', lw=0.8)
            ax.axhline(0, color='black', lw=0.6)
            ax.axhline(-1, color='grey', lw=0.8, linestyle='--')
            ax.set_xticks(range(len(kernels)))
            ax.set_xticklabels(kernels, fontsize=7, rotation=20)
            ax.set_title(f'{bb}, {b} of {SCRATCH_ITERS} iterations: top-1 minus scratch (paired by seed)', fontsize=8)
            ax.set_ylabel('points')
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=6)
    fig.tight_layout()
    path = osp.join(out, 'recipes.png')
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
