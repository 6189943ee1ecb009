"""The research tools on the digits demo: AttentionStatsHook in a real training run, its plot script, and the CLIs
tools/vis_attention.py and tools/analysis/{attention_norms,injectivity,locality,sweep}.py.

Guards: the hook writes, through the runner's visualizer, on the first and every K-th iteration exactly the norms a
direct computation from the kernel's own inputs gives (poly3 in Swin's shifted windows), and between records no hook
is attached to any kernel; each tool writes its CSV / PNG, and its numbers equal a direct computation (the test
records the kernels' inputs itself and maps windows to image positions itself); every tool
answers --help and refuses bad input with one line and exit status 2. A tiny Swin-T variant of the attention-stats
demo config (the demo's data and pipelines at 56 px, 7x7 windows) keeps it all to seconds.
"""
import csv
import json
import math
import os.path as osp

import numpy as np
import pytest
import torch

from softfree_mm.engine.demo_data import make_demo

from tests.helpers import ROOT, load_tool, one_line_error
from tests.helpers.demo import shared_demo_root

DEMO_CFG = osp.join(ROOT, 'configs', 'demo', 'cls_swin_t_attnstats_demo.py')


@pytest.fixture(scope='module')
def demo(tmp_path_factory):
    """The session's shared demo root (tests/helpers/demo.py): written once, under the tools' own file lock."""
    root = osp.dirname(shared_demo_root(tmp_path_factory))
    make_demo(root, 'imagenet')
    return root


def _config(folder, demo, name='tiny', extra=''):
    """The attention-stats demo shrunk: embed 16, depths 2-2-1-1, 56 px (stage grids 14, 7, 4, 2), 8 training
    images in batches of 4, 2 epochs (4 iterations), 4 validation images, no drop path, no mixup, datasets not
    serialised (a gc pass each); the hook skips matrices above 5000 elements (stage 4: 4 heads x 49 x 49)."""
    root = osp.join(demo, 'imagenet')
    text = f"""_base_ = {DEMO_CFG!r}
model = dict(backbone=dict(embed_dims=16, depths=(2, 2, 1, 1), num_heads=(1, 2, 2, 4), drop_path_rate=0.0),
             head=dict(in_channels=128), train_cfg=dict(augments=None))
pipe = [dict(type='LoadImageFromFile'), dict(type='ResizeEdge', scale=56, edge='short', backend='pillow'),
        dict(type='CenterCrop', crop_size=56), dict(type='PackInputs')]
train_dataloader = dict(batch_size=4, dataset=dict(data_root={root!r}, indices=8, pipeline=pipe, serialize_data=False))
val_dataloader = dict(batch_size=4, dataset=dict(data_root={root!r}, indices=4, pipeline=pipe, serialize_data=False))
test_dataloader = val_dataloader
train_cfg = dict(max_epochs=2, val_interval=2)
default_hooks = dict(logger=dict(interval=1), checkpoint=dict(interval=2))
custom_hooks = [dict(type='AttentionStatsHook', interval=3, max_matrix_elements=5000)]
{extra}
"""
    path = osp.join(folder, f'{name}.py')
    with open(path, 'w') as f:
        f.write(text)
    return path


class _KernelInputs:
    """Every AttentionKernel call in this process, in call order: (kernel, inputs, number of forward pre-hooks on
    the kernel, grad enabled). AttentionKernel.forward is wrapped (then restored): it records and calls the original."""

    def __enter__(self):
        import functools
        from softfree_mm.attention import AttentionKernel
        self.calls, self.cls = [], AttentionKernel
        self.original = original = AttentionKernel.forward
        names = ('q', 'k', 'v', 'hw', 'scale', 'bias', 'mask')

        @functools.wraps(original)
        def forward(module, *args, **kwargs):
            got = dict(zip(names, args))
            got.update(kwargs)
            self.calls.append((module, {n: (got[n].detach().clone() if isinstance(got.get(n), torch.Tensor)
                                            else got.get(n)) for n in names},
                               len(module._forward_pre_hooks), torch.is_grad_enabled()))
            return original(module, *args, **kwargs)
        AttentionKernel.forward = forward
        return self

    def __exit__(self, *exc):
        self.cls.forward = self.original


