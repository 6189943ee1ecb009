"""The demo data generator (softfree_mm/engine/demo_data.py, behind tools/make_demo_data.py) writes real,
deterministic demo sets in the layouts the configs expect.

Guards: the same seed gives byte-identical files; the COCO set holds both polygon and RLE masks whose stored area
and box agree with the mask pycocotools decodes, its images carry digits where the masks say (the strokes differ from
the background), and validation digits come from scans never used in training; the ADE20K-style labels are
background 1 and digits 2..11 on the digit strokes; the ImageNet-style meta files list existing images with labels
0..9; a second call keeps a complete set and rebuilds one with a missing file or another seed; an unknown set
name is an error naming it.
"""
import filecmp
import json
import os
import os.path as osp

import cv2
import numpy as np
import pytest
from pycocotools import mask as mask_utils

from softfree_mm.engine import demo_data as mdd


@pytest.fixture(scope='module', autouse=True)
def no_cache():
    """These tests check the generator itself: no shared cache (tests/conftest.py) unless a test sets one."""
    saved = os.environ.pop('SOFTFREE_DEMO_CACHE', None)
    yield
    if saved is not None:
        os.environ['SOFTFREE_DEMO_CACHE'] = saved


@pytest.fixture(scope='module')
def demo(tmp_path_factory):
    return mdd.make_demo_data(str(tmp_path_factory.mktemp('a') / 'demo'))


