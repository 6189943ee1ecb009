"""The main job on the embedded demo data, as `make demo` runs it: pretrain, then a detector and a semantic
segmentor from the same pretrained backbone, evaluate both, draw both, summarise.

    python tools/run_demo.py [--work-dir work_dirs/demo] [--task all|det|seg] [--cls-config CFG] [--det-config CFG]
        [--seg-config CFG] [--pictures N] [--cls-options KEY=VALUE ...] [--det-options KEY=VALUE ...]
        [--test-options KEY=VALUE ...] [--seg-options KEY=VALUE ...] [--seg-test-options KEY=VALUE ...]
        [--csv PATH] [--verbose]

Each step is an ordinary command of this repository (W/commands.sh lists them: run them by hand to do the same):

  1. data        python tools/make_demo_data.py
  2. pretrain    python tools/train.py configs/demo/cls_xcit_t12_poly3_demo.py --work-dir W/pretrain
                 (mmpretrain: the XCiT-T12/16 poly3 backbone as a 10-way digit classifier, top-1 on held-out crops)
  3. detector    python tools/train.py configs/demo/maskrcnn_xcit_t12_poly3_demo.py --work-dir W/maskrcnn
                     --cfg-options model.backbone.init_cfg.checkpoint=<step 2's checkpoint>
                 (mmdet: Mask R-CNN whose backbone starts from the classifier through
                 init_cfg=dict(type='Pretrained', checkpoint=..., prefix='backbone.'))
  4. det-eval    python tools/test.py configs/demo/maskrcnn_xcit_t12_poly3_demo.py <step 3's checkpoint>
                     --work-dir W/maskrcnn
                 (COCO bbox and segm AP of the demo val set with pycocotools)
  5. segmentor   python tools/train.py configs/demo/semfpn_xcit_t12_poly3_demo.py --work-dir W/semfpn
                     --cfg-options model.backbone.init_cfg.checkpoint=<step 2's checkpoint>
                 (mmseg: Semantic FPN whose backbone starts from the same classifier, the same way)
  6. seg-eval    python tools/test.py configs/demo/semfpn_xcit_t12_poly3_demo.py <step 5's checkpoint>
                     --work-dir W/semfpn
                 (mmseg's IoUMetric on the demo val scenes: mIoU over background and the ten digits, aAcc)
  7. pictures    the detector's predictions on the first N val images, drawn by mmdet's DetInferencer (its
                 DetLocalVisualizer): boxes, masks, class and score, at the config's visualization score_thr (the one
                 `tools/test.py ... --show-dir DIR` draws with) and, in a picture where that hides every prediction,
                 its best one (the summary counts them), into W/pictures/det/vis/; the segmentor's on the first N val
                 scenes, drawn by mmseg's SegLocalVisualizer: ground truth left, prediction right, into
                 W/pictures/seg/
--task det (the default, `make demo`) runs steps 1-4 and the detector's pictures, --task seg (`make demo TASK=seg`)
steps 1, 2, 5, 6 and the segmentor's pictures, --task all (`make demo TASK=all`) all seven: on 2 CPU cores the
segmentor's 1500 iterations take about 5 minutes, so both halves take about 9 and the default is the detector.

The configs are the main job's (configs/maskrcnn_xcit_s12_poly3.py: Mask R-CNN, XCiT/16 with poly3 in every layer,
its adapter, FPN and heads; configs/semfpn_xcit_s12_poly3.py: Semantic FPN on the same backbone) at XCiT-T12 width
with 64-channel necks and heads, what two CPU cores can train in the demo's minutes; `--cls-config
configs/demo/cls_xcit_s12_poly3_demo.py --det-config configs/demo/maskrcnn_xcit_s12_poly3_demo.py` runs S12 with the
real detector's 256-channel neck and heads instead.

What it prints: one progress line per step (a bar with the ETA the step's own log gives, or its share of
iterations done, updated in place on a terminal; at each quarter elsewhere), then a summary: pretraining top-1,
bbox / segm mAP and AP50, mIoU and aAcc, the time of each step, the picture folders (W/summary.json holds the same;
--csv PATH writes them as one row of CSV_COLUMNS). Each step's full output (mmengine's logs) goes to
W/logs/<step>.log; --verbose prints it as it comes instead. A step that fails prints the end of its log and stops
the demo with its exit status.
"""
import argparse
import glob
import json
import os
import os.path as osp
import sys
import time

import numpy as np

