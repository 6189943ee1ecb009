"""Per attention layer, at several input sizes, the classifiers and segmentors of the detection and segmentation
study (tools/analysis/task_study.py), read from its work dir: what each kernel sees and gives (layer_stats.py) in the
model a segmentor started from and in the segmentor it became, each on its own val images, under the study row's
identity and result (mIoU, at the all-background floor or not); for a row from scratch also the classifier's model at
its random initialisation (``init``: the classifier's config, ``init_weights`` with torch seeded by the row's seed:
the scale a from-scratch classifier starts from, not the run's exact draw). The measurement behind docs/study.md's
"Why x^3 / sqrt(N) collapses in segmentation".
"""
import os.path as osp
from typing import List, Optional, Sequence

import torch

from .task_curves import IDENTITY

FIELDS = (*IDENTITY, 'model', 'mIoU', 'floor', 'size', 'layer', 'images', 'rows', 'keys', 'fro_sqrt_n',
          'score_rms', 'v_rms', 'out_rms', 'gain', 'stream_rms', 'branch_rms', 'branch_ratio')
MODELS = ('init', 'classifier', 'segmentor')


def models_of(study, rows: Sequence[dict], floor_macc: float, models: Sequence[str] = MODELS) -> List[dict]:
    """Per ok segmentation row whose runs are in the study's work dir (its report-only runner): the classifier it
    started from and the segmentor, and for a row from scratch the classifier's initialisation ('init', checkpoint
    'none'), each as (identity, model, config, checkpoint, mIoU, floor)."""
    from .sweep import safe_name
    out = []
    for r in rows:
        if r.get('task') != 'seg':
            continue
        seg = study.local_run(r)
        cls = study.local_classifier(r) if seg else None
        if not (seg and cls):
            continue
        base = dict({k: r[k] for k in IDENTITY}, mIoU=r.get('mIoU'),
                    floor=r.get('mAcc') is not None and r['mAcc'] < floor_macc)
        init = dict(cls, checkpoint='none') if r.get('start') == 'scratch' else None
        for model, run in (('init', init), ('classifier', cls), ('segmentor', seg)):
            if model in models and run:
                config = osp.join(study.r.folder(run['key']), f"{safe_name(run['key'])}.py")
                out.append(dict(base, model=model, config=config, checkpoint=run['checkpoint']))
    return out


def measure(entry: dict, sizes: Sequence[int], num_images: int, split: str = 'val') -> List[dict]:
    """layer_stats' per-layer means over ``num_images`` of the model's own ``split`` at each size, as FIELDS rows."""
    from . import probe
    from .layer_stats import layer_stats, summarise
    cfg = probe.load_checked(entry['config'])
    ds = probe.build_dataset(cfg, split, entry['config'])
    if entry['checkpoint'] == 'none':  # the initialisation (init_weights), torch seeded by the row's seed
        torch.manual_seed(int(entry['seed']))
    model = probe.build_model(cfg, entry['checkpoint'], entry['config'])
    rows = layer_stats(model, probe.dataset_samples(ds, num_images), sizes, probe.pick_layers(model, None),
                       jacobian=False)
    base = {k: entry[k] for k in (*IDENTITY, 'model', 'mIoU', 'floor')}
    return [dict(base, **{k: s.get(k) for k in FIELDS if k in s}) for s in summarise(rows)]


def largest_gain(rows: Sequence[dict]) -> List[dict]:
    """Per (identity, model, size): the layer of the largest output gain over v, that gain, that layer's output and
    score RMS, and the median gain of the layers (the summary docs/study.md shows; the CSV holds every layer)."""
    groups = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in (*IDENTITY, 'model', 'size')), []).append(r)
    out = []
    for key, rs in groups.items():
        gains = sorted(float(r['gain']) for r in rs if r.get('gain') not in (None, ''))
        if not gains:
            continue
        top = max(rs, key=lambda r: float(r['gain']) if r.get('gain') not in (None, '') else float('-inf'))
        mid = len(gains) // 2
        median = gains[mid] if len(gains) % 2 else (gains[mid - 1] + gains[mid]) / 2
        ratios = [float(r['branch_ratio']) for r in rs if r.get('branch_ratio') not in (None, '')]
        out.append(dict(zip((*IDENTITY, 'model', 'size'), key), mIoU=rs[0]['mIoU'], floor=rs[0]['floor'],
                        top_layer=top['layer'], top_gain=float(top['gain']), median_gain=median,
                        top_out_rms=float(top['out_rms']), top_score_rms=float(top['score_rms']),
                        max_branch_ratio=max(ratios) if ratios else None))
    return out


def _bool(v) -> bool:
    return v is True or str(v) == 'True'


def markdown(summary: Sequence[dict], sizes: Optional[Sequence[int]] = None) -> str:
    """One line per (run, model): the largest gain's layer and the largest and median gains at each size."""
    sizes = list(sizes or dict.fromkeys(int(e['size']) for e in summary))
    by = {}
    for e in summary:
        by.setdefault(tuple(e[k] for k in (*IDENTITY, 'model')), {})[int(e['size'])] = e
    head = ['layout', 'kernel', 'start', 'seed', 'model', 'segmentor mIoU', 'at the floor',
            'layer of the largest gain (first size)'] + \
        [f'largest gain at {s} px' for s in sizes] + [f'its score RMS at {s} px' for s in sizes] + \
        [f'median gain at {s} px' for s in sizes] + [f'largest branch / stream at {s} px' for s in sizes]
    lines = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
    for key, per in by.items():
        first = per[sizes[0]] if sizes[0] in per else next(iter(per.values()))
        d = dict(zip((*IDENTITY, 'model'), key))
        miou = first['mIoU']
        cells = [d['layout'], f"`{d['kernel']}`", d['start'], str(d['seed']), d['model'],
                 '' if miou in (None, '') else f'{float(miou):.1f}', 'yes' if _bool(first['floor']) else 'no',
                 first['top_layer'].replace('backbone.', '')]
        cells += [f"{per[s]['top_gain']:.3g}" if s in per else '' for s in sizes]
        cells += [f"{per[s]['top_score_rms']:.3g}" if s in per else '' for s in sizes]
        cells += [f"{per[s]['median_gain']:.3g}" if s in per else '' for s in sizes]
        cells += [f"{per[s]['max_branch_ratio']:.3g}" if s in per and per[s].get('max_branch_ratio') is not None
                  else '' for s in sizes]
        lines.append('| ' + ' | '.join(cells) + ' |')
    return '\n'.join(lines) + '\n'


def section_lines(rows: Sequence[dict]) -> List[str]:
    """docs/study.md's generated lines from layer_stats.csv's rows: the summary table (or a line saying that
    nothing is measured yet)."""
    if not rows:
        return ['No classifier or segmentor measured yet (tools/analysis/task_layer_stats.py writes '
                'results/task_study/layer_stats.csv).']
    summary = largest_gain(rows)
    sizes = sorted({int(e['size']) for e in summary})
    return ['Per run and model, the attention layers\' output gain over v (the RMS of the kernel\'s output over the '
            'RMS of v, the mean over the images) and the largest ratio of an attention branch to the residual stream '
            'it is added to (the RMS of the branch after its output projection over the RMS of the block\'s input; '
            'blank where a row was measured before that column); every layer and measure is in '
            '[layer_stats.csv](results/task_study/layer_stats.csv)):', '', markdown(summary, sizes).rstrip()]
