"""The benchmark's output: markdown tables, CSV files, and the kernels' latency and memory plot against N."""
import math
from typing import Dict, List, Sequence

from .kernels import scaling


def markdown(rows: List[Dict], columns: Sequence[str]) -> str:
    def fmt(v):
        if v is None:
            return '-'
        if isinstance(v, float):
            if math.isnan(v):
                return '-'
            return f'{v:.3g}' if abs(v) < 100 else f'{v:.0f}'
        return str(v)

    cols = [c for c in columns if any(c in r for r in rows)]
    lines = ['| ' + ' | '.join(cols) + ' |', '|' + '---|' * len(cols)]
    for r in rows:
        lines.append('| ' + ' | '.join(fmt(r.get(c)) for c in cols) + ' |')
    return '\n'.join(lines)



def plot(rows: List[Dict], path: str, reference='softmax') -> None:
    """Latency and peak memory against N, log-log, one line per kernel (forward + backward where measured),
    the fitted slope in the legend."""
    import matplotlib

    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    p = 'fwdbwd' if any(r['pass'] == 'fwdbwd' for r in rows) else 'fwd'
    fits = {s['kernel']: s for s in scaling(rows, reference) if s['pass'] == p}
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    for kernel, s in fits.items():
        pts = sorted((r for r in rows if r['kernel'] == kernel and r['pass'] == p), key=lambda r: r['N'])
        ns = [r['N'] for r in pts]
        axes[0].loglog(ns, [r['ms'] for r in pts], 'o-', label=f"{kernel} (slope {s['time_slope']:.2f})")
        if 'memory_slope' in s:
            axes[1].loglog(ns, [max(r['peak_MiB'], 1e-3) for r in pts], 'o-',
                           label=f"{kernel} (slope {s['memory_slope']:.2f})")
    what = 'forward + backward' if p == 'fwdbwd' else 'forward'
    axes[0].set(xlabel='tokens N', ylabel=f'{what} ms', title='latency')
    axes[1].set(xlabel='tokens N', ylabel='peak MiB beyond the inputs', title='memory')
    for ax in axes:
        ax.grid(True, which='both', alpha=0.3)
        ax.legend(fontsize=7)
    r0 = rows[0]
    fig.suptitle(f"B={r0['batch']} heads={r0['heads']} head_dim={r0['head_dim']} {r0['dtype']} {r0['device']} "
                 f"threads={r0['threads']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