def _files(root):
    return sorted(osp.relpath(osp.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)


def test_same_seed_writes_identical_files(demo, tmp_path):
    again = mdd.make_demo_data(str(tmp_path / 'demo'), only=['imagenet', 'ade'])
    for task in ('imagenet', 'ade'):
        a, b = osp.join(demo, task), osp.join(again, task)
        names = _files(a)
        assert names == _files(b) and len(names) > 100
        match, mismatch, errors = filecmp.cmpfiles(a, b, names, shallow=False)
        assert not mismatch and not errors


def test_coco_masks_are_polygons_and_rle_consistent_with_area_box_and_pixels(demo):
    coco = osp.join(demo, 'coco')
    with open(osp.join(coco, 'annotations', 'instances_train2017.json')) as f:
        d = json.load(f)
    assert [c['name'] for c in d['categories']] == [f'digit_{i}' for i in range(10)]
    kinds = {'polygon': 0, 'rle': 0}
    images = {im['id']: im for im in d['images']}
    for ann in d['annotations'][:60]:
        im = images[ann['image_id']]
        h, w = im['height'], im['width']
        seg = ann['segmentation']
        if isinstance(seg, list):
            kinds['polygon'] += 1
            rle = mask_utils.merge(mask_utils.frPyObjects(seg, h, w))
        else:
            kinds['rle'] += 1
            rle = seg
        mask = mask_utils.decode(rle).astype(bool)
        assert mask.sum() == pytest.approx(ann['area'], abs=0.5)
        ys, xs = np.nonzero(mask)
        x, y, bw, bh = ann['bbox']
        assert (x, y, x + bw, y + bh) == (xs.min(), ys.min(), xs.max() + 1, ys.max() + 1)
        # the strokes were painted in a contrasting colour: inside the mask differs from the ring around the box
        img = cv2.imread(osp.join(coco, 'train2017', im['file_name'])).astype(np.float32)
        inside = img[mask].mean(0)
        ring = np.zeros_like(mask)
        ring[max(0, int(y) - 3):int(y + bh) + 3, max(0, int(x) - 3):int(x + bw) + 3] = True
        ring[int(y):int(y + bh), int(x):int(x + bw)] = False
        if ring.any():
            assert np.abs(inside - img[ring].mean(0)).mean() > 20
    assert kinds['polygon'] > 0 and kinds['rle'] > 0


def test_validation_digits_come_from_scans_unused_in_training():
    scans = mdd.load_digit_scans()
    train = {s.tobytes() for s in scans['train'][0]}
    val = [s.tobytes() for s in scans['val'][0]]
    assert len(train) + len(val) >= 1790 and not any(v in train for v in val)


def test_ade_labels_are_background_one_and_digits_two_to_eleven(demo):
    ade = osp.join(demo, 'ade')
    seen = set()
    for name in sorted(os.listdir(osp.join(ade, 'annotations', 'training')))[:20]:
        seg = cv2.imread(osp.join(ade, 'annotations', 'training', name), cv2.IMREAD_UNCHANGED)
        img = cv2.imread(osp.join(ade, 'images', 'training', name.replace('.png', '.jpg')))
        assert seg.shape == img.shape[:2]
        values = set(np.unique(seg).tolist())
        assert 1 in values and values <= set(range(1, 12)) and len(values) >= 2
        seen |= values
    assert len(seen) >= 6


def test_imagenet_meta_lists_existing_images_with_labels_zero_to_nine(demo):
    inet = osp.join(demo, 'imagenet')
    for split, per_class in mdd.CLS_COUNTS.items():
        lines = open(osp.join(inet, 'meta', f'{split}.txt')).read().split('\n')
        lines = [line for line in lines if line]
        assert len(lines) == 10 * per_class
        for line in lines:
            rel, label = line.split()
            assert osp.isfile(osp.join(inet, split, rel)) and rel.startswith(f'digit_{label}/')


def test_complete_set_is_kept_and_unknown_set_is_an_error(demo):
    stamp = osp.join(demo, 'imagenet', mdd.STAMP)
    before = os.stat(stamp).st_mtime_ns
    mdd.make_demo_data(demo, only=['imagenet'])
    assert os.stat(stamp).st_mtime_ns == before
    with pytest.raises(ValueError, match=r"unknown demo data set\(s\) \['voc'\]; valid: \['coco', 'ade', 'imagenet'\]"):
        mdd.make_demo_data(demo, only=['voc'])


def test_cache_links_the_files_a_direct_write_makes_into_every_root(demo, tmp_path, monkeypatch):
    monkeypatch.setenv('SOFTFREE_DEMO_CACHE', str(tmp_path / 'cache'))
    roots = [mdd.make_demo_data(str(tmp_path / name / 'demo'), only=['ade']) for name in ('x', 'y')]
    a, b = (osp.join(r, 'ade') for r in roots)
    names = _files(osp.join(demo, 'ade'))
    assert _files(a) == _files(b) == names and mdd.is_complete(a) and mdd.is_complete(b)
    match, mismatch, errors = filecmp.cmpfiles(osp.join(demo, 'ade'), a, names, shallow=False)
    assert not mismatch and not errors
    one = names[0]
    assert os.stat(osp.join(a, one)).st_ino == os.stat(osp.join(b, one)).st_ino  # linked, not written twice


def test_a_set_with_a_missing_file_or_another_seed_is_rebuilt(tmp_path, monkeypatch):
    monkeypatch.setenv('SOFTFREE_DEMO_CACHE', str(tmp_path / 'cache'))  # the rebuild goes through the cache
    out = str(tmp_path / 'demo')
    mdd.make_demo_data(out, only=['ade'])
    folder = osp.join(out, 'ade')
    first = sorted(_files(folder))
    victim = osp.join(folder, 'images', 'validation', 'ADE_validation_00000002.jpg')
    original = open(victim, 'rb').read()
    os.remove(victim)
    assert not mdd.is_complete(folder, 0)
    mdd.make_demo_data(out, only=['ade'])
    assert sorted(_files(folder)) == first and open(victim, 'rb').read() == original
    assert mdd.is_complete(folder, 0) and not mdd.is_complete(folder, 1)
    mdd.make_demo_data(out, seed=1, only=['ade'])  # another seed: rewritten, different pictures
    assert mdd.is_complete(folder, 1) and open(victim, 'rb').read() != original
    assert sorted(_files(folder)) == first