def _poly3(inp, heads):
    """A of poly3 from a kernel call's inputs (plain formula): c S^3 keep, c = 1/sqrt(valid keys)."""
    q, k = inp['q'].double(), inp['k'].double()
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if inp['bias'] is not None:
        s = s + inp['bias'].double()
    keep = torch.ones_like(s) if inp['mask'] is None else inp['mask'].double().expand_as(s)
    n = keep.sum(-1, keepdim=True)
    return s ** 3 / n.sqrt() * keep, 3 * s ** 2 / n.sqrt() * keep


@pytest.fixture(scope='module')
def trained(demo, tmp_path_factory):
    """One training run of the tiny config with the hook (K = 3: records at iterations 1 and 3), every kernel call
    recorded; returns (config, work dir, checkpoint, calls of the first training kernel per iteration)."""
    folder = tmp_path_factory.mktemp('train')
    cfg = _config(str(folder), demo)
    train = load_tool('train')
    work = str(folder / 'work')
    with _KernelInputs() as rec:
        torch.manual_seed(0)
        assert train.main([cfg, '--work-dir', work, '--cfg-options', f'visualizer.name=an_{folder.name}']) == 0
    return cfg, work, osp.join(work, 'epoch_2.pth'), rec.calls


def _stats_records(work):
    import glob
    path, = glob.glob(osp.join(work, '*', 'vis_data', 'attention_stats.json'))
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def test_stats_hook_writes_the_norms_a_direct_computation_gives_on_its_iterations_only(trained):
    cfg, work, _, calls = trained
    recs = _stats_records(work)
    assert [r['step'] for r in recs] == [1, 3]
    # the shifted-window layer of stage 1 (14 x 14 grid, 7 x 7 windows, no padding): one call per training forward
    train_calls = [(m, inp, n) for m, inp, n, grad in calls if grad and inp['q'].shape[0] == 4 * 4 and m.num_heads == 1]
    per_iter = train_calls[1::2]  # blocks 0 and 1 of stage 0 alternate; block 1 is shifted
    assert len(per_iter) == 4
    for it, (mod, inp, n_pre) in enumerate(per_iter, start=1):
        recorded = it in (1, 3)
        assert n_pre == (1 if recorded else 0)  # the capture hook exists on record iterations only
        assert inp['mask'] is not None  # shifted windows
        if not recorded:
            continue
        a, d = _poly3(inp, 1)
        fro = a.pow(2).sum((-2, -1)).sqrt().mean()
        jac = d.pow(2).sum((-2, -1)).sqrt().mean()
        rec = recs[[1, 3].index(it)]
        key = 'attn/backbone.stages.0.blocks.1.attn'
        assert rec[f'{key}/fro_h0'] == pytest.approx(float(fro), rel=1e-4)
        assert rec[f'{key}/jac_h0'] == pytest.approx(float(jac), rel=1e-4)
        assert rec[f'{key}/rows'] == 49
        assert rec[f'{key}/keys'] == pytest.approx(float(inp['mask'].double().sum(-1).mean()))
    # every layer but the one above max_matrix_elements (stage 4), which the log names once
    layers = {k.split('/')[1] for k in recs[0] if k.startswith('attn/')}
    assert len(layers) == 5 and 'backbone.stages.3.blocks.0.attn' not in layers
    assert all(f'attn/{layer}/jac' in recs[0] for layer in layers)
    import glob
    log, = glob.glob(osp.join(work, '*', '*.log'))
    text = open(log).read()
    assert text.count('backbone.stages.3.blocks.0.attn: no statistics (A has 9604 elements') == 1


