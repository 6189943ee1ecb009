"""softfree_mm/files.py: the one download of a checkpoint (a release for the chain, a backbone's init checkpoint)
checked to be a torch file, and the one atomic JSON write (run identities, hash sidecars, versions.json)."""
import io
import json
import os
import zipfile

import pytest
import torch

from softfree_mm import files


def _zip_page(path):
    """An archive that is no torch file (a zipped web page: the two bytes 'PK' alone passed the old check)."""
    with zipfile.ZipFile(path, 'w') as z:
        z.writestr('index.html', '<html>quota exceeded</html>')


def test_a_backbones_release_url_that_gives_no_torch_file_is_refused_and_leaves_nothing(tmp_path, monkeypatch):
    from softfree_mm.models.converters import fetch_release
    monkeypatch.setattr(torch.hub, 'get_dir', lambda: str(tmp_path / 'hub'))
    got = {}

    def download(url, dst, progress=True):
        got['dst'] = dst
        if url.endswith('page.pth'):
            _zip_page(dst)
        else:
            torch.save({'w': torch.ones(2)}, dst)
    monkeypatch.setattr(torch.hub, 'download_url_to_file', download)
    with pytest.raises(ValueError, match='did not give a checkpoint file'):
        fetch_release('https://example.org/page.pth')
    cache = tmp_path / 'hub' / 'checkpoints'
    assert os.listdir(cache) == []  # neither the page nor a temporary file
    path = fetch_release('https://example.org/model.pth')
    assert torch.load(path)['w'].sum() == 2 and os.listdir(cache) == ['model.pth']
    assert files.TMP_MARK in got['dst']  # written under a temporary name first


def test_torch_files_are_told_from_pages_and_json_is_written_whole(tmp_path):
    buf = io.BytesIO()
    torch.save([1], buf)
    (tmp_path / 'new.pth').write_bytes(buf.getvalue())
    torch.save([1], str(tmp_path / 'legacy.pth'), _use_new_zipfile_serialization=False)
    _zip_page(tmp_path / 'page.zip')
    (tmp_path / 'page.html').write_text('<html></html>')
    assert [files.is_torch_file(str(tmp_path / n)) for n in ('new.pth', 'legacy.pth', 'page.zip', 'page.html')] == \
        [True, True, False, False]
    files.write_json({'b': 1, 'a': [2]}, str(tmp_path / 'd' / 'x.json'), newline=True, indent=1, sort_keys=True)
    text = (tmp_path / 'd' / 'x.json').read_text()
    assert text == json.dumps({'a': [2], 'b': 1}, indent=1) + '\n' and os.listdir(tmp_path / 'd') == ['x.json']
