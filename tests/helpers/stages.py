"""A warm-start plan's two stages as their runs read them: the commands the chain starts, parsed by tools/train.py and
merged as its run merges them (the ImageNet route's and the task route's recipe tests share it)."""
import pytest

from tests.helpers import load_tool


def stages_as_run(p, release, want) -> list:
    """Stage 1's and stage 2's configs of plan ``p`` (``release``: the file the chain fetched), each checked against
    ``want`` (``warm_start.stage_settings``): its lr, the floor of its cosine, its iterations."""
    from mmengine.config import Config

    from softfree_mm.engine import chain_run
    train = load_tool('train')
    out = []
    for i, stage in enumerate(('stage1', 'stage2')):
        cmd, _ = chain_run.command(p, i, False, release)
        args = train.parse_args(cmd[2:])
        cfg = Config.fromfile(args.config)
        cfg.merge_from_dict(args.cfg_options)
        assert cfg.optim_wrapper.optimizer.lr == pytest.approx(want[stage]['optim_wrapper']['optimizer']['lr'])
        assert cfg.param_scheduler[1].eta_min == pytest.approx(want[stage]['param_scheduler'][1]['eta_min'])
        assert cfg.train_cfg.max_iters == want[stage]['train_cfg']['max_iters']
        out.append(cfg)
    return out
