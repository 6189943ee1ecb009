"""The embedded demo data sets under ``data/demo/`` (deterministic, a few seconds): what ``tools/make_demo_data.py``
writes, and what the tools write on demand when a config names a demo root (:func:`make_demo`).

The pictures are real scans, not random blobs: scikit-learn ships the UCI handwritten digits (1,797 scanned 8x8
digits, the UCI set's test part written by 13 people, ten classes; ``sklearn.datasets.load_digits`` reads them from
the package, no download). Each digit is scaled up, tinted and scattered on a textured background; its strokes give
the instance mask, the box and the semantic label, so a model can measurably learn the task. Every fifth scan goes
to validation only: validation digits are scans never seen in training (by the same writers: the scans carry no
writer ids).

Layout written (the same layouts the real COCO / ADE20K / ImageNet configs expect, see the README)::

    data/demo/coco/{train2017,val2017}/*.jpg
    data/demo/coco/annotations/instances_{train2017,val2017}.json   # 10 classes 'digit_0'..; polygons and RLE masks
    data/demo/ade/images/{training,validation}/*.jpg
    data/demo/ade/annotations/{training,validation}/*.png           # 0 = unlabelled, 1 = background, 2+d = digit d
    data/demo/imagenet/{train,val}/digit_<d>/*.JPEG
    data/demo/imagenet/meta/{train,val}.txt                          # "digit_<d>/<name>.JPEG <d>" per line

With ``SOFTFREE_DEMO_CACHE=DIR`` in the environment, each set is generated once under ``DIR`` and hard-linked
(copied where links fail) into every output folder that asks for it: the test suite writes many demo roots.
"""
import fcntl
import functools
import json
import os
import os.path as osp
import shutil

import cv2
import numpy as np
from pycocotools import mask as mask_utils

TASKS = ('coco', 'ade', 'imagenet')
CLASSES = tuple(f'digit_{d}' for d in range(10))
# image sizes (h, w), counts per split, digits per image and digit sizes (px): small enough to write in seconds and
# to train on CPU. The detection digits and the classification crops' digits share their pixel scale, so a backbone
# pretrained on the crops meets digits of the size it learnt in the detection images.
COCO_SIZES = ((128, 160), (160, 160), (160, 128))
COCO_COUNTS = dict(train2017=800, val2017=100)
COCO_DIGITS = (4, 8)
COCO_DIGIT_PX = (24, 52)
ADE_SIZE = (128, 160)
ADE_COUNTS = dict(training=200, validation=50)
# classification crops: one digit filling most of a 32 px crop (24-32 px, the small half of the detection digits'
# sizes), which a classifier learns within the demo's few hundred steps (a digit anywhere in a larger crop is not)
CLS_SIZE = 32
CLS_COUNTS = dict(train=450, val=50)  # images per class
CLS_DIGIT_PX = (24, 32)
STAMP = '.complete'  # written last (version, seed, file count): a folder without it, or not matching it, is rebuilt
VERSION = 5  # raised whenever the generator's output changes, so an old set on disk is rebuilt


def load_digit_scans():
    """(1797, 8, 8) float32 in [0, 1] and their labels, split into train / val scans."""
    from sklearn.datasets import load_digits
    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)
    labels = digits.target.astype(np.int64)
    idx = np.arange(len(labels))
    val = idx % 5 == 0
    return dict(train=(images[~val], labels[~val]), val=(images[val], labels[val]))


@functools.lru_cache(maxsize=None)
def _grid(h, w):
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    return yy, xx


