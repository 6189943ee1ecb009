"""The warm-start chain knows what each of its runs is (softfree_mm/engine/chain_run.py, chain_identity.py,
chain_release.py; issues 48 and 63), on the shipped XCiT-S12 x poly3 chain with fake tiny checkpoints written here.

Guards: decided from the end (a done stage 2 leaves stage 1 and the release alone); a work dir of another start,
recipe, release or length is one line naming the resolved keys that differ (old -> new), also when it would be
resumed; a launch of another batch is one line naming both and the choices, and --batch-scale linear / keep is what
the runs get and what their records hold; the release is fetched once into the work root and every run reads that
file, no network is one line naming --release FILE; no checkpoint is unpickled to read a state; transfer-newhead with
--release is no traceback; a work dir made before run identities is adopted when its saved config and its logged
world size are this run's; a second invocation stops with one line (--wait waits); each recipe gives each stage the
config it defines, read as tools/train.py reads its command line. The issue-63 cases are
tests/engine/test_warm_start_identity.py.
"""
import json
import os
import os.path as osp
import re
import subprocess
import sys
import threading
import urllib.error

import pytest
import torch

from softfree_mm.engine import chain_release, chain_report, chain_run
from softfree_mm.engine import run_identity as identity
from softfree_mm.engine import warm_start as ws
from softfree_mm.engine.errors import UsageError

from tests.helpers import ROOT, load_tool, main_as_command
from tests.helpers.stages import stages_as_run

CONFIG = osp.join(ROOT, 'configs', 'maskrcnn_xcit_s12_poly3.py')
URL = 'https://dl.fbaipublicfiles.com/xcit/xcit_small_12_p16_224.pth'
IMAGENET = ['--launcher', 'pytorch', '--gpus', '8']


def _request(tmp_path, **kw):
    kw = dict(dict(launcher='pytorch', gpus=8), **kw)
    return chain_run.Request(CONFIG, str(tmp_path / 'w'), **kw)


def _release(tmp_path, content=b'PK fake release'):
    path = tmp_path / 'xcit_small_12_p16_224.pth'
    path.write_bytes(content)
    return str(path)


def _write_run(p, i, at=None, fp=None, payload=None):
    """Run ``i`` of the plan on disk: a checkpoint at ``at`` (default: its end) and its run_identity.json (``fp``: the
    record, default the plan's; False: none, as a run made before identities)."""
    r = p.runs[i]
    unit, end = chain_run.target(p.cfgs[i])
    os.makedirs(r.work_dir, exist_ok=True)
    path = osp.join(r.work_dir, f'{unit}_{at or end}.pth')
    torch.save(payload if payload is not None else {'meta': {unit: at or end}, 'state_dict': {}}, path)
    with open(osp.join(r.work_dir, 'last_checkpoint'), 'w') as f:
        f.write(path)
    if fp is not False:
        identity.write(r.work_dir, fp or p.records[i])
    return path


def _log(work_dir, world_size):
    """The log mmengine writes when a run starts, as far as the chain reads it (its world size)."""
    log = osp.join(work_dir, '20240101_120000', '20240101_120000.log')
    os.makedirs(osp.dirname(log), exist_ok=True)
    with open(log, 'w') as f:
        f.write(f'Runtime environment:\n    Distributed launcher: pytorch\n    GPU number: {world_size}\n')


def _fake_launch(p, ran):
    """A launch that records the command and leaves the run done, as tools/train.py would."""
    def launch(cmd, env, keep_fds=()):
        work_dir = cmd[cmd.index('--work-dir') + 1]
        i = next(i for i, r in enumerate(p.runs) if r.work_dir == work_dir)
        ran.append((p.runs[i].name, cmd))
        _write_run(p, i, fp=False)
        return 0
    return launch


@pytest.fixture
def tool(capsys, monkeypatch):
    """tools/warm_start.py's main() in this process, as its command line wraps it: (status, stdout, stderr)."""
    monkeypatch.chdir(ROOT)
    return main_as_command(load_tool('warm_start'), capsys)


def _one_error(err):
    lines = [ln for ln in err.strip().splitlines() if ln.startswith('error:')]
    assert len(lines) == 1, err
    return lines[0]


