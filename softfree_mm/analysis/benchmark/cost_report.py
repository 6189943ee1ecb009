"""The cost sweep's report (``tools/benchmark.py backbone --layouts``): from its CSV rows, per layout and kernel the
crossover with softmax and the largest size run, a table, a plot, and the findings, all written between the markers
of a docs page, so no figure of the sweep is typed by hand.

One rule says "cheaper" and "a tie": a kernel's inference time over softmax's at the same size is a tie within
``[1 / TIE, TIE]`` (timings repeat within a few per cent on the sweep's machine), cheaper below, dearer above; a
size where softmax went over a limit and the kernel ran counts as cheaper, the reverse as dearer.

Growth: a kernel's exponent in pixels (least squares of log time and log memory over the COCO-aspect sizes it ran,
three at least) against softmax's in the same layout. A set-up whose declared class (the worst ``complexity`` of its
kernels, which the sweep records in each row) is linear may grow no faster than ``max(1, softmax's) +
GROWTH_MARGIN``; a quadratic or cubic one (the official InLine / Agent / SOFT set-ups keep softmax in a stage) may
grow as softmax may, and a row without a recorded class has no bound. The memory exponent (the tensors' peak, an
exact instrument) decides; the time exponent is shown beside it (on this 2-core machine it carries memory-bandwidth
effects: linear attention in Swin-T's windows grows as time^1.19, softmax there as time^1.21). A set-up beyond its
bound is flagged in the findings: a figure its declared class does not allow, a defect to explain.
"""
import math
import os.path as osp
from typing import Dict, List, Optional

from .cost import SEG_SIZE
from .cost_layouts import COST_KERNELS, COST_LAYOUTS

TIE = 1.1
GROWTH_MARGIN = 0.1


def verdict(ratio: float) -> str:
    """'cheaper' | 'a tie' | 'dearer' for a kernel's time (or memory) over softmax's."""
    if ratio < 1 / TIE:
        return 'cheaper'
    return 'dearer' if ratio > TIE else 'a tie'


def ordered(rows: List[dict]) -> List[dict]:
    """The rows in the sweep's order, whatever order the CSV holds them in (a later run appends): the backbones by
    layout and kernel as ``COST_LAYOUTS`` and ``COST_KERNELS`` list them (others after, as they come), then the whole
    models."""
    def key(r):
        lay, ker = list(COST_LAYOUTS), list(COST_KERNELS)
        return (r.get('what') != 'backbone', lay.index(r['layout']) if r.get('layout') in lay else len(lay),
                ker.index(r['kernel']) if r.get('kernel') in ker else len(ker))
    return sorted(rows, key=key)


