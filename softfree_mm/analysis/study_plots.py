"""The kernel study's figures: accuracy bars with the seeds' spread, and the norm curves against iteration and N
(the polynomial paper's figures at small scale). Each kernel keeps its colour, line style and marker in every
figure."""
import statistics
from collections import OrderedDict
from typing import List, Optional, Sequence

from .study import CHANCE


def _colours(kernels):
    import matplotlib.pyplot as plt
    cmap = plt.get_cmap('tab10' if len(kernels) <= 10 else 'tab20')
    return {k: cmap(i % cmap.N) for i, k in enumerate(kernels)}


def _styles(kernels):
    """Colour, line style and marker per kernel: curves that lie on each other stay told apart."""
    colours = _colours(kernels)
    return {k: dict(color=colours[k], linestyle=('-', '--', '-.', ':')[i % 4], marker='os^vDP<>Xp'[i % 10])
            for i, k in enumerate(kernels)}


def plot_accuracy(rows: List[dict], summary: List[dict], path: str, titles=None, chance: float = CHANCE) -> str:
    """One panel per config: per kernel the mean final top-1 (bar) with the seeds' standard deviation (error bar),
    each seed's final top-1 (dots) and the mean best (open diamond); refused kernels named in grey."""
    from . import plots
    import matplotlib.pyplot as plt
    configs = list(dict.fromkeys(e['config'] for e in summary))
    kernels = list(dict.fromkeys(e['kernel'] for e in summary))
    what = {e['kernel']: e['what'] for e in summary}
    colours = {k: st['color'] for k, st in _styles(kernels).items()}
    fig, axes = plt.subplots(1, len(configs), figsize=(max(6.0, 0.55 * len(kernels) + 2.5) * len(configs), 4.8),
                             squeeze=False)
    for ax, config in zip(axes[0], configs):
        for i, k in enumerate(kernels):
            e = next((x for x in summary if x['config'] == config and x['kernel'] == k), None)
            if e is None:
                continue
            if not e['n']:
                ax.text(i, chance + 2, 'refused' if 'cannot be used' in e['error'] else 'failed', rotation=90,
                        ha='center', va='bottom', fontsize=7, color='grey')
                continue
            ax.bar(i, e['top1_final'], 0.7, color=colours[k], alpha=0.85,
                   yerr=e['top1_final_std'] or 0.0, capsize=3, error_kw=dict(lw=1))
            seeds = [r['top1_final'] for r in rows if r['config'] == config and r['kernel'] == k and
                     r['status'] == 'ok']
            ax.scatter([i] * len(seeds), seeds, s=9, color='black', zorder=3)
            ax.scatter([i], [e['top1_best']], s=28, marker='D', facecolors='none', edgecolors='black', zorder=3,
                       linewidths=0.8)
        ax.axhline(chance, color='grey', linestyle='--', linewidth=1)
        ax.set_xticks(range(len(kernels)))
        ax.set_xticklabels([what[k] for k in kernels], rotation=55, ha='right', fontsize=7)
        ax.set_xlim(-0.6, len(kernels) - 0.4)
        ax.set_ylim(0, 100)
        ax.set_ylabel('final top-1 % on validation')
        ax.set_title(f'{(titles or {}).get(config, config)}\nbar: mean over seeds ± std, dots: seeds, '
                     f'diamond: mean best, dashed: chance {chance:.0f} %', fontsize=8)
        ax.grid(True, axis='y', alpha=0.3)
    return plots.save(fig, path)


def _curve_by_step(curves, config, kernel, key):
    """step -> per-seed mean over layers of ``key``; returns (steps, mean over seeds, min, max)."""
    per = OrderedDict()
    for c in curves:
        if c['config'] == config and c['kernel'] == kernel and c[key] is not None:
            per.setdefault(c['step'], {}).setdefault(c['seed'], []).append(c[key])
    steps, mean, lo, hi = [], [], [], []
    for step in sorted(per):
        seed_means = [statistics.fmean(v) for v in per[step].values()]
        steps.append(step)
        mean.append(statistics.fmean(seed_means))
        lo.append(min(seed_means))
        hi.append(max(seed_means))
    return steps, mean, lo, hi


def plot_norms(curves: List[dict], config: str, kernels: Sequence[str], path: str, descriptions=None,
               title: str = '') -> Optional[str]:
    """||A||_F / sqrt(N) and ||dA/dS||_F / sqrt(N) against iteration (mean over layers; line: mean over seeds,
    band: the seeds' range), one line per kernel (no Jacobian line: the kernel has no score map); where the layers
    have several N, a second row: ||A||_F / sqrt(N) against N at the first record (initialisation) and at the last
    (mean over the layers of that N and over seeds)."""
    import matplotlib.pyplot as plt
    mine = [c for c in curves if c['config'] == config]
    if not mine:
        return None
    styles = _styles(kernels)  # over all the study's kernels: each kernel has its colour in every figure
    kernels = [k for k in kernels if any(c['kernel'] == k for c in mine)]
    ns = sorted({c['rows'] for c in mine})
    rows = 2 if len(ns) > 1 else 1
    fig, axes = plt.subplots(rows, 2, figsize=(12.5, 4.4 * rows), squeeze=False)
    for ax, key, label in ((axes[0][0], 'fro_sqrt_n', '||A||_F / sqrt(N)'),
                           (axes[0][1], 'jac_sqrt_n', '||dA/dS||_F / sqrt(N)')):
        for k in kernels:
            steps, mean, lo, hi = _curve_by_step(mine, config, k, key)
            if not steps:
                continue
            ax.plot(steps, mean, label=(descriptions or {}).get(k, k), linewidth=1.3, markersize=3.5,
                    markevery=max(1, len(steps) // 6), **styles[k])
            ax.fill_between(steps, lo, hi, color=styles[k]['color'], alpha=0.15, linewidth=0)
        ax.set_xlabel('iteration')
        ax.set_ylabel(label + ', mean over layers', fontsize=9)
        ax.set_yscale('log')
        ax.grid(True, which='both', alpha=0.3)
    if rows == 2:
        for ax, pick, when in ((axes[1][0], min, 'first record (initialisation)'), (axes[1][1], max, 'last record')):
            for k in kernels:
                step = pick(c['step'] for c in mine if c['kernel'] == k)
                pts = []
                for n in ns:
                    per_seed = {}
                    for c in mine:
                        if c['kernel'] == k and c['step'] == step and c['rows'] == n:
                            per_seed.setdefault(c['seed'], []).append(c['fro_sqrt_n'])
                    if per_seed:
                        pts.append((n, statistics.fmean(statistics.fmean(v) for v in per_seed.values())))
                if pts:
                    ax.plot(*zip(*pts), markersize=4, linewidth=1.3, **styles[k])
            ax.set_xscale('log')
            ax.set_yscale('log')
            ax.set_xlabel('N (tokens of the layer; one stage each)')
            ax.set_ylabel(f'||A||_F / sqrt(N) at the {when}', fontsize=9)
            ax.grid(True, which='both', alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    legend = fig.legend(handles, labels, fontsize=8, loc='center left', bbox_to_anchor=(1.0, 0.5))
    fig.savefig(path, dpi=85, bbox_inches='tight', bbox_extra_artists=[legend])
    plt.close(fig)
    return path