def test_plot_attention_stats_draws_the_recorded_curves(trained, tmp_path):
    _, work, _, _ = trained
    plot = load_tool('analysis/plot_attention_stats')
    out = str(tmp_path / 'curves')
    assert plot.main([work, '--out', out]) == 0
    assert osp.getsize(out + '.png') > 10000
    recs = _stats_records(work)
    with open(out + '.csv') as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 * 5 * 2  # steps x layers x (fro, jac)
    for r in rows:
        want = recs[[1, 3].index(int(r['step']))][f"attn/{r['layer']}/{r['metric']}"]
        assert float(r['value']) == pytest.approx(want)


def test_stats_hook_is_registered_for_every_scope_and_checks_its_arguments():
    from mmengine.registry import HOOKS
    from softfree_mm.engine.hooks import AttentionStatsHook
    for scope in ('mmdet', 'mmseg', 'mmpretrain'):
        with HOOKS.switch_scope_and_registry(scope) as reg:
            assert isinstance(reg.build(dict(type='AttentionStatsHook', interval=5)), AttentionStatsHook)
    assert isinstance(HOOKS.build(dict(type='softfree_mm.AttentionStatsHook')), AttentionStatsHook)
    with pytest.raises(ValueError, match='interval'):
        AttentionStatsHook(interval=0)
    with pytest.raises(ValueError, match='file_name'):
        AttentionStatsHook(file_name='scalars.json')
    with pytest.raises(TypeError, match='layers'):
        AttentionStatsHook(layers='backbone.stages.0.blocks.0.attn')
    with pytest.raises(ValueError, match='max_matrix_elements'):
        AttentionStatsHook(max_matrix_elements=0)


def test_stats_hook_writes_to_tensorboard_when_installed(demo, tmp_path):
    pytest.importorskip('tensorboard')
    cfg = _config(str(tmp_path), demo, extra="visualizer = dict(vis_backends=[dict(type='LocalVisBackend'), "
                                             "dict(type='TensorboardVisBackend')])\ntrain_cfg = dict(max_epochs=1)")
    train = load_tool('train')
    work = str(tmp_path / 'work')
    assert train.main([cfg, '--work-dir', work, '--cfg-options', f'visualizer.name=tb_{tmp_path.name}']) == 0
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    import glob
    ev = EventAccumulator(glob.glob(osp.join(work, '*', 'vis_data'))[0])
    ev.Reload()
    assert 'attn/backbone.stages.0.blocks.0.attn/fro' in ev.Tags()['scalars']


def _grid_of_window(win, ty, tx, shifted):
    """Image row / column of token (ty, tx) of window ``win`` on the 14 x 7 grid (2 x 1 windows of 7 x 7); the
    shifted block rolls rows by -3 (Swin's cyclic shift; no shift across the single column window)."""
    row = win * 7 + ty
    return ((row + 3) % 14 if shifted else row), tx


