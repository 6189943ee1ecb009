"""Figures of the analysis tools (matplotlib, no display needed)."""
import math
from collections import OrderedDict
from typing import Dict, List, Optional, Sequence

import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402


def save(fig, path: str) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def norms_vs_n(rows: List[dict], theory: Dict[str, Dict[str, List[float]]], path: str, title: str = '') -> str:
    """Two log-log panels (||A||_F, score-Jacobian norm) against N, one line per kernel, theory dashed. ``theory``:
    label -> dict(n=[...], fro=[...] and / or jac=[...]); a label may carry a per-panel name as 'fro: ...|jac: ...'."""
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    kernels = list(OrderedDict.fromkeys(r['kernel'] for r in rows))
    colours = plt.get_cmap('tab20')
    markers = 'os^vD<>phX*'
    for ax, key, label in ((axes[0], 'fro', '||A||_F'), (axes[1], 'jac', '||dA/dS||_F (no line: no score map)')):
        for i, kname in enumerate(kernels):
            pts = [(r['n'], r[key]) for r in rows if r['kernel'] == kname and r[key] is not None]
            if pts:
                ax.plot(*zip(*pts), marker=markers[i % len(markers)], color=colours(i % 20), label=kname,
                        linewidth=1.3, markersize=4)
        for tname, curve in theory.items():
            if key in curve:
                ax.plot(curve['n'], curve[key], linestyle='--', linewidth=1.2,
                        color='black' if 'softmax' in tname else 'grey', label=curve.get(f'label_{key}', tname))
        ax.set_xscale('log')
        ax.set_yscale('log')
        ax.set_xlabel('N (tokens)')
        ax.set_ylabel(label)
        ax.grid(True, which='both', alpha=0.3)
        ax.legend(fontsize=7, loc='center left', bbox_to_anchor=(1.0, 0.5))
    if title:
        fig.suptitle(title, fontsize=10)
    return save(fig, path)


def curves_per_layer(steps_by_layer: Dict[str, Dict[str, List]], path: str, keys=('fro', 'jac'),
                     labels=('||A||_F', '||dA/dS||_F'), title: str = '') -> str:
    """One panel per metric: value against training iteration, one line per layer (coloured by depth)."""
    keys = [k for k in keys if any(k in d for d in steps_by_layer.values())]
    fig, axes = plt.subplots(1, max(1, len(keys)), figsize=(6.5 * max(1, len(keys)), 4.8), squeeze=False)
    cmap = plt.get_cmap('viridis')
    n = max(1, len(steps_by_layer) - 1)
    for ax, key in zip(axes[0], keys):
        for i, (layer, d) in enumerate(steps_by_layer.items()):
            if key in d:
                ax.plot(d['step_' + key], d[key], color=cmap(i / n), label=layer, linewidth=1.2, marker='o',
                        markersize=2.5)
        ax.set_xlabel('iteration')
        ax.set_ylabel(dict(zip(('fro', 'jac'), labels)).get(key, key))
        ax.set_yscale('log')
        ax.grid(True, which='both', alpha=0.3)
    if steps_by_layer:
        axes[0][-1].legend(fontsize=6, loc='center left', bbox_to_anchor=(1.0, 0.5))
    if title:
        fig.suptitle(title, fontsize=10)
    return save(fig, path)


def per_layer_bars(layers: Sequence[str], values: Sequence[float], path: str, ylabel: str, title: str = '',
                   reference: Optional[Sequence[float]] = None, reference_label: str = '',
                   log: bool = False) -> str:
    fig, ax = plt.subplots(figsize=(max(6.0, 0.45 * len(layers) + 2), 4.8))
    x = list(range(len(layers)))
    ax.bar(x, values, color='tab:blue', label=ylabel)
    if reference is not None:
        ax.scatter(x, reference, color='tab:red', marker='_', s=300, linewidths=2, label=reference_label, zorder=3)
    ax.set_xticks(x)
    ax.set_xticklabels([_short(n) for n in layers], rotation=70, ha='right', fontsize=7)
    ax.set_ylabel(ylabel)
    if log:
        ax.set_yscale('symlog', linthresh=1.0)
    ax.grid(True, axis='y', alpha=0.3)
    if reference is not None:
        ax.legend(fontsize=8)
    if title:
        ax.set_title(title, fontsize=10)
    return save(fig, path)


def grouped_bars(groups: Sequence[str], series: Dict[str, Sequence[Optional[float]]], path: str,
                 panels: Sequence[str], titles: Sequence[str]) -> str:
    """One panel per quantity; bars per kernel (series), groups along x (configs)."""
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.6), squeeze=False)
    names = list(series)
    width = 0.8 / max(1, len(names))
    for ax, panel, title in zip(axes[0], panels, titles):
        for i, name in enumerate(names):
            vals = series[name][panel]
            xs = [g + (i - (len(names) - 1) / 2) * width for g in range(len(groups))]
            ax.bar(xs, [v if v is not None and math.isfinite(v) else 0.0 for v in vals], width, label=name)
        ax.set_xticks(range(len(groups)))
        ax.set_xticklabels(groups, fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.grid(True, axis='y', alpha=0.3)
    axes[0][0].legend(fontsize=7)
    return save(fig, path)


def _short(name: str) -> str:
    return name.replace('backbone.', '').replace('stages.', 's').replace('blocks.', 'b').replace('branches.', 'br')
