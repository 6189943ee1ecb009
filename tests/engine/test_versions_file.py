"""versions.json (softfree_mm/engine/versions.py): every Runner the tools build writes the libraries it runs with into
its work dir (rank 0 only), keeping the other sets its earlier runs there recorded; a study's results folder gets one
beside its CSVs with the sets of the folders whose rows it keeps (each study's report writes one:
tests/analysis/test_analysis_grid_identity.py)."""
import json

import torch
from mmengine.config import Config
from mmengine.model import BaseModel
from mmengine.registry import MODELS

from softfree_mm.engine import runner as runner_mod
from softfree_mm.engine import versions as v

KEYS = {'torch', 'torchvision', 'mmengine', 'mmcv', 'mmdet', 'mmseg', 'mmpretrain', 'timm', 'numpy', 'opencv',
        'softfree_mm', 'softfree_mm_commit'}


@MODELS.register_module(name='VersionsFileToy', force=True)
class _Toy(BaseModel):

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))

    def forward(self, *args, mode='tensor', **kwargs):
        return self.w


def _cfg(work_dir):
    return Config(dict(model=dict(type='VersionsFileToy'), work_dir=str(work_dir), default_scope=None,
                       env_cfg=dict(dist_cfg=dict(backend='gloo')), log_level='WARNING'))


def test_the_runner_the_tools_build_writes_versions_json_into_its_work_dir(tmp_path):
    (tmp_path / 'work').mkdir()
    earlier = dict(v.versions(), torch='2.1.0', softfree_mm_commit='0' * 40)
    (tmp_path / 'work' / v.FILE).write_text(json.dumps(earlier))  # a run there before, on another torch
    runner_mod.build_runner(_cfg(tmp_path / 'work'))
    data = json.loads((tmp_path / 'work' / v.FILE).read_text())
    assert KEYS <= set(data) and {k: data[k] for k in KEYS} == v.versions()
    assert data['torch'] == torch.__version__.split('+')[0] or data['torch'] == torch.__version__
    assert data['earlier'] == [earlier]


def test_only_rank_0_writes_it(tmp_path, monkeypatch):
    from mmengine.runner import Runner

    class Rank1:
        rank, work_dir = 1, str(tmp_path)

    monkeypatch.setattr(Runner, 'from_cfg', classmethod(lambda cls, cfg: Rank1()))
    runner_mod.build_runner(_cfg(tmp_path))
    assert not (tmp_path / v.FILE).exists()
    Rank1.rank = 0
    runner_mod.build_runner(_cfg(tmp_path))
    assert (tmp_path / v.FILE).is_file()


def test_a_results_folder_keeps_the_sets_of_the_folders_its_rows_come_from_once(tmp_path):
    now = v.versions()
    kept_a, kept_b = tmp_path / 'a', tmp_path / 'b'
    kept_a.mkdir()
    kept_b.mkdir()
    old = dict(now, numpy='1.26.4')
    (kept_a / v.FILE).write_text(json.dumps(dict(now, softfree_mm_commit='f' * 40, earlier=[old])))
    (kept_b / v.FILE).write_text(json.dumps(old))
    path = v.write_versions(str(tmp_path / 'out'), [str(kept_a), str(kept_b), str(tmp_path / 'none')])
    data = json.loads(open(path).read())
    # kept_a's own set differs by the commit only: not kept; the numpy 1.26 set once, though both folders name it
    assert data['earlier'] == [old] and {k: data[k] for k in KEYS} == now
    assert sorted(p.name for p in (tmp_path / 'out').iterdir()) == [v.FILE]  # no temporary file left
    v.write_versions(str(tmp_path / 'out'))
    assert 'earlier' not in json.loads(open(path).read())
