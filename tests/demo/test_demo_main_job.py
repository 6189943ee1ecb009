"""The README's main job, shortened: `make demo`'s driver (tools/run_demo.py) runs every step with its own default
configs (XCiT-T12/16 width, poly3 in every layer; the S12 demo configs they derive from are trained by
test_demo_train.py, test_demo_determinism.py and test_tools_dist.py): demo data -> mmpretrain classifier pretraining ->
Mask R-CNN and Semantic FPN whose backbones start from that checkpoint (init_cfg Pretrained, prefix 'backbone.') ->
COCO evaluation with pycocotools and mmseg's mIoU -> predictions drawn by mmdet's DetInferencer and mmseg's
SegLocalVisualizer -> the summary. Only the amounts differ from `make demo` (a few dozen images, one epoch / two
iterations, a few val images, two pictures of each).

Guards: every step's ordinary command runs and is listed in W/commands.sh; the output is one progress line per
step and the summary, each step's whole output in W/logs/<step>.log (a failing step, the segmentor's too, prints the
end of its log and stops the demo with its exit status); the detector's and the segmentor's logs show the classifier
checkpoint loaded into their backbones; the summary names the pretraining top-1, bbox / segm mAP and AP50, mIoU and
aAcc, the time of each step and the picture folders, and summary.json holds the same numbers; the detector's
pictures are the val images with predictions drawn on them at the config's own score threshold: where it hides all
of a picture's predictions (two iterations give low scores) the picture still shows the best one, so a threshold that
hides everything cannot pass; the segmentor's are the val scenes with the ground truth and the prediction drawn side
by side. --task seg runs the segmentation half alone. No warning line anywhere in the output (the stack's
pkg_resources deprecation notes are filtered in every step's process, tools/tool_warnings.py).
"""
import csv
import glob
import json
import os
import os.path as osp
import re
import subprocess
import sys

import cv2
import numpy as np

from tests.helpers import ROOT
# what Python's warnings module prints: 'path:line: SomeWarning: message', then the source line
WARNING_LINE = re.compile(r'Warning\b|WARNING|warnings\.warn\(|pkg_resources is deprecated')


