"""One point in a process of its own: ``python -m softfree_mm.analysis.benchmark point|detector JSON`` prints its
row as JSON (what ``run_backbones`` and ``run_detectors`` start, through ``timing.in_fresh_process``)."""
import json
import sys

from .backbones import backbone_point
from .detector import detector_point

if len(sys.argv) != 3 or sys.argv[1] not in ('point', 'detector'):
    sys.exit('usage: python -m softfree_mm.analysis.benchmark point|detector JSON')
spec = json.loads(sys.argv[2])
if sys.argv[1] == 'detector':
    res = detector_point(spec['name'], tuple(spec['size']), spec['batch'], spec['dtype'], spec['device'],
                         spec['repeats'], profile=spec.get('profile', ''))
else:
    res = backbone_point(spec['name'], spec['kernel'], tuple(spec['size']), spec['batch'], spec['dtype'],
                         spec['device'], spec['repeats'], spec['flops'], spec.get('clock', 'wall'))
print(json.dumps(res))
