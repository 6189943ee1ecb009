#!/usr/bin/env python
"""The patch-majority oracle of a segmentation config's data: every p x p patch of each ground-truth map labelled
with its majority label, scored as the config's model would be (mIoU, aAcc, mAcc, as mmseg's IoUMetric): how much
of the ground truth survives a patch size alone (softfree_mm/analysis/patch_oracle.py).

    python tools/analysis/patch_oracle.py CONFIG [--split val] [--patches 4 8 16 32] [--num-images 0]
        [--out docs/results/task_study/patch_oracle.csv]

The split's ground truth through the config's pipeline (its test-time resize included); --num-images 0: every image.
Writes --out (patch, mIoU, aAcc, mAcc, images) and prints it. Bad input: one line, exit status 2.
"""
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
from _cli import Parser, fail, run  # noqa: E402


def main(argv=None):
    p = Parser(__doc__)
    p.add_argument('config')
    p.add_argument('--split', default='val')
    p.add_argument('--patches', nargs='+', type=int, default=[4, 8, 16, 32])
    p.add_argument('--num-images', type=int, default=0, help='0: every image of the split')
    p.add_argument('--out', default='docs/results/task_study/patch_oracle.csv')
    args = p.parse_args(argv)
    if any(x < 1 for x in args.patches) or len(set(args.patches)) != len(args.patches):
        fail(f'--patches {" ".join(map(str, args.patches))}: distinct sizes >= 1 (pixels)')
    if args.num_images < 0:
        fail(f'--num-images {args.num_images}: >= 0 (0: every image)')
    from softfree_mm.analysis import patch_oracle as po
    from softfree_mm.analysis import probe
    from softfree_mm.analysis.tables import write_csv
    cfg = probe.load_checked(args.config)
    ds = probe.build_dataset(cfg, args.split, args.config)
    classes = (getattr(ds, 'metainfo', None) or {}).get('classes')
    if not classes:
        fail(f'{args.config}: its {args.split} dataset names no classes (a segmentation config?)')
    ignore = int(getattr(ds, 'ignore_index', 255))
    gts = []
    for _, sample in probe.dataset_samples(ds, args.num_images or len(ds)):
        seg = getattr(sample.get('data_samples'), 'gt_sem_seg', None)
        if seg is None:
            fail(f'{args.config}: its {args.split} samples carry no gt_sem_seg (a segmentation config?)')
        gts.append(seg.data.squeeze(0).numpy().astype('int64'))
    rows = po.oracle_rows(gts, args.patches, len(classes), ignore)
    write_csv(args.out, rows, po.FIELDS)
    for r in rows:
        print(f"patch {r['patch']:>3} px: mIoU {r['mIoU']:.1f}  aAcc {r['aAcc']:.1f}  mAcc {r['mAcc']:.1f}  "
              f"({r['images']} images)")
    print(f'wrote {args.out}')
    return 0


if __name__ == '__main__':
    sys.exit(run(main))