def test_vis_attention_draws_a_shifted_window_query_where_its_keys_are(trained, demo, tmp_path):
    cfg, _, ckpt, _ = trained
    from PIL import Image
    img = str(tmp_path / 'tall.png')
    Image.fromarray((np.random.RandomState(0).rand(56, 28, 3) * 255).astype(np.uint8)).save(img)
    # the image as it is (no resize / crop): 56 x 28 px -> a 14 x 7 grid in stage 0
    cfg = _config(str(tmp_path), demo, 'asis', extra=(
        "test_dataloader = dict(dataset=dict(pipeline=[dict(type='LoadImageFromFile'), dict(type='PackInputs')]))"))
    vis = load_tool('vis_attention')
    out = str(tmp_path / 'vis')
    with _KernelInputs() as rec:
        assert vis.main([cfg, ckpt, img, '--query', '10', '50', '--out', out]) == 0
    assert osp.getsize(out + '.png') > 5000
    with open(out + '.csv') as f:
        rows = list(csv.DictReader(f))
    assert len({r['layer'] for r in rows}) == 6  # every layer, one panel each
    (mod, inp, _, _), = [c for c in rec.calls if c[1]['q'].shape[0] == 2 and c[0].num_heads == 1][1:2]
    # the query: pixel (10, 50) -> token (12, 2) -> shifted window 1 (rows 10..13, 0..2), its row 2 -> i = 16
    assert _grid_of_window(1, 2, 2, True) == (12, 2)
    a, _ = _poly3(inp, 1)
    row = a[1, 0, 2 * 7 + 2]
    want = {}
    for ty in range(7):
        for tx in range(7):
            y, x = _grid_of_window(1, ty, tx, True)
            if y in (10, 11, 12, 13):  # the query's region of the shifted window: rows 10..13, not 0..2
                want[(y, x)] = float(row[ty * 7 + tx])
    got = {(int(r['y']), int(r['x'])): float(r['weight']) for r in rows
           if r['layer'] == 'backbone.stages.0.blocks.1.attn'}
    assert set(got) == set(want)
    for key in want:
        assert got[key] == pytest.approx(want[key], rel=1e-4, abs=1e-9)


def _sample_calls(rec, image_index, layer_heads=1, groups=4):
    """The stage-0 block-0 kernel call (4 windows of 7 x 7 on the 14 x 14 grid) of each image, in order."""
    return [inp for m, inp, _, _ in rec.calls if inp['q'].shape[0] == groups and m.num_heads == layer_heads][::2]


def test_injectivity_and_locality_count_what_a_direct_computation_counts(trained, tmp_path):
    cfg, _, ckpt, _ = trained
    inj, loc = load_tool('analysis/injectivity'), load_tool('analysis/locality')
    thr = 3e-5  # poly3 rows of this tiny model are small: a threshold among their pair distances
    with _KernelInputs() as rec:
        assert inj.main([cfg, ckpt, '--num-images', '2', '--threshold', str(thr), '--query-threshold', '0.05',
                         '--layer', '0', '--out', str(tmp_path / 'inj')]) == 0
    calls = _sample_calls(rec, 2)
    assert len(calls) == 2
    with open(str(tmp_path / 'inj.csv')) as f:
        rows = list(csv.DictReader(f))
    assert {r['layer'] for r in rows} == {'backbone.stages.0.blocks.0.attn'}

    def count(a, q, t):
        n = 0
        for g in range(4):
            for i in range(49):
                for j in range(i + 1, 49):
                    n += bool((q[g, 0, i] - q[g, 0, j]).norm() >= 0.05 and (a[g, 0, i] - a[g, 0, j]).norm() < t)
        return n

    for img, inp in enumerate(calls):
        a, _ = _poly3(inp, 1)
        q = inp['q'].double()
        got = int(rows[img]['confusions'])
        # float32 (tool) against float64 (here) may flip a pair lying right at the threshold
        assert count(a, q, thr * (1 - 1e-4)) <= got <= count(a, q, thr * (1 + 1e-4))
        assert 0 < got < int(rows[img]['pairs'])
    assert osp.getsize(str(tmp_path / 'inj.png')) > 5000

    with _KernelInputs() as rec:
        assert loc.main([cfg, ckpt, '--num-images', '2', '--out', str(tmp_path / 'loc')]) == 0
    calls = _sample_calls(rec, 2)
    with open(str(tmp_path / 'loc.csv')) as f:
        rows = [r for r in csv.DictReader(f) if r['layer'] == 'backbone.stages.0.blocks.0.attn']
    for img, inp in enumerate(calls):
        a, _ = _poly3(inp, 1)
        mass = uni = 0.0
        for g in range(4):  # windows (0, 0), (0, 1), (1, 0), (1, 1), no shift, no padding
            for i in range(49):
                yi, xi = divmod(i, 7)
                near = [j for j in range(49) if abs(divmod(j, 7)[0] - yi) <= 1 and abs(divmod(j, 7)[1] - xi) <= 1]
                mass += float(a[g, 0, i, near].sum())
                uni += len(near) / 49
        assert float(rows[img]['mass_3x3']) == pytest.approx(mass / 196, rel=1e-4, abs=1e-9)
        assert float(rows[img]['uniform_3x3']) == pytest.approx(uni / 196, rel=1e-6)
    assert osp.getsize(str(tmp_path / 'loc.png')) > 5000