def _num(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def crossovers(rows: List[dict], reference: str = 'softmax') -> List[dict]:
    """Per layout and kernel (but the reference): over the COCO-aspect inference rows, the smallest short side from
    which the kernel is cheaper than softmax at every size measured, that one and each above it ('cheaper_from':
    cheaper by the tie rule where both ran, or running where softmax is over a limit; a kernel cheaper at one size
    and a tie or dearer at a larger one has none); where softmax is over a limit and the kernel is not ('softmax_over_from', never an
    extrapolated figure); the largest short side the kernel ran within the limits ('largest')."""
    rows = ordered(rows)
    out = []
    coco = [r for r in rows if r.get('what') == 'backbone' and r.get('pass') == 'fwd' and
            r.get('size') != 'x'.join(map(str, SEG_SIZE))]
    for layout in dict.fromkeys(r['layout'] for r in coco):
        ref = {int(r['short_side']): r for r in coco if r['layout'] == layout and r['kernel'] == reference}
        for kernel in dict.fromkeys(r['kernel'] for r in coco if r['layout'] == layout):
            mine = {int(r['short_side']): r for r in coco if r['layout'] == layout and r['kernel'] == kernel}
            ok = sorted(s for s, r in mine.items() if r.get('status') == 'ok')
            e = dict(layout=layout, kernel=kernel, largest=ok[-1] if ok else None,
                     status=next((r['status'] for r in mine.values() if r.get('status') != 'ok'), 'ok'))
            if kernel != reference:
                over = [s for s in ok if _over(ref.get(s))]
                verdicts = {}  # side -> True (cheaper) / False (not); sides neither ran are left out
                for s in sorted(set(mine) | set(ref)):
                    a, b = mine.get(s, {}), ref.get(s, {})
                    if a.get('status') == 'ok' and b.get('status') == 'ok':
                        verdicts[s] = verdict(_num(a['ms']) / _num(b['ms'])) == 'cheaper'
                    elif a.get('status') == 'ok' and _over(b):
                        verdicts[s] = True
                    elif _over(a) and b.get('status') == 'ok':
                        verdicts[s] = False
                sides = sorted(verdicts)
                stable = [s for i, s in enumerate(sides) if all(verdicts[t] for t in sides[i:])]
                e.update(cheaper_from=stable[0] if stable else None,
                         softmax_over_from=over[0] if over else None,
                         ratio_at={s: _num(mine[s]['ms']) / _num(ref[s]['ms']) for s in ok
                                   if ref.get(s, {}).get('status') == 'ok'})
            out.append(e)
    return out


def _over(row: Optional[dict]) -> bool:
    """A case that was run and exceeded a limit (not 'not run', not a fit error, not a failure)."""
    return bool(row) and str(row.get('status', '')).startswith('over the')


def _span(values) -> str:
    lo, hi = f'{min(values):.2f}', f'{max(values):.2f}'
    return f'{lo}x' if lo == hi else f'{lo}-{hi}x'


def _sides(sides) -> str:
    return ', '.join(str(s) for s in sides)


def _limit(row) -> str:
    return 'the memory limit' if 'memory' in str(row.get('status')) else 'the time limit'


def _memory(r: dict) -> float:
    """The memory a row's pass added: its tensors' peak where measured (exact), else the resident set's."""
    return _num(r.get('tensor_MiB')) if _num(r.get('tensor_MiB')) is not None else _num(r['peak_MiB'])


def _memory_ratio(r: dict, b: dict) -> float:
    """``r``'s memory over ``b``'s, by one instrument: the tensors' peak where both rows have it, else the resident
    set's."""
    if _num(r.get('tensor_MiB')) is not None and _num(b.get('tensor_MiB')) is not None:
        return _num(r['tensor_MiB']) / max(_num(b['tensor_MiB']), 1e-9)
    return _num(r['peak_MiB']) / max(_num(b['peak_MiB']), 1e-9)


def _fit(points) -> Optional[float]:
    """The least-squares slope of log y against log x over (x, y) points (three at least), else None."""
    pts = [(math.log(x), math.log(y)) for x, y in points if x and y and x > 0 and y > 0]
    if len(pts) < 3:
        return None
    mx, my = sum(p[0] for p in pts) / len(pts), sum(p[1] for p in pts) / len(pts)
    var = sum((p[0] - mx) ** 2 for p in pts)
    return sum((p[0] - mx) * (p[1] - my) for p in pts) / var if var else None


def growth(rows: List[dict], reference: str = 'softmax') -> List[dict]:
    """Per layout and kernel: its exponents in pixels (time, memory), softmax's in the layout, the kernel's class,
    the memory bound that class allows (None: no bound) and whether the kernel exceeds it."""
    rows = ordered(rows)
    coco = [r for r in rows if r.get('what') == 'backbone' and r.get('pass') == 'fwd' and r.get('status') == 'ok'
            and r.get('size') != 'x'.join(map(str, SEG_SIZE))]

    def exps(layout, kernel):
        mine = [r for r in coco if r['layout'] == layout and r['kernel'] == kernel]
        px = [math.prod(int(v) for v in r['size'].split('x')) for r in mine]
        return (_fit(zip(px, (_num(r['ms']) for r in mine))), _fit(zip(px, (_memory(r) for r in mine))))
    out = []
    for layout in dict.fromkeys(r['layout'] for r in coco):
        ref = exps(layout, reference)
        for kernel in dict.fromkeys(r['kernel'] for r in coco if r['layout'] == layout):
            t, m = exps(layout, kernel)
            cls = next((r.get('class') for r in coco if r['layout'] == layout and r['kernel'] == kernel
                        and r.get('class')), None)  # the declared class the sweep recorded
            bound = None
            if kernel != reference and m is not None and ref[1] is not None and cls == 'linear':
                bound = max(1.0, ref[1]) + GROWTH_MARGIN
            out.append(dict(layout=layout, kernel=kernel, time=t, memory=m, ref_time=ref[0], ref_memory=ref[1],
                            cls=cls, bound=bound, beyond=bound is not None and m > bound))
    return out


def _growth_line(rows: List[dict], reference: str = 'softmax') -> List[str]:
    """The findings' lines on growth: each kernel beyond its class's bound, or one line saying none is."""
    flagged = [g for g in growth(rows, reference) if g['beyond']]
    if not flagged:
        return [f'- **Growth**: no kernel grows faster in pixels than its declared class allows beside {reference} '
                f'(memory exponents; the rule above).']
    return [f"- **{g['layout']}**, `{g['kernel']}` (declared {g['cls']}): **grows faster than its class allows**, "
            f"memory^{g['memory']:.2f} in pixels against {reference}'s memory^{g['ref_memory']:.2f} (bound "
            f"{g['bound']:.2f}); time^{g['time']:.2f} against {g['ref_time']:.2f}." for g in flagged]


def findings(rows: List[dict], reference: str = 'softmax') -> str:
    """One line per layout and kernel, from the rows alone: the time ratio to softmax at each COCO-aspect size both
    ran (its span and which sizes are cheaper, ties or dearer by the tie rule), where either went over a limit, the
    memory ratio's span, forward + backward and the segmentation size; then the whole models."""
    rows = ordered(rows)
    out = []
    grown = {(g['layout'], g['kernel']): g for g in growth(rows, reference)}
    back = [r for r in rows if r.get('what') == 'backbone']
    seg = 'x'.join(map(str, SEG_SIZE))
    for layout in dict.fromkeys(r['layout'] for r in back):
        mine = [r for r in back if r['layout'] == layout]
        ref = {(r['pass'], r['size']): r for r in mine if r['kernel'] == reference}
        misfits = []
        for kernel in dict.fromkeys(r['kernel'] for r in mine if r['kernel'] != reference):
            kr = [r for r in mine if r['kernel'] == kernel]
            if all(r.get('status') == 'does not fit' for r in kr):
                misfits.append(kernel)
                continue
            coco = sorted((int(r['short_side']), r) for r in kr if r['pass'] == 'fwd' and r['size'] != seg)
            groups: Dict[str, List[int]] = {}
            times, mems, parts = [], [], []
            for side, r in coco:
                b = ref.get(('fwd', r['size']), {})
                if r.get('status') == 'ok' and b.get('status') == 'ok':
                    t = _num(r['ms']) / _num(b['ms'])
                    times.append(t)
                    mems.append(_memory_ratio(r, b))
                    groups.setdefault(verdict(t), []).append(side)
                elif r.get('status') == 'ok' and _over(b):
                    parts.append(f'runs at {side} where softmax is over {_limit(b)}')
                elif _over(r):
                    parts.append(f'over {_limit(r)} at {side}' + (' (softmax ran)' if b.get('status') == 'ok' else ''))
            if times:
                said = '; '.join(f'{v} at {_sides(groups[v])}' for v in ('cheaper', 'a tie', 'dearer') if v in groups)
                parts.insert(0, f'{_span(times)} softmax\'s inference time ({said}), memory {_span(mems)}')
            g = grown.get((layout, kernel))
            if g and g['time'] is not None and g['ref_time'] is not None:
                parts.append(f"growth in pixels time^{g['time']:.2f}, memory^{g['memory']:.2f} (softmax "
                             f"{g['ref_time']:.2f}, {g['ref_memory']:.2f})")
            for what, key in (('forward + backward', 'fwdbwd'), ('at 512x2048', 'fwd')):
                r = next((x for x in kr if x['pass'] == key and (key == 'fwdbwd' or x['size'] == seg)), None)
                b = ref.get((key, r['size'])) if r else None
                if r and b and r.get('status') == 'ok' and b.get('status') == 'ok':
                    t = _num(r['ms']) / _num(b['ms'])
                    parts.append(f"{what} {t:.2f}x ({verdict(t)})" + (f" at {r['size']}" if key == 'fwdbwd' else ''))
            out.append(f"- **{layout}**, `{kernel}`: " + '; '.join(parts) + '.')
        if misfits:
            out.append(f"- **{layout}**: {', '.join(f'`{k}`' for k in misfits)} do not fit this layout.")
    whole = [r for r in rows if r.get('what') != 'backbone' and r.get('status') == 'ok']
    for model in dict.fromkeys((r['what'], r['layout']) for r in whole):
        ref = {r['size']: r for r in whole if (r['what'], r['layout']) == model and r['kernel'] == reference}
        for kernel in dict.fromkeys(r['kernel'] for r in whole if (r['what'], r['layout']) == model
                                    and r['kernel'] != reference):
            pts = [(r['size'], _num(r['ms']) / _num(ref[r['size']]['ms'])) for r in whole
                   if (r['what'], r['layout']) == model and r['kernel'] == kernel and r['size'] in ref]
            if pts:
                out.append(f"- **{model[0]} {model[1]}** (whole model), `{kernel}`: "
                           + ', '.join(f'{t:.2f}x at {s} ({verdict(t)})' for s, t in pts) + '.')
    if grown:
        out += _growth_line(rows, reference)
    return '\n'.join(out)


def markdown(rows: List[dict]) -> str:
    """A table per layout: a row per kernel, a column per size (inference ms and the memory the pass adds), the
    forward + backward and segmentation columns, and the crossover and largest size; then the whole models."""
    rows = ordered(rows)
    lines = []
    cross = {(e['layout'], e['kernel']): e for e in crossovers(rows)}
    back = [r for r in rows if r.get('what') == 'backbone']
    for layout in dict.fromkeys(r['layout'] for r in back):
        mine = [r for r in back if r['layout'] == layout]
        cols = list(dict.fromkeys((r['pass'], r['size']) for r in mine))
        head = [f"{'fwd+bwd' if p == 'fwdbwd' else 'fwd'} {s}" for p, s in cols]
        lines += [f'#### {layout}', '', '| kernel | ' + ' | '.join(head) + ' | cheaper than softmax from | largest |',
                  '|---' * (len(cols) + 3) + '|']
        for kernel in dict.fromkeys(r['kernel'] for r in mine):
            cells = []
            for c in cols:
                r = next((x for x in mine if x['kernel'] == kernel and (x['pass'], x['size']) == c), None)
                cells.append(_cell(r))
            e = cross.get((layout, kernel), {})
            if kernel == 'softmax':
                cheaper = 'reference'
            elif e.get('cheaper_from'):
                cheaper = f"{e['cheaper_from']}"
            elif e.get('softmax_over_from'):
                cheaper = f"softmax over the limit from {e['softmax_over_from']}"
            else:
                cheaper = 'not in the sizes run' if e.get('largest') else ''
            lines.append(f'| {kernel} | ' + ' | '.join(cells) + f" | {cheaper} | {e.get('largest') or ''} |")
        lines.append('')
    whole = [r for r in rows if r.get('what') != 'backbone']
    if whole:
        lines += ['#### Whole models (inference)', '', '| model | kernel | size | inference | backbone share |',
                  '|---|---|---|---|---|']
        for r in whole:
            bb = next((x for x in back if x['layout'] == r['layout'] and x['kernel'] == r['kernel'] and
                       x['pass'] == 'fwd' and x['size'] == r['size'] and x.get('status') == 'ok'), None)
            share = (f"{_num(bb['ms']) / _num(r['ms']):.0%}" if bb and r.get('status') == 'ok' and _num(r['ms'])
                     else '')
            lines.append(f"| {r['what']} {r['layout']} | {r['kernel']} | {r['size']} | {_cell(r)} | {share} |")
        lines.append('')
    return '\n'.join(lines)


def _cell(r: Optional[dict]) -> str:
    if r is None:
        return ''
    if r.get('status') == 'ok':
        return f"{_num(r['ms']):.0f} ms, {_memory(r):.0f} MiB"
    return {'does not fit': 'does not fit', 'not run': '-'}.get(r.get('status'), r.get('status') or '')


def plot(rows: List[dict], path: str) -> str:
    """Inference ms against the short side, one line per kernel, one panel per layout (log scale); a cross at the
    top of a panel where a kernel went over a limit."""
    rows = ordered(rows)
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    from .. import plots
    coco = [r for r in rows if r.get('what') == 'backbone' and r.get('pass') == 'fwd' and
            r.get('size') != 'x'.join(map(str, SEG_SIZE))]
    layouts = list(dict.fromkeys(r['layout'] for r in coco))
    kernels = list(dict.fromkeys(r['kernel'] for r in coco))
    fig, axes = plt.subplots(1, len(layouts), figsize=(3.6 * len(layouts), 3.4), squeeze=False)
    for ax, layout in zip(axes[0], layouts):
        for i, k in enumerate(kernels):
            pts = sorted((int(r['short_side']), _num(r['ms'])) for r in coco if r['layout'] == layout and
                         r['kernel'] == k and r.get('status') == 'ok')
            if pts:
                ax.plot(*zip(*pts), marker='o', color=f'C{i}', label=k)
            over = [int(r['short_side']) for r in coco if r['layout'] == layout and r['kernel'] == k and
                    r.get('status', '').startswith('over')]
            for s in over:
                ax.scatter([s], [1], marker='x', color=f'C{i}', transform=ax.get_xaxis_transform(), clip_on=False)
        ax.set_yscale('log')
        ax.set_title(layout, fontsize=9)
        ax.set_xlabel('short side (1333:800)')
        ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel('inference ms (x: over a limit)')
    axes[0][-1].legend(fontsize=7)
    return plots.save(fig, path)


BEGIN, END = '<!-- cost: made by tools/benchmark.py backbone --layouts, do not edit by hand -->', '<!-- cost: end -->'


HEADLINE_BEGIN = '<!-- cost headline: made by tools/benchmark.py backbone --layouts --readme, do not edit by hand -->'
HEADLINE_END = '<!-- cost headline: end -->'


def headline(rows: List[dict], link: str = 'docs/benchmarks.md#what-each-kernel-costs-as-images-grow') -> str:
    """The README's bullet: per layout, the kernels cheaper than softmax by the tie rule and from which short side
    (with the ratio at the largest size both ran, or where softmax went over a limit), between its markers."""
    parts = []
    for layout in dict.fromkeys(e['layout'] for e in crossovers(rows)):
        said = []
        for e in crossovers(rows):
            if e['layout'] != layout or e['kernel'] == 'softmax' or not e.get('cheaper_from'):
                continue
            ratios = e.get('ratio_at') or {}
            top = max(ratios) if ratios else None
            at = f'{ratios[top]:.2f}x at {top}' if top else 'runs where softmax does not'
            over = (f', runs at {e["softmax_over_from"]} where softmax is over a limit'
                    if e.get('softmax_over_from') else '')
            said.append(f'`{e["kernel"]}` from {e["cheaper_from"]} ({at}{over})')
        parts.append(f'{layout}: ' + ('; '.join(said) if said else 'none'))
    text = ('- **What each kernel costs as images grow** (CPU, backbones in their detection layouts, 512 to 1600 short '
            'side; kernels cheaper than softmax by the tie rule, from which size): ' + ' | '.join(parts)
            + f'. [{link.split("#")[0]}]({link})')
    import textwrap
    lines = textwrap.wrap(text, 118, subsequent_indent='  ', break_long_words=False, break_on_hyphens=False)
    return '\n'.join([HEADLINE_BEGIN, *lines, HEADLINE_END])


def section(rows: List[dict], plot_link: Optional[str] = None) -> str:
    """The generated part of the docs page: the markers, the findings, the table and the plot's link
    (``plot_link``: relative to the page)."""
    lines = [BEGIN, '', 'What holds, by the tie rule:', '', findings(rows), '', markdown(rows).rstrip(), '']
    if plot_link:
        lines += [f'![inference time against image size]({plot_link})', '']
    lines.append(END)
    return '\n'.join(lines)


def write_docs(path: str, rows: List[dict], plot_path: Optional[str], readme: Optional[str] = None) -> None:
    """The section between the markers of ``path`` (appended under a heading when it has none); the headline between
    its markers in ``readme`` when given."""
    link = osp.relpath(plot_path, osp.dirname(path)) if plot_path else None
    from ..docs_section import write_section
    write_section(path, section(rows, link), BEGIN, END, 'What each kernel costs as images grow')
    if readme:
        anchor = osp.relpath(path, osp.dirname(osp.abspath(readme))) + '#what-each-kernel-costs-as-images-grow'
        write_section(readme, headline(rows, anchor), HEADLINE_BEGIN, HEADLINE_END, 'Headline figures')


