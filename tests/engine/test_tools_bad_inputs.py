"""Bad inputs fail clearly and lose nothing: one line on stderr naming the file or the iteration, exit status 2,
and the work directory's last checkpoint intact (the name ``last_checkpoint`` holds, and the file loads).

Each case runs the real tools/train.py or tools/test.py (in-process) on the smallest demo config (the classifier,
tiny widths; an iteration-based schedule with a checkpoint every 2 iterations) or, for COCO annotations, the
detector's demo config. A first run writes ``iter_2.pth``; the bad input then meets a resumed run or an evaluation.
"""
import json
import os.path as osp
import shutil

import pytest
import torch

from tests.helpers import ROOT, load_tool
from tests.helpers.demo import shared_demo_root

DEMO = osp.join(ROOT, 'configs', 'demo')


@pytest.fixture(scope='module')
def tools():
    return load_tool('train'), load_tool('test')


@pytest.fixture(scope='module')
def base(tmp_path_factory, tools):
    """A tiny classifier config on its own copy of the demo data, and a work dir trained to iteration 2."""
    folder = tmp_path_factory.mktemp('bad_inputs')
    root = shared_demo_root(tmp_path_factory)
    cfg = folder / 'cls_tiny.py'
    cfg.write_text(f"""_base_ = {osp.join(DEMO, 'cls_xcit_s12_poly3_demo.py')!r}
data_root = {root!r}
model = dict(backbone=dict(embed_dims=32, depth=1, num_heads=4, cls_attn_layers=1), head=dict(in_channels=32))
train_dataloader = dict(batch_size=4, sampler=dict(type='InfiniteSampler', shuffle=True),
                        dataset=dict(data_root=data_root, indices=8))
val_dataloader = dict(batch_size=4, dataset=dict(data_root=data_root, indices=4))
test_dataloader = val_dataloader
train_cfg = dict(_delete_=True, type='IterBasedTrainLoop', max_iters=4, val_interval=100)
param_scheduler = []
default_hooks = dict(logger=dict(interval=1), checkpoint=dict(by_epoch=False, interval=2, max_keep_ckpts=1))
""")
    work = folder / 'trained'
    assert tools[0].main([str(cfg), '--work-dir', str(work), '--cfg-options', 'train_cfg.max_iters=2']) == 0
    return dict(cfg=str(cfg), folder=folder, root=root, work=work)


def _fresh_work(base, name):
    """A copy of the trained work dir (iter_2.pth + last_checkpoint pointing at it)."""
    work = base['folder'] / name
    shutil.copytree(base['work'], work)
    (work / 'last_checkpoint').write_text(str(work / 'iter_2.pth'))
    return work


def _one_error(capsys):
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith('error: ')]
    assert len(err) == 1, err
    return err[0]


def _last_checkpoint_intact(work, it=2):
    named = (work / 'last_checkpoint').read_text().strip()
    assert osp.basename(named) == f'iter_{it}.pth'
    ckpt = torch.load(named, map_location='cpu')
    assert ckpt['meta']['iter'] == it
    return ckpt