def test_shortened_main_job_pretrains_fine_tunes_evaluates_draws_and_summarises(tmp_path):
    work = str(tmp_path / 'demo')
    env = {k: v for k, v in os.environ.items() if k != 'PYTHONWARNINGS'}  # what a user's shell has
    csv_path = str(tmp_path / 'demo.csv')
    cmd = [sys.executable, 'tools/run_demo.py', '--work-dir', work, '--task', 'all', '--pictures', '2',
           '--csv', csv_path,
           '--cls-options', 'train_dataloader.dataset.indices=32', 'val_dataloader.dataset.indices=20',
           'train_cfg.max_epochs=1',
           '--det-options', 'train_cfg.max_iters=2', 'default_hooks.logger.interval=1',
           '--test-options', 'test_dataloader.dataset.indices=8',
           '--seg-options', 'train_cfg.max_iters=2', 'default_hooks.logger.interval=1',
           '--seg-test-options', 'test_dataloader.dataset.indices=4']
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    # no warning between the steps or before a tool's own output (the steps' processes included)
    noise = [line for line in (out + proc.stderr).splitlines() if WARNING_LINE.search(line)]
    assert not noise, '\n'.join(noise[:6])
    commands = open(osp.join(work, 'commands.sh')).read()
    for step in ('python tools/make_demo_data.py', 'python tools/train.py configs/demo/cls_xcit_t12_poly3_demo.py',
                 'python tools/train.py configs/demo/maskrcnn_xcit_t12_poly3_demo.py',
                 'python tools/test.py configs/demo/maskrcnn_xcit_t12_poly3_demo.py',
                 'python tools/train.py configs/demo/semfpn_xcit_t12_poly3_demo.py',
                 'python tools/test.py configs/demo/semfpn_xcit_t12_poly3_demo.py', 'DetInferencer(',
                 'SegLocalVisualizer'):
        assert step in commands, step
    # what it prints: one line per step (not a terminal: no in-place bar; quarter lines only for long steps), the
    # summary; the steps' logs went to their files
    progress = [line for line in out.splitlines() if line.startswith('[demo] ')]
    done = [line for line in progress if ' done in ' in line]
    steps = ['data', 'pretrain', 'detector', 'det-eval', 'segmentor', 'seg-eval', 'pictures']
    assert [line.split()[2] for line in done] == steps
    assert all(re.match(r'\[demo\] \d/7 [\w-]+ +\|[#.]{24}\| +\d+%', line) for line in progress), progress
    assert len(out.strip().splitlines()) <= len(progress) + 16, out
    for step in steps:
        assert osp.getsize(osp.join(work, 'logs', f'{step}.log')) > 0, step
    assert 'Epoch(train)' in open(osp.join(work, 'logs', 'pretrain.log')).read()
    assert 'Epoch(train)' not in out and 'mmengine - INFO' not in out

    with open(osp.join(work, 'summary.json')) as f:
        summary = json.load(f)
    with open(osp.join(work, 'pretrain', 'last_checkpoint')) as f:
        cls_ckpt = f.read().strip()
    assert cls_ckpt.endswith('epoch_1.pth') and summary['pretrain_checkpoint'] == cls_ckpt
    # the detector's backbone was loaded from the classifier's checkpoint: every block placed, the classifier's own
    # parts and the new adapter named in one note, nothing else missing or unplaced
    for folder in ('maskrcnn', 'semfpn'):
        first_log = sorted(glob.glob(osp.join(work, folder, '*', '*.log')))[0]  # training's; evaluation's follows
        log = open(first_log).read()
        assert f'loading {cls_ckpt}: as intended, ' in log, folder
        assert 'key(s) classification-only' in log, folder
        assert 'key(s) of the stride-fixing adapter, new to the feature maps' in log, folder
        assert 'missing in the checkpoint' not in log and 'unexpected (not placed)' not in log, folder

    assert 0 <= summary['pretrain_top1'] <= 100
    for key in ('bbox_mAP', 'bbox_mAP_50', 'segm_mAP', 'segm_mAP_50'):
        assert 0.0 <= summary['metrics'][key] <= 1.0, key
    for key in ('mIoU', 'aAcc'):
        assert 0.0 <= summary['metrics'][key] <= 100.0, key
    seg_metrics = json.load(open(osp.join(work, 'semfpn', 'test_metrics.json')))
    assert summary['metrics']['mIoU'] == seg_metrics['mIoU'] and summary['metrics']['aAcc'] == seg_metrics['aAcc']
    assert set(summary['times']) == set(steps)
    assert all(t > 0 for t in summary['times'].values())
    # --csv: the summary's numbers as one row (the format of docs/results/demo.csv)
    (row,) = list(csv.DictReader(open(csv_path)))
    assert float(row['pretrain_top1']) == round(summary['pretrain_top1'], 4)  # 4 decimals: float32 noise left out
    assert {k: float(row[k]) for k in summary['metrics'] if k in row} == \
        {k: round(v, 4) for k, v in summary['metrics'].items() if k in row}
    assert row['task'] == 'all' and row['seg_config'] == 'configs/demo/semfpn_xcit_t12_poly3_demo.py'
    assert float(row['mIoU']) == round(summary['metrics']['mIoU'], 4)
    assert {k: float(row[f'{k}_s']) for k in summary['times']} == summary['times']
    assert float(row['total_s']) == summary['total'] and int(row['pictures_drawn']) == sum(summary['pictures_drawn'])
    tail = out[out.rindex('make demo:'):]
    for word in ('top-1', 'bbox mAP', 'segm mAP', 'AP50', 'mIoU', 'aAcc', 'pictures', 'total',
                 osp.join(work, 'pictures', 'det'), osp.join(work, 'pictures', 'seg'),
                 osp.join(work, 'commands.sh'), osp.join(work, 'logs')):
        assert word in tail, word

    # the pictures: the first val images, with predictions drawn over them
    with open(osp.join(ROOT, 'data', 'demo', 'coco', 'annotations', 'instances_val2017.json')) as f:
        first = [im['file_name'] for im in json.load(f)['images'][:2]]
    assert [osp.basename(p) for p in summary['pictures']] == first
    from mmengine.config import Config
    det_cfg = Config.fromfile(osp.join(ROOT, 'configs/demo/maskrcnn_xcit_t12_poly3_demo.py'))
    thr = det_cfg.default_hooks.visualization.score_thr
    assert summary['score_thr'] == thr
    assert all(n >= 1 for n in summary['pictures_drawn']), summary['pictures_drawn']
    assert all(u <= thr for u in summary['pictures_score_thr'])
    for pic, name in zip(summary['pictures'], first):
        drawn = cv2.imread(pic)
        source = cv2.imread(osp.join(ROOT, 'data', 'demo', 'coco', 'val2017', name))
        assert drawn.shape == source.shape
        # a drawn box, mask or label changes pixels far beyond the JPEG re-encoding's few levels
        changed = (np.abs(drawn.astype(int) - source.astype(int)).max(axis=2) > 40).sum()
        assert changed >= 50, (pic, changed)

    # the segmentor's pictures: the first val scenes, ground truth (left) and prediction (right) over the image
    scenes = sorted(os.listdir(osp.join(ROOT, 'data', 'demo', 'ade', 'images', 'validation')))[:2]
    assert [osp.splitext(osp.basename(p))[0] for p in summary['seg_pictures']] == [osp.splitext(n)[0] for n in scenes]
    assert len(summary['seg_pictures_pixel_accuracy']) == 2
    for pic, name in zip(summary['seg_pictures'], scenes):
        drawn = cv2.imread(pic)
        source = cv2.imread(osp.join(ROOT, 'data', 'demo', 'ade', 'images', 'validation', name))
        h, w = source.shape[:2]
        assert drawn.shape == (h, 2 * w, 3), (drawn.shape, source.shape)
        gt_half = drawn[:, :w].astype(int)
        # the ground truth's colours cover every labelled pixel: far beyond the JPEG re-encoding's few levels
        assert (np.abs(gt_half - source.astype(int)).max(axis=2) > 40).mean() > 0.5, pic