import tool_warnings  # noqa: F401  (tools/tool_warnings.py: before the OpenMMLab stack; every step inherits it)
from demo_steps import ROOT, Demo, fmt_duration  # tools/demo_steps.py: each step's command, progress line and log

CLS_CFG = 'configs/demo/cls_xcit_t12_poly3_demo.py'
DET_CFG = 'configs/demo/maskrcnn_xcit_t12_poly3_demo.py'
SEG_CFG = 'configs/demo/semfpn_xcit_t12_poly3_demo.py'
CSV_COLUMNS = ('task', 'cls_config', 'det_config', 'seg_config', 'pretrain_top1', 'bbox_mAP', 'bbox_mAP_50',
               'segm_mAP', 'segm_mAP_50', 'mIoU', 'aAcc', 'data_s', 'pretrain_s', 'detector_s', 'det-eval_s',
               'segmentor_s', 'seg-eval_s', 'pictures_s', 'total_s', 'pictures_drawn', 'torch_threads')
TASKS = ('all', 'det', 'seg')


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--work-dir', default='work_dirs/demo', help='where every step writes (default: work_dirs/demo)')
    p.add_argument('--task', default='det', choices=TASKS,
                   help='the detector (det, the default: about 4 minutes on 2 cores), both halves of the main job '
                        '(all: about 9) or the segmentor only (seg: about 6)')
    p.add_argument('--cls-config', default=CLS_CFG, help=f'pretraining config (default: {CLS_CFG})')
    p.add_argument('--det-config', default=DET_CFG, help=f'detector config (default: {DET_CFG})')
    p.add_argument('--seg-config', default=SEG_CFG, help=f'segmentor config (default: {SEG_CFG})')
    p.add_argument('--pictures', type=int, default=8, help='val images to draw predictions on (default: 8)')
    p.add_argument('--csv', default=None, metavar='PATH', help='also write the summary as one CSV row here')
    p.add_argument('--verbose', action='store_true', help="print every step's full output (else: W/logs/<step>.log)")
    for step, what in (('cls', 'pretraining'), ('det', 'detector training'),
                       ('test', "the detector's evaluation and pictures"), ('seg', 'segmentor training'),
                       ('seg-test', "the segmentor's evaluation and pictures")):
        p.add_argument(f'--{step}-options', nargs='+', default=[], metavar='KEY=VALUE',
                       help=f'--cfg-options for the {what} command')
    args = p.parse_args(argv)
    if args.pictures < 0:
        p.error(f'--pictures must be >= 0, got {args.pictures}')
    for opt in args.cls_options + args.det_options + args.test_options + args.seg_options + args.seg_test_options:
        if '=' not in opt:
            p.error(f'options are KEY=VALUE, got {opt!r}')
    return args


def _options(opts):
    return ['--cfg-options', *opts] if opts else []


def _last_accuracy(work_dir):
    """The last logged validation record (mmpretrain: accuracy/top1) of the newest run under work_dir."""
    found = {}
    for path in sorted(glob.glob(osp.join(work_dir, '*', 'vis_data', 'scalars.json')))[-1:]:
        with open(path) as f:
            for line in f:
                rec = json.loads(line)
                if 'accuracy/top1' in rec:
                    found = rec
    return found.get('accuracy/top1')


def _read(path):
    with open(path) as f:
        return f.read().strip()


def draw_pictures(demo, det=None, seg=None, count=8):
    """The pictures step of ``demo`` (tools/demo_steps.py's runner), in this process: ``det`` / ``seg`` = (config,
    options, checkpoint, folder) of the half to draw, or None. Returns (detector pictures, segmentor pictures): the
    dicts of :func:`det_pictures` and :func:`seg_pictures`."""
    t = time.time()
    sys.path.insert(0, ROOT)
    import softfree_mm  # noqa: F401  (registers the backbones, repairs checkpoint loading)
    what = []
    if det:
        what.append(f'DetInferencer(model={det[0]!r}, weights={det[2]!r}, device=\'cpu\')({count} val images, '
                    f'out_dir={det[3]!r}, the config\'s pred_score_thr, at least each image\'s best)')
    if seg:
        what.append(f'mmseg.apis.inference_model(init_model({seg[0]!r}, {seg[2]!r}), ...) and SegLocalVisualizer '
                    f'on {count} val scenes (ground truth | prediction) into {seg[3]!r}')
    out = {}
    with demo.in_process('pictures', '; '.join(what)):
        if det:
            out['det'] = det_pictures(*det, count)
        if seg:
            out['seg'] = seg_pictures(*seg, count)
    demo.times['pictures'] = time.time() - t
    return out.get('det'), out.get('seg')


