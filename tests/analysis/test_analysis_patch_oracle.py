"""softfree_mm.analysis.patch_oracle / tools/analysis/patch_oracle.py: the patch-majority oracle of a segmentation
config's ground truth.

Guards: the majority per patch and the IoU by hand on a small map (ties, ignored pixels, a partial last patch);
patch 1 reproduces the ground truth (100); the tool on the demo scenes equals a loop-by-loop computation of the same
definition; bad input is one line.
"""
import numpy as np
import pytest

from softfree_mm.analysis import patch_oracle as po

from tests.helpers import load_tool, main_as_command


def test_majority_per_patch_and_scores_by_hand():
    gt = np.zeros((6, 6), dtype=np.int64)
    gt[0:3, 0:3] = 2          # a 3x3 digit in the first 4x4 patch: 9 of 16 pixels
    gt[4:6, 4:6] = 1          # a 2x2 digit in the partial last patch (2x2 pixels): all of it
    gt[0, 5] = 255            # an ignored pixel
    pred = po.patch_majority(gt, 4, 3)
    assert (pred[0:4, 0:4] == 2).all() and (pred[0:4, 4:6] == 0).all() and (pred[4:6, 0:4] == 0).all()
    assert (pred[4:6, 4:6] == 1).all()
    got = po.scores([(pred, gt)], 3)
    # background: 22 pixels, 7 of them in patch 0 (labelled 2): 15 / 22; digit 1: 4 / 4; digit 2: 9 of the 16
    # pixels labelled 2: 9 / 16; 35 labelled pixels (one ignored), 28 right
    assert got['mIoU'] == pytest.approx(100 * (15 / 22 + 4 / 4 + 9 / 16) / 3)
    assert got['aAcc'] == pytest.approx(100 * 28 / 35)
    assert got['mAcc'] == pytest.approx(100 * (15 / 22 + 4 / 4 + 9 / 9) / 3)
    # a tie (2 vs 2 pixels) takes the smaller label; an all-ignored patch is 0
    tie = np.array([[1, 1], [2, 2]])
    assert (po.patch_majority(tie, 2, 3) == 1).all()
    assert (po.patch_majority(np.full((2, 2), 255), 2, 3) == 0).all()
    assert po.scores([(gt, gt)], 3)['mIoU'] == 100.0
    with pytest.raises(ValueError, match='patch 0: >= 1'):
        po.patch_majority(gt, 0, 3)


def _loop_oracle(gts, p, c):
    """The same definition, one patch and one pixel at a time (an independent reference)."""
    inter, union = np.zeros(c), np.zeros(c)
    for g in gts:
        h, w = g.shape
        pred = np.zeros_like(g)
        for i in range(0, h, p):
            for j in range(0, w, p):
                v = g[i:i + p, j:j + p].ravel()
                v = v[v != 255]
                pred[i:i + p, j:j + p] = np.bincount(v, minlength=c).argmax() if len(v) else 0
        for k in range(c):
            a, b = (pred == k) & (g != 255), g == k
            inter[k] += (a & b).sum()
            union[k] += (a | b).sum()
    iou = inter[union > 0] / union[union > 0]
    return 100 * iou.mean()


def test_the_tool_on_the_demo_scenes_equals_a_loop_by_loop_oracle(tmp_path, capsys):
    from softfree_mm.analysis import probe
    config = 'configs/demo/semfpn_xcit_t12_poly3_demo.py'
    call = main_as_command(load_tool('analysis/patch_oracle'), capsys)
    out = tmp_path / 'oracle.csv'
    status, stdout, err = call(config, '--patches', '1', '16', '--num-images', '6', '--out', str(out))
    assert status == 0, err
    lines = out.read_text().splitlines()
    assert lines[0] == ','.join(po.FIELDS) and len(lines) == 3
    got = {int(r.split(',')[0]): float(r.split(',')[1]) for r in lines[1:]}
    ds = probe.build_dataset(probe.load_checked(config), 'val', config)
    gts = [s['data_samples'].gt_sem_seg.data.squeeze(0).numpy().astype('int64') for _, s in
           probe.dataset_samples(ds, 6)]
    assert got[1] == 100.0
    assert got[16] == pytest.approx(_loop_oracle(gts, 16, 11))
    assert got[16] < 100.0
    capsys.readouterr()  # the reference's own dataset messages
    for args, message in ((['--patches', '0'], '--patches 0: distinct sizes >= 1'),
                          (['--num-images', '-1'], '--num-images -1: >= 0')):
        status, _, err = call(config, *args, '--out', str(out))
        assert status == 2 and len(err.strip().splitlines()) == 1 and message in err, err