# ------------------------------------------------------------------------------------------------- case 1
def test_a_done_stage_2_leaves_stage_1_and_the_release_alone(tmp_path, monkeypatch):
    """Stage 2 done, stage 1's work dir deleted: only the main job runs, and the release is neither checked nor
    fetched (its URL cannot be reached here)."""
    p = chain_run.plan(_request(tmp_path), ROOT)
    _write_run(p, 1)
    pr = chain_run.probe(p)
    assert pr.first == 2 and pr.states[0] is None
    monkeypatch.setattr(torch.hub, 'download_url_to_file', lambda *a, **k: pytest.fail('the release was fetched'))
    assert chain_run.release_for(p, pr, fetch_it=True) is None
    ran = []
    assert chain_run.execute(p, pr, launch=_fake_launch(p, ran), say=lambda *a, **k: None) == 0
    assert [name for name, _ in ran] == ['maskrcnn_xcit_s12_poly3']
    assert not osp.exists(p.runs[0].work_dir) and not osp.exists(tmp_path / 'w' / 'releases')
    assert identity.read(p.runs[2].work_dir)['record'] == p.records[2]


def test_the_dry_run_says_stage_1_is_not_needed_after_a_done_stage_2(tmp_path, tool):
    p = chain_run.plan(_request(tmp_path), ROOT)
    _write_run(p, 1)
    status, out, err = tool(CONFIG, '--dry-run', '--work-root', str(tmp_path / 'w'), *IMAGENET)
    assert status == 0, err
    assert 'not needed: stage 2 (fine-tune) is done' in out and 'the main job' in out and 'not started' in out


# ------------------------------------------------------------------------------------------------- case 2
def test_a_main_job_started_from_the_swapped_release_is_refused_by_name(tmp_path, tool):
    """A detector made before run identities in the main job's work dir that started from the softmax release with
    the kernel swapped (tools/train.py's other start) is not the chain's main job: one line, whichever state it is
    in."""
    from mmengine.config import Config
    cfg = Config.fromfile(CONFIG)
    cfg.merge_from_dict({'model.backbone.init_cfg.checkpoint': cfg.softmax_release})
    p = chain_run.plan(_request(tmp_path), ROOT)
    _write_run(p, 2, fp=False, payload={'meta': {'epoch': 36, 'cfg': cfg.pretty_text}, 'state_dict': {}})
    status, out, err = tool(CONFIG, '--dry-run', '--work-root', str(tmp_path / 'w'), *IMAGENET)
    assert status == 2 and out == '', out
    run = identity.identity(p.records[1])[:16]
    assert _one_error(err) == (
        f"error: {p.runs[2].work_dir} holds another run than this command's main job: "
        f'model.backbone.init_cfg.checkpoint: {osp.basename(cfg.softmax_release)} -> stage 2 (fine-tune) run '
        f'{run} (adopted from the config epoch_36.pth saved): give the chain another --work-root, or move that folder '
        'away')


@pytest.mark.parametrize('change,named', [
    (['--recipe', 'transfer-final'], "stage 1 (transfer)'s model.loss: blocks -> blocks+final"),
    (['--release', 'OTHER'], 'model.head.init_cfg.checkpoint: xcit_small_12_p16_224.pth (sha256 '),
])
def test_stages_of_another_recipe_or_release_are_refused(change, named, tmp_path, tool):
    """Both stages done with the default recipe and one release: another --recipe or another --release is not their
    chain (the old tool marked every stage done and ran nothing)."""
    release = _release(tmp_path)
    p = chain_run.plan(_request(tmp_path, release=release), ROOT)
    _write_run(p, 0)
    _write_run(p, 1)
    other = tmp_path / 'other'
    other.mkdir()
    change = [str(_release(other, b'PK another')) if c == 'OTHER' else c for c in change]
    args = ['--release', release, *change] if change[0] != '--release' else change
    status, out, err = tool(CONFIG, '--dry-run', '--work-root', str(tmp_path / 'w'), *IMAGENET, *args)
    line = _one_error(err)
    assert status == 2 and f"{p.runs[1].work_dir} holds another run than this command's stage 2" in line, line
    assert named in line and 'another --work-root' in line, line


# ------------------------------------------------------------------------------------------------- case 3
def test_a_resume_with_another_length_is_refused_not_run_at_the_old_schedule(tmp_path, tool):
    """Stage 1 begun with --iters 3000 and stopped: the same command without --iters is refused by name (mmengine
    would restore the old schedule and run the rest at its floor lr)."""
    p = chain_run.plan(_request(tmp_path, iters=3000), ROOT)
    _write_run(p, 0, at=500)
    status, out, err = tool(CONFIG, '--dry-run', '--work-root', str(tmp_path / 'w'), *IMAGENET)
    line = _one_error(err)
    assert status == 2 and 'train_cfg.max_iters: 1000 -> 12510' in line, line
    status, out, err = tool(CONFIG, '--dry-run', '--work-root', str(tmp_path / 'w'), *IMAGENET, '--iters', '3000')
    assert status == 0 and 'stopped at iter 500 of 1000: resumes from' in out, err


