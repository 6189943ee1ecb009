"""``--cfg-options KEY=VALUE``, read as mmengine's DictAction reads it except that a single value keeps its spaces.

mmengine's DictAction removes every space of a value before it parses lists and tuples, so a work dir or checkpoint
path with a space (``--cfg-options model.backbone.init_cfg.checkpoint='/data/my runs/x'``) arrived as another path.
Here a value that is no list, tuple or comma-separated sequence is one string (or number, bool, None) as given; the
rest is DictAction's. tools/train.py, tools/test.py and the warm-start chain read options with it.
"""
from mmengine.config import DictAction


def parse_value(text: str):
    """One --cfg-options value: ``'/a b/c'`` -> '/a b/c'; ``'[1, 2]'`` -> [1, 2] (DictAction's parse)."""
    bare = text.strip('\'"')
    if ' ' in bare and not bare.startswith(('(', '[')) and ',' not in bare:
        return DictAction._parse_int_float_bool(bare)
    return DictAction._parse_iterable(text)


class CfgOptions(DictAction):
    """argparse action of ``--cfg-options``: DictAction with :func:`parse_value`."""

    @staticmethod
    def _parse_iterable(val):
        return parse_value(val)