def test_truncated_image_names_the_file_and_keeps_the_checkpoint(base, tools, capsys, tmp_path):
    data = tmp_path / 'data'
    shutil.copytree(osp.dirname(base['root']), data / 'demo')
    first = (data / 'demo' / 'imagenet' / 'meta' / 'train.txt').read_text().split()[0]
    bad = data / 'demo' / 'imagenet' / 'train' / first
    raw = bad.read_bytes()
    bad.write_bytes(raw[:len(raw) // 2])  # cut short: a partial JPEG cv2 would decode into a half-grey image
    work = _fresh_work(base, 'truncated')
    root = str(data / 'demo' / 'imagenet')
    rc = tools[0].main([base['cfg'], '--work-dir', str(work), '--resume', '--cfg-options',
                        f'train_dataloader.dataset.data_root={root}', f'val_dataloader.dataset.data_root={root}'])
    assert rc == 2
    line = _one_error(capsys)
    assert str(bad) in line and 'truncated JPEG' in line
    _last_checkpoint_intact(work)
    bad.write_bytes(b'not an image at all')  # unreadable
    assert tools[0].main([base['cfg'], '--work-dir', str(work), '--resume', '--cfg-options',
                          f'train_dataloader.dataset.data_root={root}',
                          f'val_dataloader.dataset.data_root={root}']) == 2
    line = _one_error(capsys)
    assert str(bad) in line and 'cannot decode' in line


def test_cut_short_images_are_told_from_complete_ones_with_thumbnails_or_trailers():
    import cv2
    import numpy as np
    from softfree_mm.engine.data_errors import _truncated
    img = (np.arange(64 * 48 * 3) % 251).astype(np.uint8).reshape(64, 48, 3)
    jpg = cv2.imencode('.jpg', img)[1].tobytes()
    png = cv2.imencode('.png', img)[1].tobytes()
    thumb = b'\xff\xe1' + (2 + 12).to_bytes(2, 'big') + b'Exif\0\0\xff\xd8\xff\xd9\0\0'  # an APP1 holding FF D9
    with_thumb = jpg[:2] + thumb + jpg[2:]
    for ok in (jpg, png, with_thumb, jpg + b'\0' * 100 + b'ftypmp42' * 2000, png + b'trailer'):
        assert _truncated(ok) is None
    for cut in (jpg[:len(jpg) // 2], with_thumb[:len(with_thumb) - 10], jpg[:40]):
        assert _truncated(cut) == 'truncated JPEG (no end-of-image marker)'
    assert _truncated(png[:len(png) - 20]) == 'truncated PNG (no IEND chunk)'


@pytest.mark.parametrize('case', ['not_json', 'no_bbox'])
def test_bad_coco_annotation_file_is_one_line_naming_it(tools, capsys, tmp_path, case):
    ann = tmp_path / 'instances.json'
    good = dict(images=[dict(id=1, file_name='a.jpg', width=64, height=64)],
                annotations=[dict(id=1, image_id=1, category_id=1, bbox=[1, 1, 20, 20], area=400, iscrowd=0,
                                  segmentation=[[1, 1, 21, 1, 21, 21]])],
                categories=[dict(id=i + 1, name=f'digit_{i}') for i in range(10)])
    if case == 'not_json':
        ann.write_text(json.dumps(good)[:-20])
    else:
        del good['annotations'][0]['bbox']
        ann.write_text(json.dumps(good))
    (tmp_path / 'train2017').mkdir()
    from tests.helpers.demo import TINY  # the tiny widths every demo test uses
    cfg = tmp_path / 'det_tiny.py'
    cfg.write_text(f"_base_ = {osp.join(DEMO, TINY['maskrcnn'][0])!r}\n{TINY['maskrcnn'][1]}\n"
                   f"train_dataloader = dict(dataset=dict(data_root={str(tmp_path) + '/'!r}, ann_file={str(ann)!r}))\n"
                   "train_cfg = dict(val_begin=1000)\nval_cfg = None\nval_dataloader = None\nval_evaluator = None\n")
    rc = tools[0].main([str(cfg), '--work-dir', str(tmp_path / 'w')])
    assert rc == 2
    line = _one_error(capsys)
    assert str(ann) in line and 'CocoDataset' in line
    if case == 'not_json':
        assert 'not valid JSON' in line
    else:
        assert "a field is missing: annotations[0] (id 1) has no 'bbox'" in line


def test_json_problem_names_the_missing_list_or_field(tmp_path):
    from softfree_mm.engine.data_errors import json_problem
    ann = tmp_path / 'a.json'
    ann.write_text(json.dumps(dict(images=[], categories=[])))
    assert json_problem(str(ann)) == "a field is missing: no 'annotations' list (a COCO file needs images, " \
        "annotations, categories)"
    ann.write_text(json.dumps(dict(images=[dict(id=3, file_name='x.jpg', width=4)], annotations=[], categories=[])))
    assert json_problem(str(ann)) == "a field is missing: images[0] (id 3) has no 'height'"
    ann.write_text('{"images": [')
    assert json_problem(str(ann)).startswith('not valid JSON')
    ann.write_text(json.dumps(dict(images=[], annotations=[], categories=[])))
    assert json_problem(str(ann)) is None


def test_corrupt_checkpoint_is_one_line_and_auto_resume_falls_back_to_the_last_good_one(base, tools, capsys):
    work = _fresh_work(base, 'corrupt')
    good = (work / 'iter_2.pth').read_bytes()
    (work / 'iter_4.pth').write_bytes(good[:len(good) // 3])  # a truncated newer checkpoint, named as the last
    (work / 'last_checkpoint').write_text(str(work / 'iter_4.pth'))
    train, test = tools
    assert test.main([base['cfg'], str(work / 'iter_4.pth'), '--work-dir', str(work)]) == 2
    line = _one_error(capsys)
    assert str(work / 'iter_4.pth') in line and 'cannot be read' in line
    assert train.main([base['cfg'], '--work-dir', str(work), '--resume', str(work / 'iter_4.pth')]) == 2
    assert str(work / 'iter_4.pth') in _one_error(capsys)
    # --resume without a path: the newest readable checkpoint, said on stderr
    assert train.main([base['cfg'], '--work-dir', str(work), '--resume', '--cfg-options',
                       'train_cfg.max_iters=3']) == 0
    err = capsys.readouterr().err
    assert 'resuming from' in err and 'iter_2.pth' in err
    assert torch.load(work / 'iter_3.pth', map_location='cpu')['meta']['iter'] == 3


def test_checkpoint_of_another_model_is_one_line(base, tools, capsys, tmp_path):
    ckpt = torch.load(base['work'] / 'iter_2.pth', map_location='cpu')
    wider = dict(ckpt, state_dict={k: torch.zeros(*v.shape[:-1], v.shape[-1] * 2) if k.endswith('head.fc.weight')
                                   else v for k, v in ckpt['state_dict'].items()})
    torch.save(wider, tmp_path / 'wider.pth')
    other = dict(state_dict={'backbone.conv1.weight': torch.zeros(64, 3, 7, 7), 'fc.weight': torch.zeros(10, 64)})
    torch.save(other, tmp_path / 'other.pth')
    train, test = tools
    assert test.main([base['cfg'], str(tmp_path / 'other.pth'), '--work-dir', str(tmp_path / 'w')]) == 2
    line = _one_error(capsys)
    assert str(tmp_path / 'other.pth') in line and 'another model' in line and 'missing' in line
    work = _fresh_work(base, 'other_model')
    assert train.main([base['cfg'], '--work-dir', str(work), '--resume', str(tmp_path / 'wider.pth')]) == 2
    line = _one_error(capsys)
    assert 'wider.pth' in line and 'head.fc.weight' in line and 'another shape' in line
    _last_checkpoint_intact(work)


def test_nonfinite_loss_stops_with_iteration_and_terms_or_skips(base, tools, capsys):
    """A kernel whose output overflows (poly with a constant of 1e38: x^3 beyond float32) from iteration 3 on."""
    train = tools[0]
    work = _fresh_work(base, 'nan')
    blowup = 'model.backbone.attn_cfg.scale=1e38'
    assert train.main([base['cfg'], '--work-dir', str(work), '--resume', '--cfg-options', blowup]) == 2
    line = _one_error(capsys)
    assert line.startswith('error: iteration 3: the loss is') and 'loss=' in line and 'iter_2.pth' in line
    assert '--skip-nonfinite-loss' in line
    before = _last_checkpoint_intact(work)
    # skipping: the run goes on, no update is applied (the weights stay; BN statistics still follow the forward
    # passes, as under fp16 loss scaling), each skipped iteration is logged
    assert train.main([base['cfg'], '--work-dir', str(work), '--resume', '--skip-nonfinite-loss',
                       '--cfg-options', blowup]) == 0
    assert capsys.readouterr().out.count('the loss is not finite') == 2  # iterations 3 and 4
    after = _last_checkpoint_intact(work, it=4)
    for k, v in before['state_dict'].items():
        if 'running_' not in k and 'num_batches_tracked' not in k:
            assert torch.equal(after['state_dict'][k], v), k
