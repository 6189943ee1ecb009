"""The main job on the embedded demo data, as `make demo` runs it: pretrain, fine-tune, evaluate, draw, summarise.

    python tools/run_demo.py [--work-dir work_dirs/demo] [--cls-config CFG] [--det-config CFG] [--pictures N]
        [--cls-options KEY=VALUE ...] [--det-options KEY=VALUE ...] [--test-options KEY=VALUE ...]

Each step is an ordinary command of this repository, printed before it runs (run them by hand to do the same):

  1. data        python tools/make_demo_data.py
  2. pretrain    python tools/train.py configs/demo/cls_xcit_s12_poly3_demo.py --work-dir W/pretrain
                 (mmpretrain: the XCiT-S12/16 poly3 backbone as a 10-way digit classifier, top-1 on held-out crops)
  3. detector    python tools/train.py configs/demo/maskrcnn_xcit_s12_poly3_demo.py --work-dir W/maskrcnn
                     --cfg-options model.backbone.init_cfg.checkpoint=<step 2's checkpoint>
                 (mmdet: Mask R-CNN whose backbone starts from the classifier through
                 init_cfg=dict(type='Pretrained', checkpoint=..., prefix='backbone.'))
  4. evaluation  python tools/test.py configs/demo/maskrcnn_xcit_s12_poly3_demo.py <step 3's checkpoint>
                     --work-dir W/maskrcnn
                 (COCO bbox and segm AP of the demo val set with pycocotools)
  5. pictures    mmdet's DetInferencer (its DetLocalVisualizer) draws the predictions on the first N val images:
                 boxes, masks, class and score, at the config's visualization score_thr (the one
                 `tools/test.py ... --show-dir DIR` draws with), into W/pictures/vis/

The last lines printed are a summary: pretraining top-1, bbox / segm mAP and AP50, the time of each step, the
picture folder. A step that fails stops the demo with its exit status.
"""
import argparse
import glob
import json
import os
import os.path as osp
import subprocess
import sys
import time

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
CLS_CFG = 'configs/demo/cls_xcit_s12_poly3_demo.py'
DET_CFG = 'configs/demo/maskrcnn_xcit_s12_poly3_demo.py'


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--work-dir', default='work_dirs/demo', help='where every step writes (default: work_dirs/demo)')
    p.add_argument('--cls-config', default=CLS_CFG, help=f'pretraining config (default: {CLS_CFG})')
    p.add_argument('--det-config', default=DET_CFG, help=f'detector config (default: {DET_CFG})')
    p.add_argument('--pictures', type=int, default=8, help='val images to draw predictions on (default: 8)')
    p.add_argument('--data-root', default='data/demo', help='where the demo data is written (default: data/demo)')
    for step in ('cls', 'det', 'test'):
        p.add_argument(f'--{step}-options', nargs='+', default=[], metavar='KEY=VALUE',
                       help=f'--cfg-options for the {dict(cls="pretraining", det="detector training", test="evaluation")[step]} command')
    args = p.parse_args(argv)
    if args.pictures < 0:
        p.error(f'--pictures must be >= 0, got {args.pictures}')
    return args


def _cmd(*parts):
    return [sys.executable, *parts]


def _last_scalars(work_dir):
    """The last logged record holding accuracy (mmpretrain validation) in the newest run under work_dir."""
    runs = sorted(glob.glob(osp.join(work_dir, '*', 'vis_data', 'scalars.json')))
    if not runs:
        return {}
    found = {}
    with open(runs[-1]) as f:
        for line in f:
            rec = json.loads(line)
            if any(k.startswith('accuracy/') for k in rec):
                found = rec
    return found


def _read(path):
    with open(path) as f:
        return f.read().strip()


def _fmt(seconds):
    return f'{int(seconds // 60)} min {seconds % 60:04.1f} s'


