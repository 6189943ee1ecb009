"""Train a detector, segmentor or classifier from a softfree_mm (or any mmdet / mmseg / mmpretrain) config.

    python tools/train.py configs/maskrcnn_xcit_s12_poly3.py [--work-dir DIR] [--amp [--amp-dtype D]]
        [--resume [CKPT]] [--auto-scale-lr] [--device auto|cuda|cpu] [--skip-nonfinite-loss]
        [--cfg-options KEY=VALUE ...] [--launcher none|pytorch|slurm|mpi] [--dry-run]

Bad input (config, data, device, a file met while running, a NaN / inf loss) stops with one line on stderr and exit
status 2; ``--resume`` continues from the newest readable checkpoint and reproduces the uninterrupted run;
``--dry-run`` checks the config without its data set and trains nothing (docs/training.md, docs/reliability.md).
Demo data roots (``data/demo/...``) are written on demand (softfree_mm/engine/demo_data.py, as
tools/make_demo_data.py does).
"""
import os.path as osp
import sys

import tool_warnings  # noqa: F401  (tools/tool_warnings.py: before the OpenMMLab stack is imported)

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))  # the repository, for `softfree_mm`

from softfree_mm.engine.train_cli import check_start, main, parse_args, prepare  # noqa: E402,F401  (the tool's logic)

if __name__ == '__main__':
    sys.exit(main())