def _base_dataset(cfg):
    ds = cfg.test_dataloader.dataset
    while 'dataset' in ds:  # wrappers
        ds = ds.dataset
    return ds


def det_pictures(cfg_path, options, ckpt, out_dir, count):
    """Draw the first ``count`` val images' predictions with mmdet's DetInferencer (its DetLocalVisualizer): those
    scoring at least the config's visualization score_thr and, where that hides all of an image's predictions, its
    best-scoring one(s) (the picture then says the threshold it used). Returns dict(files, score_thr, drawn (per
    picture), used (the threshold per picture))."""
    from mmdet.apis import DetInferencer
    cfg = _config(cfg_path, options)
    thr = cfg.default_hooks.visualization.get('score_thr', 0.3)
    # pictures go to out_dir; the config's visualiser backends would need a save_dir (mmengine warns, drops them)
    cfg.visualizer.vis_backends = []
    ds = _base_dataset(cfg)
    ann = ds.ann_file if osp.isabs(ds.ann_file) else osp.join(ds.data_root, ds.ann_file)
    with open(ann) as f:
        names = [im['file_name'] for im in json.load(f)['images'][:count]]
    images = [osp.join(ds.data_root, ds.data_prefix['img'], n) for n in names]
    drawn, used = [], []
    inferencer = DetInferencer(model=cfg, weights=ckpt, device='cpu', show_progress=False)
    preds = inferencer(images, return_datasamples=True, no_save_vis=True, no_save_pred=True)['predictions']
    for image, pred in zip(images, preds):
        scores = pred.pred_instances.scores
        # mmdet's visualiser draws scores strictly above pred_score_thr: just below the best one keeps it
        best = float(scores.max()) if len(scores) else thr
        t_img = thr if best > thr else float(np.nextafter(np.float32(best), np.float32(-1)))
        inferencer.visualize([image], [pred], pred_score_thr=t_img, img_out_dir=out_dir)
        drawn.append(int((scores > t_img).sum()))
        used.append(t_img)
    return dict(files=[osp.join(out_dir, 'vis', n) for n in names], score_thr=thr, drawn=drawn, used=used)


def seg_pictures(cfg_path, options, ckpt, out_dir, count):
    """The first ``count`` val scenes (file-name order, as the val set reads them) with mmseg's SegLocalVisualizer:
    the ground truth (left) and the segmentor's prediction (right), each class in the config's palette over the
    image. Returns dict(files, pixel_accuracy (per picture, against the ground truth's labelled pixels))."""
    import cv2
    import torch
    from mmengine.structures import PixelData
    from mmseg.apis import inference_model, init_model
    from mmseg.visualization import SegLocalVisualizer
    cfg = _config(cfg_path, options)
    cfg.model.backbone.init_cfg = None  # the checkpoint holds the whole segmentor
    ds = _base_dataset(cfg)
    prefix = ds.get('data_prefix', {})
    img_dir = osp.join(ds.data_root, prefix.get('img_path', ''))
    seg_dir = osp.join(ds.data_root, prefix.get('seg_map_path', ''))
    img_suffix, seg_suffix = ds.get('img_suffix', '.jpg'), ds.get('seg_map_suffix', '.png')
    names = sorted(n[:-len(img_suffix)] for n in os.listdir(img_dir) if n.endswith(img_suffix))[:count]
    model = init_model(cfg, ckpt, device='cpu')
    vis = SegLocalVisualizer.get_instance(f'demo_seg_pictures_{os.getpid()}_{time.time()}', vis_backends=[],
                                          alpha=0.6)
    vis.dataset_meta = model.dataset_meta
    os.makedirs(out_dir, exist_ok=True)
    files, accuracy = [], []
    for name in names:
        image = cv2.imread(osp.join(img_dir, name + img_suffix))[..., ::-1]  # RGB, as the visualiser draws
        result = inference_model(model, osp.join(img_dir, name + img_suffix))
        gt = cv2.imread(osp.join(seg_dir, name + seg_suffix), cv2.IMREAD_UNCHANGED).astype(np.int64)
        if ds.get('reduce_zero_label', False):  # as LoadAnnotations(reduce_zero_label=True) reads it
            gt = np.where(gt == 0, 255, gt - 1)
        result.gt_sem_seg = PixelData(data=torch.from_numpy(gt)[None])
        pred = result.pred_sem_seg.data[0].numpy()
        labelled = gt != 255
        accuracy.append(float((pred[labelled] == gt[labelled]).mean()) if labelled.any() else float('nan'))
        path = osp.join(out_dir, name + '.png')
        vis.add_datasample(name, image, result, draw_gt=True, draw_pred=True, show=False, out_file=path)
        files.append(path)
    return dict(files=files, pixel_accuracy=accuracy)