def texture(rng, h, w):
    """A smooth colour background: low-frequency noise, a grating and fine grain (float32, h x w x 3)."""
    low = rng.standard_normal(size=(max(2, h // 32), max(2, w // 32), 3), dtype=np.float32)
    low = cv2.resize(low, (w, h), interpolation=cv2.INTER_CUBIC)
    yy, xx = _grid(h, w)
    theta, period = rng.uniform(0, np.pi), rng.uniform(8, 32)
    grating = np.sin((xx * np.float32(np.cos(theta)) + yy * np.float32(np.sin(theta))) * np.float32(2 * np.pi / period))
    base = rng.uniform(70, 185, size=3).astype(np.float32)
    tint = (12 * rng.uniform(0.3, 1.0, size=3)).astype(np.float32)
    img = base + 22 * low + grating[..., None] * tint + 5 * rng.standard_normal(size=(h, w, 3), dtype=np.float32)
    return np.clip(img, 0, 255, out=img)


def render_digit(scan, size):
    """Upscale an 8x8 scan to size x size: (alpha in [0, 1], stroke mask bool)."""
    alpha = cv2.resize(scan, (size, size), interpolation=cv2.INTER_CUBIC)
    alpha = np.clip(alpha, 0.0, 1.0)
    return alpha, alpha > 0.35


def contrasting_colour(rng, bg_mean):
    for _ in range(20):
        c = rng.uniform(0, 255, size=3)
        if np.abs(c - bg_mean).mean() > 70:
            return c
    return 255.0 - bg_mean


def scatter(rng, scans, labels, h, w, n, size_range, max_tries=50):
    """Paste ``n`` random digits without overlap. Returns the image and a list of (label, full-size mask)."""
    img = texture(rng, h, w)
    occupied = np.zeros((h, w), dtype=bool)
    placed = []
    for _ in range(n):
        for _ in range(max_tries):
            s = int(rng.integers(size_range[0], size_range[1] + 1))
            if s > min(h, w):
                continue
            y, x = int(rng.integers(0, h - s + 1)), int(rng.integers(0, w - s + 1))
            if not occupied[y:y + s, x:x + s].any():
                break
        else:
            continue
        i = int(rng.integers(len(labels)))
        alpha, stroke = render_digit(scans[i], s)
        colour = contrasting_colour(rng, img[y:y + s, x:x + s].reshape(-1, 3).mean(0))
        patch = img[y:y + s, x:x + s]
        img[y:y + s, x:x + s] = patch * (1 - alpha[..., None]) + colour * alpha[..., None]
        occupied[max(0, y - 2):y + s + 2, max(0, x - 2):x + s + 2] = True
        full = np.zeros((h, w), dtype=np.uint8)
        full[y:y + s, x:x + s] = stroke
        placed.append((int(labels[i]), full))
    return np.clip(img, 0, 255).round().astype(np.uint8), placed


def polygons_of(mask):
    contours, _ = cv2.findContours(mask, cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_NONE)
    return [c.reshape(-1).astype(float).tolist() for c in contours if len(c) >= 3]


def coco_annotation(mask, ann_id, img_id, label, use_rle):
    """A COCO annotation whose area and box are those of the segmentation actually stored."""
    h, w = mask.shape
    if use_rle:
        rle = mask_utils.encode(np.asfortranarray(mask))
        seg = dict(size=list(rle['size']), counts=rle['counts'].decode('ascii'))
    else:
        seg = polygons_of(mask)
        if not seg:
            return None
        rle = mask_utils.merge(mask_utils.frPyObjects(seg, h, w))
    area = float(mask_utils.area(rle))
    if area < 4:
        return None
    box = [float(v) for v in mask_utils.toBbox(rle)]
    return dict(id=ann_id, image_id=img_id, category_id=label + 1, segmentation=seg, area=area, bbox=box, iscrowd=0)


def make_coco(out, rng, scans):
    os.makedirs(osp.join(out, 'annotations'), exist_ok=True)
    categories = [dict(id=d + 1, name=name, supercategory='digit') for d, name in enumerate(CLASSES)]
    for split, count in COCO_COUNTS.items():
        images, labels = scans['train' if split == 'train2017' else 'val']
        os.makedirs(osp.join(out, split), exist_ok=True)
        img_infos, anns = [], []
        for k in range(count):
            h, w = COCO_SIZES[k % len(COCO_SIZES)]
            img, placed = scatter(rng, images, labels, h, w, n=int(rng.integers(COCO_DIGITS[0], COCO_DIGITS[1] + 1)),
                                  size_range=COCO_DIGIT_PX)
            name = f'{k:012d}.jpg'
            cv2.imwrite(osp.join(out, split, name), img[..., ::-1], [cv2.IMWRITE_JPEG_QUALITY, 92])
            img_infos.append(dict(id=k + 1, file_name=name, height=h, width=w))
            for label, mask in placed:
                # every third instance is stored as compressed RLE, the others as polygons (both COCO forms)
                ann = coco_annotation(mask, len(anns) + 1, k + 1, label, use_rle=len(anns) % 3 == 2)
                if ann is not None:
                    anns.append(ann)
        with open(osp.join(out, 'annotations', f'instances_{split}.json'), 'w') as f:
            json.dump(dict(images=img_infos, annotations=anns, categories=categories,
                           info=dict(description='softfree_mm demo: scikit-learn digits')), f)


def make_ade(out, rng, scans):
    h, w = ADE_SIZE
    for split, count in ADE_COUNTS.items():
        images, labels = scans['train' if split == 'training' else 'val']
        for sub in ('images', 'annotations'):
            os.makedirs(osp.join(out, sub, split), exist_ok=True)
        for k in range(count):
            img, placed = scatter(rng, images, labels, h, w, n=int(rng.integers(2, 5)), size_range=(24, 56))
            seg = np.ones((h, w), dtype=np.uint8)  # 1 = background ("wall"-like stuff class)
            for label, mask in placed:
                seg[mask > 0] = label + 2
            name = f'ADE_{split}_{k:08d}'
            cv2.imwrite(osp.join(out, 'images', split, name + '.jpg'), img[..., ::-1], [cv2.IMWRITE_JPEG_QUALITY, 92])
            cv2.imwrite(osp.join(out, 'annotations', split, name + '.png'), seg)


def make_imagenet(out, rng, scans):
    os.makedirs(osp.join(out, 'meta'), exist_ok=True)
    for split, per_class in CLS_COUNTS.items():
        images, labels = scans['train' if split == 'train' else 'val']
        lines = []
        for d in range(10):
            os.makedirs(osp.join(out, split, CLASSES[d]), exist_ok=True)
            pool = np.flatnonzero(labels == d)
            for k in range(per_class):
                scan = images[pool[int(rng.integers(len(pool)))]]
                img, _ = scatter(rng, scan[None], np.array([d]), CLS_SIZE, CLS_SIZE, n=1, size_range=CLS_DIGIT_PX)
                rel = f'{CLASSES[d]}/{split}_{d}_{k:04d}.JPEG'
                cv2.imwrite(osp.join(out, split, rel), img[..., ::-1], [cv2.IMWRITE_JPEG_QUALITY, 92])
                lines.append(f'{rel} {d}')
        with open(osp.join(out, 'meta', f'{split}.txt'), 'w') as f:
            f.write('\n'.join(lines) + '\n')


MAKERS = dict(coco=make_coco, ade=make_ade, imagenet=make_imagenet)


def _files(folder):
    return sum(len([f for f in names if f != STAMP]) for _, _, names in os.walk(folder))


def _stamp(folder, seed):
    return f'version={VERSION} seed={seed} files={_files(folder)}\n'


def is_complete(folder, seed=0):
    """The set in ``folder`` was fully written with ``seed`` and no file of it has gone missing."""
    path = osp.join(folder, STAMP)
    if not osp.exists(path):
        return False
    with open(path) as f:
        return f.read() == _stamp(folder, seed)


def make_demo_data(out='data/demo', seed=0, only=TASKS, force=False):
    """Write the requested sets under ``out``; a set already complete (same seed, no file missing) is kept unless
    ``force``. Returns ``out``."""
    bad = [t for t in only if t not in TASKS]
    if bad:
        raise ValueError(f'unknown demo data set(s) {bad}; valid: {list(TASKS)}')
    scans = load_digit_scans()
    for i, task in enumerate(TASKS):
        if task not in only:
            continue
        folder = osp.join(out, task)
        if not force and is_complete(folder, seed):
            continue
        if osp.isdir(folder):
            shutil.rmtree(folder)
        cache = os.environ.get('SOFTFREE_DEMO_CACHE')
        if cache and not force:
            source = osp.join(cache, f'seed{seed}', task)
            os.makedirs(osp.dirname(source), exist_ok=True)
            with open(source + '.lock', 'w') as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # parallel processes wait for one writer
                if not is_complete(source, seed):
                    _write(source, task, i, seed, scans)
            shutil.copytree(source, folder, copy_function=_link)
        else:
            _write(folder, task, i, seed, scans)
    return out


def _write(folder, task, index, seed, scans):
    if osp.isdir(folder):
        shutil.rmtree(folder)
    # one generator per set, so each set is the same whether or not the others are written
    MAKERS[task](folder, np.random.default_rng([seed, index]), scans)
    stamp = _stamp(folder, seed)
    with open(osp.join(folder, STAMP), 'w') as f:
        f.write(stamp)


def _link(src, dst):
    try:
        os.link(src, dst)
    except OSError:  # another file system, or links not allowed
        shutil.copy2(src, dst)


def make_demo(root, subset=None):
    """Write the demo data set ``subset`` (all when None or unknown) under ``root`` once; a file lock keeps parallel
    processes (torchrun) from racing."""
    os.makedirs(osp.dirname(osp.abspath(root)), exist_ok=True)
    with open(osp.abspath(root) + '.lock', 'w') as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        make_demo_data(root, only=[subset] if subset in TASKS else TASKS)
