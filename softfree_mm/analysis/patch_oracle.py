"""What a segmentor that gives one label per p x p patch could score: every patch labelled with the majority of its
ground-truth pixels (ignored pixels left out), the label spread over the patch's pixels, scored as mmseg's IoUMetric
scores a model (per class, intersections and unions summed over the images, the mean over the classes with a
union). Not a strict bound (a decoder can draw sub-patch boundaries from a patch's channels), a reference: how much
of the ground truth survives the patch size alone. docs/study.md reads it beside XCiT's 16-pixel patches.
"""
from typing import Iterable, List, Sequence, Tuple

import numpy as np

FIELDS = ('patch', 'mIoU', 'aAcc', 'mAcc', 'images')


def patch_majority(gt: np.ndarray, patch: int, num_classes: int, ignore_index: int = 255) -> np.ndarray:
    """``gt`` (H, W) labels -> the prediction giving each pixel its patch's majority label (ties: the smallest
    label; a patch of ignored pixels only: 0). Patches tile from the top-left; the last row / column may be partial."""
    if patch < 1:
        raise ValueError(f'patch {patch}: >= 1')
    h, w = gt.shape
    hp, wp = -(-h // patch), -(-w // patch)
    padded = np.full((hp * patch, wp * patch), ignore_index, dtype=np.int64)
    padded[:h, :w] = gt
    valid = padded != ignore_index
    onehot = np.zeros((hp * patch, wp * patch, num_classes), dtype=np.int32)
    rows, cols = np.nonzero(valid)
    onehot[rows, cols, padded[valid]] = 1
    counts = onehot.reshape(hp, patch, wp, patch, num_classes).sum(axis=(1, 3))
    labels = counts.argmax(-1)
    return np.repeat(np.repeat(labels, patch, 0), patch, 1)[:h, :w]


def scores(pairs: Iterable[Tuple[np.ndarray, np.ndarray]], num_classes: int, ignore_index: int = 255) -> dict:
    """mIoU, aAcc, mAcc in % over (prediction, ground truth) pairs, as mmseg's IoUMetric computes them."""
    inter = np.zeros(num_classes)
    union = np.zeros(num_classes)
    label = np.zeros(num_classes)
    n = 0
    for pred, gt in pairs:
        keep = gt != ignore_index
        p, g = pred[keep], gt[keep]
        i = np.bincount(p[p == g], minlength=num_classes)[:num_classes]
        a_p = np.bincount(p, minlength=num_classes)[:num_classes]
        a_g = np.bincount(g, minlength=num_classes)[:num_classes]
        inter, union, label = inter + i, union + a_p + a_g - i, label + a_g
        n += 1
    with np.errstate(invalid='ignore', divide='ignore'):
        iou, acc = inter / union, inter / label
    return dict(mIoU=100 * float(np.nanmean(iou)), aAcc=100 * float(inter.sum() / max(label.sum(), 1)),
                mAcc=100 * float(np.nanmean(acc)), images=n)


def oracle_rows(gts: Sequence[np.ndarray], patches: Sequence[int], num_classes: int,
                ignore_index: int = 255) -> List[dict]:
    """One row of FIELDS per patch size over the ground-truth maps ``gts``."""
    return [dict(patch=p, **scores(((patch_majority(g, p, num_classes, ignore_index), g) for g in gts),
                                   num_classes, ignore_index)) for p in patches]