def main(argv=None):
    args = parse_args(argv)
    os.chdir(ROOT)
    work = args.work_dir
    demo = Demo(work, args.verbose, args.task)
    det, seg = args.task in ('all', 'det'), args.task in ('all', 'seg')
    cls_dir, det_dir, seg_dir, pic_dir = (osp.join(work, n) for n in ('pretrain', 'maskrcnn', 'semfpn', 'pictures'))
    t0 = time.time()
    demo.run('data', ['tools/make_demo_data.py'])
    demo.run('pretrain', ['tools/train.py', args.cls_config, '--work-dir', cls_dir, *_options(args.cls_options)],
             epochs=_max_epochs(args.cls_config, args.cls_options))
    cls_ckpt = _read(osp.join(cls_dir, 'last_checkpoint'))
    start = f'model.backbone.init_cfg.checkpoint={cls_ckpt}'
    det_ckpt = seg_ckpt = None
    det_metrics, seg_metrics = {}, {}
    if det:
        demo.run('detector', ['tools/train.py', args.det_config, '--work-dir', det_dir,
                              *_options([start, *args.det_options])])
        det_ckpt = _read(osp.join(det_dir, 'last_checkpoint'))
        demo.run('det-eval', ['tools/test.py', args.det_config, det_ckpt, '--work-dir', det_dir,
                              *_options(args.test_options)])
        with open(osp.join(det_dir, 'test_metrics.json')) as f:
            det_metrics = json.load(f)
    if seg:
        demo.run('segmentor', ['tools/train.py', args.seg_config, '--work-dir', seg_dir,
                               *_options([start, *args.seg_options])])
        seg_ckpt = _read(osp.join(seg_dir, 'last_checkpoint'))
        demo.run('seg-eval', ['tools/test.py', args.seg_config, seg_ckpt, '--work-dir', seg_dir,
                              *_options(args.seg_test_options)])
        with open(osp.join(seg_dir, 'test_metrics.json')) as f:
            seg_metrics = json.load(f)
    det_pics = seg_pics = None
    if args.pictures:
        det_pics, seg_pics = draw_pictures(
            demo,
            det=(args.det_config, args.test_options, det_ckpt, osp.join(pic_dir, 'det')) if det else None,
            seg=(args.seg_config, args.seg_test_options, seg_ckpt, osp.join(pic_dir, 'seg')) if seg else None,
            count=args.pictures)
    total = time.time() - t0

    import torch
    m = {k: det_metrics.get(f'coco/{k}') for k in ('bbox_mAP', 'bbox_mAP_50', 'segm_mAP', 'segm_mAP_50')} if det \
        else {}
    if seg:
        m.update({k: seg_metrics.get(k) for k in ('mIoU', 'aAcc', 'mAcc')})
    summary = dict(task=args.task, pretrain_top1=_last_accuracy(cls_dir), pretrain_checkpoint=cls_ckpt,
                   detector_checkpoint=det_ckpt, segmentor_checkpoint=seg_ckpt, metrics=m,
                   times={k: round(v, 1) for k, v in demo.times.items()}, total=round(total, 1),
                   pictures=det_pics['files'] if det_pics else [], score_thr=det_pics['score_thr'] if det_pics else None,
                   pictures_drawn=det_pics['drawn'] if det_pics else [],
                   pictures_score_thr=det_pics['used'] if det_pics else [],
                   seg_pictures=seg_pics['files'] if seg_pics else [],
                   seg_pictures_pixel_accuracy=seg_pics['pixel_accuracy'] if seg_pics else [],
                   torch_threads=torch.get_num_threads())
    summary['commands'] = demo.write_commands()
    summary['logs'] = demo.logs
    with open(osp.join(work, 'summary.json'), 'w') as f:
        json.dump(summary, f, indent=1)
    if args.csv:
        write_csv(args.csv, summary, args.cls_config, args.det_config if det else '', args.seg_config if seg else '')
    t = demo.times
    top1 = summary['pretrain_top1']
    rows = [('pretraining: classifier, 10 digits',
             f'top-1 {top1:.1f}% (chance 10%)' if top1 is not None else 'top-1 ?', t['pretrain'])]
    if det:
        rows += [('detector: Mask R-CNN from the classifier', f'trained, {det_ckpt}', t['detector']),
                 ('COCO evaluation, demo val set', f'bbox mAP {m["bbox_mAP"]:.3f} AP50 {m["bbox_mAP_50"]:.3f} | '
                  f'segm mAP {m["segm_mAP"]:.3f} AP50 {m["segm_mAP_50"]:.3f}', t['det-eval'])]
    if seg:
        rows += [('segmentor: Semantic FPN from the classifier', f'trained, {seg_ckpt}', t['segmentor']),
                 ('mIoU evaluation, demo val scenes', f'mIoU {m["mIoU"]:.1f} (background + 10 digits) | '
                  f'aAcc {m["aAcc"]:.1f}', t['seg-eval'])]
    rows.append(('data', 'data/demo', t['data']))
    pictures = []
    if det_pics:
        thr, used, drawn = det_pics['score_thr'], det_pics['used'], det_pics['drawn']
        below = sum(u < thr for u in used)
        what = f'{sum(drawn)} predictions drawn' + (f' ({below} pictures: their best only, below {thr})' if below else '')
        pictures.append((f'  detector: {len(used)} val images, score >= {thr}',
                         f'{what}, {osp.dirname(det_pics["files"][0])}'))
    if seg_pics:
        pictures.append((f'  segmentor: {len(seg_pics["files"])} val scenes',
                         f'ground truth | prediction, {osp.dirname(seg_pics["files"][0])}'))
    if pictures:
        rows.append(('pictures', '', t['pictures']))
    lines = ['', '=' * 110, f'make demo: {_model_name(args.cls_config, det, seg)}']
    for a, b, c in rows:
        lines.append(f'  {a:<42} {b:<52} {fmt_duration(c):>12}')
        if a == 'pictures':
            lines += [f'  {x:<42} {y}' for x, y in pictures]
    threads = f'{summary["torch_threads"]} torch threads'
    lines.append(f'  {"total":<42} {threads:<52} {fmt_duration(total):>12}')
    lines.append(f'  each step\'s command: {summary["commands"]}; its whole output: {demo.logs}/<step>.log')
    print('\n'.join(lines), flush=True)
    return 0