class Demo:
    def __init__(self, args):
        self.args = args
        self.times = {}

    def run(self, step, cmd):
        print(f'\n[demo] step {step}: {" ".join(osp.relpath(c, ROOT) if c == sys.executable else c for c in cmd[1:])}',
              flush=True)
        t = time.time()
        proc = subprocess.run(cmd, cwd=ROOT)
        self.times[step] = time.time() - t
        if proc.returncode:
            print(f'[demo] step {step} failed (exit status {proc.returncode})', file=sys.stderr, flush=True)
            raise SystemExit(proc.returncode)

    def pictures(self, cfg_path, ckpt, out_dir):
        """Draw the first N val images' predictions with mmdet's DetInferencer; returns (files, score_thr)."""
        t = time.time()
        sys.path.insert(0, ROOT)
        import softfree_mm  # noqa: F401  (registers the backbones; repairs checkpoint loading on torch 2.14)
        from mmengine.config import Config
        from mmdet.apis import DetInferencer
        cfg = Config.fromfile(cfg_path)
        thr = cfg.default_hooks.visualization.get('score_thr', 0.3)
        ds = cfg.test_dataloader.dataset
        with open(ds.ann_file if osp.isabs(ds.ann_file) else osp.join(ds.data_root, ds.ann_file)) as f:
            images = json.load(f)['images'][:self.args.pictures]
        paths = [osp.join(ds.data_root, ds.data_prefix['img'], im['file_name']) for im in images]
        print(f'\n[demo] step pictures: DetInferencer({cfg_path!r}, weights={osp.relpath(ckpt, ROOT)!r}, '
              f"device='cpu')(<{len(paths)} val images>, out_dir={out_dir!r}, pred_score_thr={thr})", flush=True)
        inferencer = DetInferencer(model=cfg, weights=ckpt, device='cpu', show_progress=False)
        inferencer(paths, out_dir=out_dir, pred_score_thr=thr, no_save_pred=True)
        self.times['pictures'] = time.time() - t
        return sorted(glob.glob(osp.join(out_dir, 'vis', '*'))), thr


def main(argv=None):
    args = parse_args(argv)
    os.chdir(ROOT)
    demo = Demo(args)
    work = args.work_dir
    cls_dir, det_dir, pic_dir = (osp.join(work, n) for n in ('pretrain', 'maskrcnn', 'pictures'))
    t0 = time.time()
    demo.run('data', _cmd('tools/make_demo_data.py', '--out', args.data_root))
    demo.run('pretrain', _cmd('tools/train.py', args.cls_config, '--work-dir', cls_dir,
                              *(['--cfg-options', *args.cls_options] if args.cls_options else [])))
    cls_ckpt = _read(osp.join(cls_dir, 'last_checkpoint'))
    demo.run('detector', _cmd('tools/train.py', args.det_config, '--work-dir', det_dir, '--cfg-options',
                              f'model.backbone.init_cfg.checkpoint={cls_ckpt}', *args.det_options))
    det_ckpt = _read(osp.join(det_dir, 'last_checkpoint'))
    demo.run('evaluation', _cmd('tools/test.py', args.det_config, det_ckpt, '--work-dir', det_dir,
                                *(['--cfg-options', *args.test_options] if args.test_options else [])))
    with open(osp.join(det_dir, 'test_metrics.json')) as f:
        metrics = json.load(f)
    files, thr = demo.pictures(args.det_config, det_ckpt, pic_dir) if args.pictures else ([], None)
    total = time.time() - t0
    top1 = _last_scalars(cls_dir).get('accuracy/top1')
    import torch
    summary = dict(pretrain_top1=top1, metrics={k: metrics.get(f'coco/{k}') for k in
                                                ('bbox_mAP', 'bbox_mAP_50', 'segm_mAP', 'segm_mAP_50')},
                   times={k: round(v, 1) for k, v in demo.times.items()}, total=round(total, 1),
                   pictures=files, threads=torch.get_num_threads())
    with open(osp.join(work, 'summary.json'), 'w') as f:
        json.dump(summary, f, indent=1)
    m = summary['metrics']
    t = demo.times
    lines = [
        '',
        '=' * 100,
        'make demo: XCiT-S12/16 poly3 (x^3/sqrt(N) attention in every layer), digits pretraining -> Mask R-CNN',
        f'  pretraining (classifier, 10 digits)  top-1 {top1:.1f}% (chance 10%)'.ljust(72) + _fmt(t['pretrain']),
        f'  detector fine-tuned from it           trained'.ljust(72) + _fmt(t['detector']),
        f'  COCO evaluation, demo val set         bbox mAP {m["bbox_mAP"]:.3f}  AP50 {m["bbox_mAP_50"]:.3f}  '
        f'segm mAP {m["segm_mAP"]:.3f}  AP50 {m["segm_mAP_50"]:.3f}'.ljust(72) + _fmt(t['evaluation']),
        f'  data                                  {args.data_root}'.ljust(72) + _fmt(t['data']),
    ]
    if files:
        lines.append(f'  pictures ({len(files)} val images, score >= {thr})  {osp.dirname(files[0])}'.ljust(72)
                     + _fmt(t['pictures']))
    lines.append(f'  total'.ljust(72) + _fmt(total) + f'  ({summary["threads"]} torch threads)')
    print('\n'.join(lines), flush=True)
    return 0


if __name__ == '__main__':
    sys.exit(main())
