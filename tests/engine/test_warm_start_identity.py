"""The warm-start chain keeps, resumes or refuses a run by its identity (issue 63), driven as a user drives it:
tools/warm_start.py on the shipped XCiT-S12 x poly3 chain, its runs "trained" by a launch that writes their last
checkpoint by hand and records each process call (no training here).

Guards, one test per case of the issue: (1) a finished main job does not hide a changed recipe, length or stage
option upstream; (2) what changes a result but was not compared (data root, optimiser, weight decay, drop path, seed,
AMP, --auto-scale-lr, the config file's content) refuses a finished stage 2 and a stopped one; (3) the release cache is
content-addressed (two URLs of one file name, torch hub's cache not copied by name, a web page refused) and its hash
is computed once, not on every invocation; (4) a work dir made before identities is not resumed at another world
size, and stage 1 of transfer is kept for transfer-newhead. The property: any key of stage 2's resolved config changed
through --stage2-options on a finished chain refuses, naming that key, and runs nothing.
"""
import hashlib
import io
import os
import os.path as osp
import zipfile

import pytest
import torch

from softfree_mm.engine import chain_release, chain_run

from tests.helpers import ROOT, load_tool, main_as_command

CONFIG = osp.join(ROOT, 'configs', 'maskrcnn_xcit_s12_poly3.py')
URL = 'https://dl.fbaipublicfiles.com/xcit/xcit_small_12_p16_224.pth'
IMAGENET = ['--launcher', 'pytorch', '--gpus', '8']


@pytest.fixture
def tool(capsys, monkeypatch):
    """tools/warm_start.py's main() in this process, as its command line wraps it: (status, stdout, stderr)."""
    monkeypatch.chdir(ROOT)
    return main_as_command(load_tool('warm_start'), capsys)


def _one_error(err):
    lines = [ln for ln in err.strip().splitlines() if ln.startswith('error:')]
    assert len(lines) == 1, err
    return lines[0]


def _torch_file(path, value=0.0, size=4):
    torch.save({'state_dict': {'w': torch.full((size, ), value)}}, path)


# ------------------------------------------------------------------------------------------------- case 3
def _downloads(monkeypatch, files=None):
    """torch.hub's download, faked: each URL gives its own torch file (or ``files[url]``'s bytes); the calls."""
    calls = []

    def download(url, dst, progress=True):
        calls.append(url)
        if files and url in files:
            with open(dst, 'wb') as f:
                f.write(files[url])
        else:
            _torch_file(dst, float(len(calls)))
    monkeypatch.setattr(torch.hub, 'download_url_to_file', download)
    return calls


def test_two_urls_ending_in_the_same_file_name_are_two_files(tmp_path, monkeypatch):
    calls = _downloads(monkeypatch)
    a, b = 'https://huggingface.co/a/resolve/main/pytorch_model.bin', 'https://huggingface.co/b/resolve/main/' \
                                                                      'pytorch_model.bin'
    work_root = str(tmp_path / 'w')
    first, second = chain_release.fetch(a, work_root), chain_release.fetch(b, work_root)
    assert calls == [a, b] and first != second
    assert osp.basename(first) == osp.basename(second) == 'pytorch_model.bin'
    assert not torch.equal(torch.load(first)['state_dict']['w'], torch.load(second)['state_dict']['w'])
    assert chain_release.fetch(a, work_root) == first and calls == [a, b]  # each once


def test_a_file_of_the_same_name_in_torch_hubs_cache_is_not_taken(tmp_path, monkeypatch):
    hub = tmp_path / 'hub'
    (hub / 'checkpoints').mkdir(parents=True)
    _torch_file(hub / 'checkpoints' / 'xcit_small_12_p16_224.pth', 99.0)  # another file of that name
    monkeypatch.setattr(torch.hub, 'get_dir', lambda: str(hub))
    calls = _downloads(monkeypatch)
    local = chain_release.fetch(URL, str(tmp_path / 'w'))
    assert calls == [URL] and torch.load(local)['state_dict']['w'][0] == 1.0


def _zip(members):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, 'w') as z:
        for name in members:
            z.writestr(name, b'<html>')
    return buf.getvalue()


@pytest.mark.parametrize('page', [b'<!DOCTYPE html><html>Sign in</html>', _zip(['index.html', 'style.css'])],
                         ids=['html', 'zip-without-data.pkl'])
def test_a_download_that_is_no_torch_file_is_refused_and_not_kept(page, tmp_path, monkeypatch):
    """The injected bug's hole: a web page (or an archive of one) kept as the release."""
    from softfree_mm.engine.errors import UsageError
    _downloads(monkeypatch, {URL: page})
    with pytest.raises(UsageError, match=r'did not give a checkpoint file \(a web page came back\).*--release FILE'):
        chain_release.fetch(URL, str(tmp_path / 'w'))
    assert chain_release.local_release(URL, str(tmp_path / 'w')) is None
    left = [f for _, _, files in os.walk(tmp_path / 'w') for f in files]
    assert left == [], left


class _CountingSha256:
    """hashlib.sha256 that counts the hashes of at least ``size`` bytes (a release's content, not a URL's or a
    record's)."""

    def __init__(self, real, size, seen):
        self.real, self.size, self.seen = real, size, seen

    def __call__(self, data=b'', **kw):
        counter = self

        class H:
            def __init__(self):
                self.h, self.n = counter.real(data, **kw), len(data)

            def update(self, b):
                self.n += len(b)
                self.h.update(b)

            def hexdigest(self):
                if self.n >= counter.size:
                    counter.seen.append(self.n)
                return self.h.hexdigest()

            def digest(self):
                return self.h.digest()
        return H()


def test_the_releases_hash_is_computed_once_not_on_every_invocation_or_dry_run(tmp_path, monkeypatch, tool):
    from softfree_mm.engine import chain
    size = 4 << 20
    release = tmp_path / 'rel.pth'
    _torch_file(release, 1.0, size // 4)
    payload = release.read_bytes()
    _downloads(monkeypatch, {URL: payload})
    seen = []
    monkeypatch.setattr(hashlib, 'sha256', _CountingSha256(hashlib.sha256, size, seen))
    monkeypatch.setattr(chain, 'check_release', lambda cfg: None)  # the fake release holds no XCiT
    work_root = str(tmp_path / 'w')
    chain_release.fetch(URL, work_root)
    for _ in range(3):
        status, out, err = tool(CONFIG, '--dry-run', '--work-root', work_root, *IMAGENET)
        assert status == 0 and '(downloaded: ' in out, err
    assert len(seen) <= 1, seen
