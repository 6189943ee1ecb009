"""Two nodes on localhost: tools/warm_start.py --launcher pytorch started once per node rank (NNODES=2, NODE_RANK 0
and 1, each its own process group, as two machines would each run it), every run through tools/dist_train.sh across
both node ranks (torchrun, one process each, gloo).

Guard: node 1 follows node 0's decision, never its own look at the work dirs. Node 1 is started first, on a work root
without stage 1 (as a node whose shared file system still serves an older view would see it); stage 1 then appears
and node 0 is started: node 0 decides that stage 2 runs, node 1 runs stage 2 with it (its own probe would have started
stage 1 and left the two node ranks at different rendezvous), and the chain ends on both with stage 2 done.
"""
import os
import os.path as osp
import shutil
import signal
import socket
import subprocess
import sys
import time

from tests.cluster.conftest import (CLASSIFIER, STAGE1, STAGE2, STAGE2_OPTIONS, STAGE_OPTIONS, TOOL, keep_stage1,
                                    seed_stage1)


def _free_port_pair():
    for _ in range(50):
        with socket.socket() as a, socket.socket() as b:
            a.bind(('127.0.0.1', 0))
            port = a.getsockname()[1]
            try:
                b.bind(('127.0.0.1', port + 1))
            except OSError:
                continue
            return port
    raise RuntimeError('no two free neighbouring ports')


def _stage1_at_world_size_2(release, where):
    """A done stage 1 at 2 processes: the Slurm test's when it ran, else one made here on one node (2 processes)."""
    if seed_stage1(str(where)):
        return
    cmd = [sys.executable, TOOL, CLASSIFIER, '--work-root', str(where), '--release', release, '--launcher', 'pytorch',
           '--gpus', '2', *STAGE_OPTIONS, '--stage2-options', *STAGE2_OPTIONS]
    proc = subprocess.run(cmd, cwd=str(where.parent), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    shutil.rmtree(where / STAGE2)
    keep_stage1(str(where))


def test_node_1_follows_node_0s_decision_where_its_own_view_disagrees(release, tmp_path):
    seed = tmp_path / 'seed'
    _stage1_at_world_size_2(release, seed)
    root = tmp_path / 'w'
    port = _free_port_pair()
    cmd = [sys.executable, TOOL, CLASSIFIER, '--work-root', str(root), '--release', release, '--launcher', 'pytorch',
           '--gpus', '1', *STAGE_OPTIONS, '--stage2-options', *STAGE2_OPTIONS]
    procs, logs = [], []

    def start(rank):
        env = dict(os.environ, NNODES='2', NODE_RANK=str(rank), MASTER_ADDR='127.0.0.1', PORT=str(port))
        logs.append(open(tmp_path / f'node{rank}.log', 'w'))
        procs.append(subprocess.Popen(cmd, cwd=str(tmp_path), env=env, stdout=logs[-1], stderr=subprocess.STDOUT,
                                      start_new_session=True))

    def text(rank):
        return (tmp_path / f'node{rank}.log').read_text()

    try:
        start(1)  # node 1 first: stage 1 is not in the work root yet
        deadline = time.time() + 300
        while '[warm-start]' not in text(1):
            assert procs[0].poll() is None and time.time() < deadline, text(1)[-3000:]
            time.sleep(0.2)
        assert not (root / STAGE1).exists()
        shutil.copytree(seed / STAGE1, root / STAGE1)
        with open(root / STAGE1 / 'last_checkpoint', 'w') as f:
            f.write(str(root / STAGE1 / 'iter_2.pth'))
        stage1_files = sorted(os.listdir(root / STAGE1))
        start(0)
        status = [p.wait(400) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(60)
        for f in logs:
            f.close()
    node1, node0 = text(1), text(0)
    assert status == [0, 0], node0[-3000:] + '\n----- node 1 -----\n' + node1[-3000:]
    assert "node 1 of 2: follows node 0's decision" in node1 and f'runs from {STAGE2}' in node1, node1[-3000:]
    for out in (node0, node1):  # both ran stage 2 across the two node ranks, neither ran stage 1
        assert f'[warm-start] 2/2 {STAGE2}: bash ' in out and f'[warm-start] 1/2 {STAGE1}: bash ' not in out
        assert out.count('[softfree_mm] no CUDA: distributed backend gloo') == 1
    assert 'every run of the chain is done' in node0 and 'every run of the chain is done' in node1
    assert sorted(os.listdir(root / STAGE1)) == stage1_files
    assert (root / STAGE2 / 'iter_4.pth').exists()
    assert osp.isfile(root / f'warm_start_{STAGE1}.nodes.json')
    assert '"world_size": 2' in (root / STAGE2 / 'run_identity.json').read_text()


def test_a_refusal_on_node_0_stops_node_1_with_node_0s_line(tmp_path):
    """Node 0 refuses the launch (2 x 32 images a step against the digits scale's 32): node 1, waiting at the
    barrier, stops at once with node 0's line instead of waiting for a decision that never comes."""
    port = _free_port_pair()
    cmd = [sys.executable, TOOL, CLASSIFIER, '--work-root', str(tmp_path / 'w'), '--launcher', 'pytorch', '--gpus', '1',
           '--iters', '6', '--train-args', '--device cpu']
    procs = []
    for rank in (1, 0):
        env = dict(os.environ, NNODES='2', NODE_RANK=str(rank), MASTER_ADDR='127.0.0.1', PORT=str(port))
        procs.append(subprocess.Popen(cmd, cwd=str(tmp_path), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, start_new_session=True))
    try:
        (out1, err1), (out0, err0) = (p.communicate(timeout=300) for p in procs)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    refusal = f'{STAGE1} would run 2 x 32 = 64 images a step'
    assert procs[1].returncode == 2 and err0.strip().startswith(f'error: {refusal}'), err0[-2000:]
    assert procs[0].returncode == 2, out1[-2000:] + err1[-2000:]
    assert err1.strip().splitlines() == [f'error: node 0 stopped before any run: {err0.strip()[len("error: "):]}'], err1
    assert not (tmp_path / 'w' / STAGE1).exists()
