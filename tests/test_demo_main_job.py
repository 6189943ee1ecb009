"""The README's main job, shortened: the real demo config (full XCiT-S12 widths, poly3) trains a few iterations on
CPU through tools/train.py, then tools/test.py evaluates the checkpoint with pycocotools and prints COCO bbox and
segm AP. Only the iteration count differs from `make demo` (which trains 220 and is run by hand: README)."""
import json
import os
import os.path as osp
import subprocess
import sys

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
CFG = 'configs/demo/maskrcnn_xcit_s12_poly3_demo.py'


def test_shortened_demo_trains_and_reports_coco_bbox_and_segm_ap(tmp_path):
    env = dict(os.environ, PYTHONWARNINGS='ignore')
    work = str(tmp_path / 'demo')
    train = subprocess.run([sys.executable, 'tools/train.py', CFG, '--work-dir', work, '--cfg-options',
                            'train_cfg.max_iters=2', 'default_hooks.logger.interval=1'],
                           cwd=ROOT, capture_output=True, text=True, env=env, timeout=900)
    assert train.returncode == 0, train.stderr[-3000:]
    with open(osp.join(work, 'last_checkpoint')) as f:
        ckpt = f.read().strip()
    assert ckpt.endswith('iter_2.pth') and osp.exists(ckpt)
    test = subprocess.run([sys.executable, 'tools/test.py', CFG, ckpt, '--work-dir', work,
                           '--cfg-options', 'test_dataloader.dataset.indices=16'],
                          cwd=ROOT, capture_output=True, text=True, env=env, timeout=900)
    assert test.returncode == 0, test.stderr[-3000:]
    last = [line for line in test.stdout.splitlines() if line.startswith('metrics: ')][-1]
    metrics = json.loads(last[len('metrics: '):])
    for key in ('coco/bbox_mAP', 'coco/segm_mAP', 'coco/bbox_mAP_50', 'coco/segm_mAP_50'):
        assert key in metrics and 0.0 <= metrics[key] <= 1.0, (key, metrics)