def write_csv(path, summary, cls_config, det_config, seg_config):
    """The summary as one row of CSV_COLUMNS (times in seconds; blank: a half not run), the format of
    docs/results/demo.csv."""
    import csv
    row = dict(task=summary['task'], cls_config=cls_config, det_config=det_config, seg_config=seg_config,
               pretrain_top1=summary['pretrain_top1'],
               **{k: v for k, v in summary['metrics'].items() if k in CSV_COLUMNS},
               **{f'{k}_s': v for k, v in summary['times'].items()}, total_s=summary['total'],
               pictures_drawn=sum(summary['pictures_drawn']) if summary['pictures_drawn'] else '',
               torch_threads=summary['torch_threads'])
    # the metrics come as float32 read back as float (73.4000015258789): 4 decimals hold all they say
    row = {k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}
    with open(path, 'w', newline='') as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        w.writeheader()
        w.writerow(row)


def _config(path, options):
    """The config with the step's --cfg-options applied, as the step's tool reads it."""
    from mmengine.config import Config, DictAction
    cfg = Config.fromfile(path)
    if options:
        p = argparse.ArgumentParser()
        p.add_argument('--o', nargs='+', action=DictAction)
        cfg.merge_from_dict(p.parse_args(['--o', *options]).o)
    return cfg


def _max_epochs(config, options):
    """The epoch count of an epoch-based training loop (None for an iteration-based one, or a config the step
    itself will refuse with its own error line)."""
    sys.path.insert(0, ROOT)
    try:
        return _config(config, options).train_cfg.get('max_epochs')
    except Exception:  # noqa: BLE001  (tools/train.py names what is wrong with it)
        return None


def _model_name(cls_config, det, seg):
    sys.path.insert(0, ROOT)
    from mmengine.config import Config
    bb = Config.fromfile(cls_config).model.backbone
    attn = bb.get('attn_cfg', {})
    kind = attn.get('type', attn) if isinstance(attn, dict) else attn
    degree = f'{attn.get("degree")}' if isinstance(attn, dict) and 'degree' in attn else ''
    heads = ' and '.join(n for n, on in (('Mask R-CNN', det), ('Semantic FPN', seg)) if on)
    return (f'{bb.type} arch {bb.get("arch")}/{bb.get("patch_size")}, attention {kind}{degree} in every layer: '
            f'digit classifier pretraining -> {heads}')


if __name__ == '__main__':
    sys.exit(main())
