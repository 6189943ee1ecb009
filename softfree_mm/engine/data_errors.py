"""Bad data files stop a run with one line naming the file: a sample that fails to load or transform (a truncated
or unreadable image, a missing segmentation map), an annotation file that does not parse or lacks a field."""
import os.path as osp
import re
import traceback
from typing import Iterator, Optional

from .errors import BadInput, short_error

IMAGE_KEYS = ('img_path', 'seg_map_path', 'filename', 'img_file')


def _jpeg_cut_short(data: bytes) -> bool:
    """True when a JPEG's image data has no end-of-image marker: the marker segments are walked up to the first
    start-of-scan (so EXIF thumbnails do not count), and the scan data must be followed by FF D9 (entropy-coded data
    never holds it). Data after the marker (motion photos, trailers) is fine."""
    i, n = 2, len(data)
    while i + 4 <= n:
        if data[i] != 0xFF:
            return False  # not the layout expected here: the decoder decides
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
        elif marker == 0xDA:  # start of scan
            return data.find(b'\xff\xd9', i + 2) < 0
        elif marker in (0x01, 0xD8) or 0xD0 <= marker <= 0xD7:  # markers without a length
            i += 2
        else:
            i += 2 + int.from_bytes(data[i + 2:i + 4], 'big')
    return True  # the file ends before its image data


def _truncated(data: bytes) -> Optional[str]:
    """Why image bytes are cut short, or None: a JPEG whose scan has no end marker, a PNG without its IEND chunk."""
    if data[:2] == b'\xff\xd8':
        return 'truncated JPEG (no end-of-image marker)' if _jpeg_cut_short(data) else None
    if data[:8] == b'\x89PNG\r\n\x1a\n':
        return None if data.rfind(b'IEND') > 8 else 'truncated PNG (no IEND chunk)'
    return None


def name_failing_samples() -> None:
    """An error while a dataset loads a sample names the sample's file (all mmengine BaseDataset subclasses:
    mmdet, mmseg, mmpretrain); image bytes that are cut short raise instead of decoding a partly grey image."""
    import mmcv
    from mmengine.dataset import BaseDataset
    if getattr(BaseDataset.__getitem__, '_softfree_mm_patched', False):
        return
    getitem = BaseDataset.__getitem__

    def named_getitem(self, idx):
        try:
            return getitem(self, idx)
        except BadInput:
            raise
        except Exception as e:
            try:
                info = self.get_data_info(idx)
            except Exception:
                info = {}
            files = [str(info[k]) for k in IMAGE_KEYS if info.get(k)]
            what = files[0] if files else f'sample {idx} of {type(self).__name__}'
            raise BadInput(f'{what}: {short_error(e, 300)}') from e

    named_getitem._softfree_mm_patched = True
    BaseDataset.__getitem__ = named_getitem

    imfrombytes = mmcv.imfrombytes

    def checked_imfrombytes(content, *args, **kwargs):
        why = _truncated(content) if isinstance(content, (bytes, bytearray)) else None
        if why:
            raise ValueError(f'cannot decode the image: {why}')
        img = imfrombytes(content, *args, **kwargs)
        if img is None:
            raise ValueError('cannot decode the image (not an image, or a corrupt one)')
        return img

    mmcv.imfrombytes = checked_imfrombytes
    import mmcv.image
    mmcv.image.imfrombytes = checked_imfrombytes


COCO_FIELDS = dict(images=('id', 'file_name', 'width', 'height'),
                   annotations=('id', 'image_id', 'category_id', 'bbox'), categories=('id', 'name'))


def json_problem(path: str) -> Optional[str]:
    """What is wrong with a JSON annotation file (read only once something failed): invalid JSON, or for a COCO
    file a missing list or a record without a required field; None when nothing is found."""
    import json
    try:
        with open(path) as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        return f'not valid JSON ({e})'
    except (OSError, UnicodeDecodeError) as e:
        return f'cannot be read ({short_error(e, 120)})'
    if not isinstance(data, dict) or not any(k in data for k in COCO_FIELDS):
        return None
    for key, fields in COCO_FIELDS.items():
        records = data.get(key)
        if not isinstance(records, list):
            return f"a field is missing: no {key!r} list (a COCO file needs {', '.join(COCO_FIELDS)})"
        for i, rec in enumerate(records):
            missing = [f for f in fields if not isinstance(rec, dict) or f not in rec]
            if missing:
                rid = rec.get('id') if isinstance(rec, dict) else None
                return f"a field is missing: {key}[{i}] (id {rid}) has no {', '.join(repr(m) for m in missing)}"
    return None


def _chain(e: BaseException) -> Iterator[BaseException]:
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def data_file_error(e: BaseException) -> Optional[str]:
    """One line naming the annotation file when ``e`` was raised while a dataset loaded its annotations (invalid
    JSON, a missing field...), else None."""
    from mmengine.dataset import BaseDataset
    for exc in _chain(e):
        if isinstance(exc, BadInput):
            return str(exc)
        for frame, _ in traceback.walk_tb(exc.__traceback__):
            ds = frame.f_locals.get('self')
            if isinstance(ds, BaseDataset) and frame.f_code.co_name in ('full_init', 'load_data_list',
                                                                        'parse_data_info'):
                ann = getattr(ds, 'ann_file', '') or getattr(ds, 'data_root', '')
                problem = json_problem(ann) if str(ann).endswith('.json') and osp.isfile(ann) else None
                if problem is None:
                    kind = 'a field is missing: ' if isinstance(exc, KeyError) else ''
                    problem = f'{kind}{short_error(exc, 300)}'
                return f'{ann}: cannot read the annotations of {type(ds).__name__}: {problem}'
    # a worker process re-raises with the original traceback as text: our BadInput line is its last line
    for exc in _chain(e):
        m = re.search(r'BadInput: (.+)$', str(exc).strip())
        if m:
            return m.group(1).strip()
    return None
