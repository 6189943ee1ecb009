"""The kernel study's outputs (tools/analysis/study.py): runs.csv, norm_curves.csv, identities.csv, versions.json,
summary.csv, table.md, accuracy.png and norms_<config>.png, from its rows and curves."""
import os
import os.path as osp
from typing import Dict, List, Optional, Sequence

from ..attention import kernel_label, normalize_cfg, parse_kernel
from . import study as st

CONFIGS = ('configs/demo/study_xcit_t12_digits.py', 'configs/demo/study_pvt_v2_b0_digits.py')  # the committed study
SUMMARY_FIELDS = ('config', 'kernel', 'what', 'n', 'failed', 'top1_final', 'top1_final_std', 'top1_best',
                  'top1_best_std', 'loss_final', 'loss_final_std', 'delta_paired', 'delta_paired_std', 'seeds_paired',
                  'seeds_above', 's_per_iter', 'peak_mem_mib', 'error')


def val_images(config: str, options: Optional[dict] = None) -> Optional[int]:
    """Images in the config's validation set (None when the set cannot be built here)."""
    from mmengine.registry import init_default_scope

    from ..engine import config_checks
    cfg = config_checks.load_config(config, options)
    try:
        init_default_scope(cfg.get('default_scope', 'mmpretrain'))
        from mmpretrain.registry import DATASETS
        return len(DATASETS.build(cfg.val_dataloader.dataset))
    except Exception:  # noqa: BLE001  (the table then states no standard error)
        return None


def write_outputs(rows: List[dict], curves: List[dict], out: str, configs: Sequence[str], options: Dict,
                  root: str, kept_from: Sequence[str] = ()) -> List[str]:
    """The outputs under ``out``; the lines the tool prints (the table). ``configs``: the selection's (their
    validation sets give the tables' standard errors, as do the committed study's under ``root``)."""
    from .grid_identity import write_identities
    from .tables import write_csv
    from .study_plots import plot_accuracy, plot_norms
    from ..engine.versions import write_versions
    os.makedirs(out, exist_ok=True)
    specs = [normalize_cfg(parse_kernel(k)) for k in dict.fromkeys(r['kernel'] for r in rows)]
    names = list(dict.fromkeys(r['config'] for r in rows))
    descriptions = {kernel_label(s): st.describe(s) for s in specs}
    summary = st.summarise(rows, descriptions)
    paths = {st.config_name(c): c for c in list(configs) + [osp.join(root, c) for c in CONFIGS]}
    n_val = {n: val_images(paths[n], options) if n in paths else None for n in names}
    write_csv(osp.join(out, 'runs.csv'), rows, st.RUN_FIELDS)
    write_csv(osp.join(out, 'norm_curves.csv'), curves, st.CURVE_FIELDS)
    write_identities(out, [('runs.csv', rows, st.KEY)])  # the rows runs with an identity made (none: no file)
    write_versions(out, list(kept_from))  # versions.json: this run's, the kept rows'
    write_csv(osp.join(out, 'summary.csv'), summary, SUMMARY_FIELDS)
    table = st.markdown(summary, n_val, st.TITLES)
    with open(osp.join(out, 'table.md'), 'w') as f:
        f.write(table)
    plot_accuracy(rows, summary, osp.join(out, 'accuracy.png'), st.TITLES)
    labels = [kernel_label(s) for s in specs]
    for name in names:
        plot_norms(curves, name, labels, osp.join(out, f'norms_{name}.png'), descriptions, st.TITLES.get(name, name))
    return [table]