def test_a_failing_step_prints_the_end_of_its_log_and_stops_with_its_status(tmp_path):
    work = str(tmp_path / 'demo')
    proc = subprocess.run([sys.executable, 'tools/run_demo.py', '--work-dir', work, '--task', 'all', '--cls-config',
                           'configs/demo/no_such_config.py'], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    log = osp.join(work, 'logs', 'pretrain.log')
    error = [line for line in open(log).read().splitlines() if line.startswith('error:')]
    assert error and 'no_such_config.py' in error[0]
    assert error[0] in proc.stderr  # the end of the log is shown
    assert proc.stderr.strip().splitlines()[-1] == f'[demo] pretrain failed (exit status 2); its whole output: {log}'
    assert re.search(r'\[demo\] 2/7 pretrain +\|[#.]{24}\| +\d+%  FAILED in ', proc.stdout), proc.stdout
    assert not osp.exists(osp.join(work, 'maskrcnn'))  # nothing ran after it


def test_the_segmentation_half_alone_and_its_failing_step_print_the_end_of_its_log(tmp_path):
    """--task seg: data, pretraining, segmentor, its evaluation, pictures (5 steps); a segmentor config that does
    not exist stops the demo at the segmentor with its log's end and status."""
    work = str(tmp_path / 'demo')
    proc = subprocess.run([sys.executable, 'tools/run_demo.py', '--work-dir', work, '--task', 'seg',
                           '--cls-options', 'train_dataloader.dataset.indices=16', 'val_dataloader.dataset.indices=8',
                           'train_cfg.max_epochs=1', '--seg-config', 'configs/demo/no_such_segmentor.py'],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    log = osp.join(work, 'logs', 'segmentor.log')
    error = [line for line in open(log).read().splitlines() if line.startswith('error:')]
    assert error and 'no_such_segmentor.py' in error[0] and error[0] in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == f'[demo] segmentor failed (exit status 2); its whole output: {log}'
    assert re.search(r'\[demo\] 2/5 pretrain +\|#{24}\| 100%  done in ', proc.stdout), proc.stdout
    assert re.search(r'\[demo\] 3/5 segmentor +\|[#.]{24}\| +\d+%  FAILED in ', proc.stdout), proc.stdout
    assert not osp.exists(osp.join(work, 'maskrcnn')) and not osp.exists(osp.join(work, 'pictures'))