# ------------------------------------------------------------------------------------------------- case 4
def test_a_launch_of_another_batch_is_one_line_naming_both_and_the_choices(tmp_path, tool):
    status, out, err = tool(CONFIG, '--dry-run', '--work-root', str(tmp_path / 'w'))
    assert status == 2 and out == ''
    assert _one_error(err) == (
        'error: transfer_xcit_s12_poly3 would run 1 x 128 = 128 images a step, the transfer recipe at the imagenet '
        'scale counts its lr and iterations for 1024: launch 8 processes (--launcher pytorch --gpus 8, or slurm with '
        '--gpus x --nnodes = 8), or choose --batch-scale linear (lr x 128/1024, iterations x 1024/128) or '
        "--batch-scale keep (the recipe's lr and iterations as they are)")


def test_the_docs_first_command_on_one_process_stops_in_one_line_before_anything_starts(tmp_path):
    """As a user types it (a process): exit status 2, the one line on stderr, nothing on stdout or on disk."""
    proc = subprocess.run([sys.executable, osp.join(ROOT, 'tools', 'warm_start.py'), 'configs/maskrcnn_xcit_s12_poly3.py',
                           '--work-root', str(tmp_path / 'w')], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 2 and proc.stdout == '', proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stderr.startswith('error: transfer_xcit_s12_poly3 would run 1 x 128 = 128 images a step') and \
        proc.stderr.strip().count('\n') == 0, proc.stderr
    assert not (tmp_path / 'w').exists()


def test_batch_scale_linear_rescales_lr_and_iterations_and_both_rules_are_recorded(tmp_path):
    keep = chain_run.plan(_request(tmp_path, launcher='none', batch_scale='keep'), ROOT)
    linear = chain_run.plan(_request(tmp_path, launcher='none', batch_scale='linear'), ROOT)
    for p in (keep, linear):
        assert [r['world_size'] for r in p.records] == [1] * 3 and p.records[0]['batch_per_gpu'] == 128
    # each rule's stages are other runs, and so is the main job that starts from them
    assert all(identity.identity(a) != identity.identity(b) for a, b in zip(keep.records, linear.records))
    keys = [k for k, _, _ in identity.differences(keep.records[2], linear.records[2],
                                                  ['stage 2 (fine-tune)', 'stage 1 (transfer)'])]
    assert "stage 1 (transfer)'s optim_wrapper.optimizer.lr" in keys and \
        "stage 2 (fine-tune)'s optim_wrapper.optimizer.lr" in keys and "stage 2 (fine-tune)'s train_cfg.max_iters" in keys
    k1, l1 = keep.cfgs[0], linear.cfgs[0]
    assert k1.train_cfg.max_iters == 12510 and k1.optim_wrapper.optimizer.lr == pytest.approx(3e-3)
    assert l1.train_cfg.max_iters == 8 * 12510 and l1.optim_wrapper.optimizer.lr == pytest.approx(3e-3 / 8)
    assert linear.cfgs[1].train_cfg.max_iters == 8 * 25020
    assert linear.cfgs[1].optim_wrapper.optimizer.lr == pytest.approx(1e-4 / 8)
    assert linear.cfgs[2].train_cfg == keep.cfgs[2].train_cfg  # the main job keeps mmdet's own convention
    chain_run.check_launch(linear, chain_run.probe(linear))  # chosen: no refusal


# ------------------------------------------------------------------------------------------------- case 5
def test_the_release_is_fetched_once_into_the_work_root_and_every_run_reads_that_file(tmp_path, monkeypatch):
    calls = []

    def download(url, dst, progress=True):
        calls.append(url)
        torch.save({'state_dict': {}}, dst)
    monkeypatch.setattr(torch.hub, 'download_url_to_file', download)
    work_root = str(tmp_path / 'w')
    local = chain_release.fetch(URL, work_root)
    assert local == chain_release.release_path(URL, work_root) and calls == [URL]
    assert osp.dirname(osp.dirname(local)) == osp.join(work_root, 'releases')
    assert osp.basename(local) == 'xcit_small_12_p16_224.pth'
    assert chain_release.fetch(URL, work_root) == local and calls == [URL]  # once
    p = chain_run.plan(_request(tmp_path), ROOT)
    stage1, _ = chain_run.command(p, 0, False, local)
    stage2, _ = chain_run.command(p, 1, False, local)
    assert f'model.teacher.init_cfg.checkpoint={local}' in stage1
    assert f'model.head.init_cfg.checkpoint={local}' in stage2
    teacher = identity.start_at(p.records[0], 'model.teacher.init_cfg.checkpoint')
    assert teacher == identity.release_start('xcit_small_12_p16_224.pth', identity.sha256_of(local))  # here now


def test_no_network_is_one_line_naming_release_file(tmp_path, monkeypatch, tool):
    def offline(*a, **k):
        raise urllib.error.URLError('[Errno -3] Temporary failure in name resolution')
    monkeypatch.setattr(torch.hub, 'download_url_to_file', offline)
    status, out, err = tool(CONFIG, '--work-root', str(tmp_path / 'w'), *IMAGENET)
    line = _one_error(err)
    assert status == 2 and f'the release {URL} could not be downloaded here' in line, line
    assert 'pass --release FILE' in line and osp.join(str(tmp_path / 'w'), 'releases') in line, line
    assert not osp.exists(tmp_path / 'w' / 'transfer_xcit_s12_poly3')  # nothing ran


# ------------------------------------------------------------------------------------------------- case 6
class _Trap:
    """A pickled object whose loading would write a file: it must never be unpickled."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, 'w'))


@pytest.mark.parametrize('identified', [True, False])
def test_states_are_read_without_unpickling(identified, tmp_path, tool):
    marker = tmp_path / 'unpickled'
    p = chain_run.plan(_request(tmp_path), ROOT)
    _write_run(p, 1, fp=None if identified else False,
               payload={'meta': {'iter': 25020, 'trap': _Trap(str(marker))}, 'state_dict': {}})
    status, out, err = tool(CONFIG, '--dry-run', '--work-root', str(tmp_path / 'w'), *IMAGENET)
    assert not marker.exists()
    if identified:  # its state from its run_identity.json and the file's name
        assert status == 0 and f'done: {p.runs[1].work_dir}' in out, err
    else:  # weights-only reading refuses the file: it cannot be adopted, and says so
        assert status == 2 and 'which says nothing of what made it' in _one_error(err)


# ------------------------------------------------------------------------------------------------- case 7
def test_transfer_newhead_with_a_release_is_no_traceback(tmp_path, tool):
    release = str(tmp_path / 'not_here_yet.pth')
    status, out, err = tool(CONFIG, '--dry-run', '--work-root', str(tmp_path / 'w'), *IMAGENET,
                            '--recipe', 'transfer-newhead', '--release', release)
    assert status == 0, err
    assert 'recipe transfer-newhead' in out and f'reads {release} (missing)' in out


# ---------------------------------------------------------------------------------------- the adoption rule
def test_a_work_dir_made_before_identities_is_adopted_when_its_saved_config_and_world_size_are_this_runs(tmp_path):
    p = chain_run.plan(_request(tmp_path), ROOT)
    _write_run(p, 1, fp=False, payload={'meta': {'iter': 25020, 'cfg': p.cfgs[1].pretty_text}, 'state_dict': {}})
    _log(p.runs[1].work_dir, 8)
    pr = chain_run.probe(p)
    assert pr.first == 2 and pr.states[1].adopted == 'iter_25020.pth'
    ran = []
    chain_run.execute(p, pr, launch=_fake_launch(p, ran), say=lambda *a, **k: None)
    written = identity.read(p.runs[1].work_dir)  # adopted once: the next probe reads the JSON
    assert written['adopted_from'] == 'iter_25020.pth' and written['record'] == p.records[1]
    assert [name for name, _ in ran] == ['maskrcnn_xcit_s12_poly3']


@pytest.mark.parametrize('world_size', [8, 4])
def test_a_work_dir_with_the_old_fingerprint_is_adopted_at_the_world_size_it_names(world_size, tmp_path):
    """warm_start_run.json (the chain's file before run identities) names the world size where no log is left."""
    p = chain_run.plan(_request(tmp_path), ROOT)
    _write_run(p, 1, at=100, fp=False, payload={'meta': {'iter': 100, 'cfg': p.cfgs[1].pretty_text}})
    with open(osp.join(p.runs[1].work_dir, 'warm_start_run.json'), 'w') as f:
        json.dump({'version': 1, 'world_size': world_size, 'recipe': 'transfer'}, f)
    if world_size == 8:
        pr = chain_run.probe(p)
        assert pr.first == 1 and pr.states[1].state == 'partial' and pr.states[1].adopted == 'iter_100.pth'
    else:
        with pytest.raises(UsageError, match=r': world_size: 4 -> 8 \(adopted from the config iter_100.pth saved\)'):
            chain_run.probe(p)


def test_other_libraries_are_shown_beside_a_resume_and_a_refusal_never_a_reason(tmp_path):
    p = chain_run.plan(_request(tmp_path), ROOT)
    _write_run(p, 1, at=100)
    held = identity.read(p.runs[1].work_dir)
    now = held['versions']['torch']
    held['versions']['torch'] = '1.0.0'
    with open(osp.join(p.runs[1].work_dir, identity.FILE), 'w') as f:
        json.dump(held, f)
    pr = chain_run.probe(p)
    assert pr.first == 1  # resumed all the same
    assert f'resumes from {p.runs[1].work_dir}/iter_100.pth (made with other libraries, then -> now: torch 1.0.0 -> ' \
           f'{now})' in '\n'.join(chain_report.report(p, pr))
    other = chain_run.plan(_request(tmp_path, iters=3000), ROOT)
    with pytest.raises(UsageError, match=re.escape(f'(its run_identity.json; its libraries then -> now: torch 1.0.0 -> '
                                                   f'{now}')):
        chain_run.probe(other)


def test_a_work_dir_made_before_identities_of_another_length_is_refused_by_name(tmp_path):
    p = chain_run.plan(_request(tmp_path), ROOT)
    other = chain_run.plan(_request(tmp_path, iters=3000), ROOT)
    _write_run(p, 1, at=100, fp=False, payload={'meta': {'iter': 100, 'cfg': other.cfgs[1].pretty_text}})
    with pytest.raises(UsageError, match=r"holds another run than this command's stage 2 \(fine-tune\): .*"
                                         r'train_cfg.max_iters: 2000 -> 25020 \(adopted from the config iter_100.pth'):
        chain_run.probe(p)


# ------------------------------------------------------------------------------------------------ the lock
def test_a_second_invocation_of_the_chain_stops_with_one_line_or_waits(tmp_path, tool, monkeypatch):
    p = chain_run.plan(_request(tmp_path), ROOT)
    _write_run(p, 0)
    _write_run(p, 1)
    args = (CONFIG, '--work-root', str(tmp_path / 'w'), *IMAGENET)
    held, free = threading.Event(), threading.Event()

    def first():
        with chain_release.chain_lock(str(tmp_path / 'w'), p.runs[0].name, say=lambda s: None):
            held.set()
            free.wait(30)
    holder = threading.Thread(target=first)
    holder.start()
    held.wait(30)
    ran = []
    monkeypatch.setattr(chain_run, '_launch', _fake_launch(p, ran))
    status, out, err = tool(*args)
    line = _one_error(err)
    assert status == 2 and 'this chain is running already (pid' in line and 'add --wait' in line, line
    assert ran == []
    threading.Timer(1.0, free.set).start()  # the tool plans in well under a second, then waits
    status, out, err = tool(*args, '--wait')
    holder.join(30)
    assert status == 0 and 'waiting for it to end' in out, err
    assert [name for name, _ in ran] == ['maskrcnn_xcit_s12_poly3']


# ------------------------------------------------------------------- test hole: the recipe each stage gets
@pytest.mark.parametrize('name', ['transfer-final', 'transfer-newhead'])
def test_each_recipe_gives_each_stage_the_config_it_defines_as_the_run_reads_it(name, tmp_path):
    """Through the commands the chain starts, parsed by tools/train.py and merged as its run merges them."""
    release = str(tmp_path / 'release.pth')
    p = chain_run.plan(_request(tmp_path, launcher='none', recipe=name, release=release), ROOT)
    recipe = ws.RECIPES[name]
    s1, s2 = stages_as_run(p, release, ws.stage_settings(recipe, ws.SCALES['imagenet']))
    assert (s1.model.loss, list(s1.model.train)) == (recipe.loss, list(recipe.groups))
    assert s1.model.teacher.init_cfg.checkpoint == release
    if recipe.head == 'new':
        assert s2.model.head.init_cfg is None
    else:
        assert (s2.model.head.init_cfg.type, s2.model.head.init_cfg.checkpoint) == ('ReleaseHead', release)
    assert s2.model.backbone.init_cfg.checkpoint == p.runs[0].work_dir