def test_attention_norms_tool_writes_what_a_direct_computation_gives(tmp_path):
    tool = load_tool('analysis/attention_norms')
    out = str(tmp_path / 'norms')
    assert tool.main(['--kernels', 'softmax', 'poly', 'efficient', '--sides', '3', '5', '--heads', '2',
                      '--head-dim', '4', '--batch', '2', '--seed', '7', '--out', out]) == 0
    assert osp.getsize(out + '.png') > 10000
    with open(out + '.csv') as f:
        rows = {(r['kernel'], int(r['n'])): r for r in csv.DictReader(f)}
    for side in (3, 5):
        n = side * side
        g = torch.Generator().manual_seed(7 + n)  # the tool's draw: q then k, N(0, 1), seeded seed + N
        q, k = torch.randn(2, 2, n, 4, generator=g), torch.randn(2, 2, n, 4, generator=g)
        s = (q @ k.transpose(-2, -1) / 2).double()
        a = torch.softmax(s, -1)
        jac = (a.pow(2).sum(-1) - 2 * a.pow(3).sum(-1) + a.pow(2).sum(-1) ** 2).sum(-1).sqrt()
        fro = a.pow(2).sum((-2, -1)).sqrt().mean()
        assert float(rows[('softmax', n)]['fro']) == pytest.approx(float(fro), rel=1e-5)
        assert float(rows[('softmax', n)]['jac']) == pytest.approx(float(jac.mean()), rel=1e-5)
        p = s ** 3 / math.sqrt(n)
        assert float(rows[('poly', n)]['fro']) == pytest.approx(float(p.pow(2).sum((-2, -1)).sqrt().mean()), rel=1e-5)
        assert rows[('efficient', n)]['jac'] == '' and 'no per-pair score map' in rows[('efficient', n)]['note']


def test_sweep_trains_once_per_kernel_and_tabulates_the_logs(demo, tmp_path):
    cfg = _config(str(tmp_path), demo, extra='train_cfg = dict(max_epochs=1, val_interval=1)\ncustom_hooks = []')
    sweep = load_tool('analysis/sweep')
    work = str(tmp_path / 'sweep')
    assert sweep.main([cfg, '--kernels', 'linear', 'soft', '--work-dir', work, '--in-process']) == 0
    with open(osp.join(work, 'sweep.csv')) as f:
        rows = {r['kernel']: r for r in csv.DictReader(f)}
    assert list(rows) == ['linear', 'soft']
    assert rows['soft']['status'] == 'failed' and 'soft' in rows['soft']['error']  # no mask: refused in windows
    for kernel in ('linear', ):
        r = rows[kernel]
        assert r['status'] == 'ok' and r['metric_name'] == 'accuracy/top1' and int(r['iters']) == 2
        import glob
        log, = glob.glob(osp.join(work, 'tiny', kernel, '*', 'vis_data', 'scalars.json'))
        with open(log) as f:
            recs = [json.loads(line) for line in f]
        assert float(r['metric']) == pytest.approx([x for x in recs if 'accuracy/top1' in x][-1]['accuracy/top1'])
        assert float(r['s_per_iter']) == pytest.approx([x['time'] for x in recs if 'loss' in x][1])  # after the 1st
        assert float(r['peak_mem_mib']) > 100
        with open(osp.join(work, 'tiny', kernel, f'tiny__{kernel}.py')) as f:
            assert f"type='{kernel}'" in f.read()
    table = open(osp.join(work, 'sweep.md')).read()
    assert '| tiny | linear |' in table and 'failed' in table
    assert osp.getsize(osp.join(work, 'sweep.png')) > 10000


TOOLS = ['vis_attention', 'analysis/attention_norms', 'analysis/injectivity', 'analysis/locality', 'analysis/sweep',
         'analysis/plot_attention_stats', 'analysis/hook_overhead']


@pytest.mark.parametrize('name', TOOLS)
def test_tools_answer_help(name, capsys):
    with pytest.raises(SystemExit) as e:
        load_tool(name).main(['--help'])
    assert e.value.code == 0 and 'usage' in capsys.readouterr().out


def test_tools_refuse_bad_input_with_one_line(trained, tmp_path, capsys):
    cfg, work, ckpt, _ = trained
    img = str(tmp_path / 'x.png')
    from PIL import Image
    Image.fromarray(np.zeros((40, 40, 3), np.uint8)).save(img)
    cases = [
        ('vis_attention', [cfg, ckpt, str(tmp_path / 'none.png')], 'image not found'),
        ('vis_attention', [cfg, str(tmp_path / 'x.pth'), img], 'checkpoint not found'),
        ('vis_attention', [str(tmp_path / 'no.py'), ckpt, img], 'config file not found'),
        ('vis_attention', [cfg, ckpt, img, '--layer', '99'], '--layer 99'),
        ('vis_attention', [cfg, ckpt, img, '--head', 'x'], '--head'),
        ('vis_attention', [cfg, ckpt, img, '--query', '500', '1'], 'outside'),
        ('vis_attention', [cfg, img, img], 'does not fit'),
        ('analysis/injectivity', [cfg, ckpt, '--split', 'dev'], '--split'),
        ('analysis/injectivity', [cfg, ckpt, '--threshold', '0'], '--threshold'),
        ('analysis/locality', [cfg, ckpt, '--num-images', '0'], '--num-images'),
        ('analysis/attention_norms', ['--kernels', 'softmaxx'], 'softmaxx'),
        ('analysis/attention_norms', ['--sides', '0'], '--sides'),
        ('analysis/sweep', [cfg, '--kernels', 'poly:degre=3'], 'degre'),
        ('analysis/sweep', [cfg, '--kernels', 'softmax', '--key', 'model.neck.attn_cfg'], '--key'),
        ('analysis/sweep', [cfg, '--kernels', 'softmax', '--cfg-options', 'nokey'], 'KEY=VALUE'),
        ('analysis/plot_attention_stats', [str(tmp_path / 'nowhere')], 'no such file'),
        ('analysis/hook_overhead', [cfg, '--batch', '0'], '--batch'),
        ('analysis/plot_attention_stats', [str(tmp_path)], 'attention_stats.json'),
    ]
    for name, argv, match in cases:
        one_line_error(capsys, name, argv, match)


def test_hook_overhead_csv_holds_the_printed_table(tmp_path, capsys):
    """--csv: the rows the docs' overhead table is made from are the printed table's, value for value."""
    import csv
    tool = load_tool('analysis/hook_overhead')
    path = tmp_path / 'overhead.csv'
    assert tool.main([DEMO_CFG, '--batch', '1', '--size', '32', '--repeats', '1', '--calls', '10', '--csv', str(path),
                      '--cfg-options', 'model.backbone.embed_dims=16', 'model.backbone.depths=[1,1,1,1]',
                      'model.backbone.num_heads=[1,2,2,4]', 'model.head.in_channels=128']) == 0
    printed = [line.strip('| ').split(' | ') for line in capsys.readouterr().out.splitlines()
               if line.startswith('| ') and not line.startswith('| measure')]
    rows = list(csv.DictReader(open(path)))
    assert [[r['measure'], f"{r['value']} {r['unit']}".strip()] for r in rows] == printed
    assert len(rows) == 6 and rows[-1] == dict(measure='forward pre-hooks left on the model', value='0', unit='')
