"""``AttentionStatsHook``: ||A||_F and the score-Jacobian norm (arXiv 2410.18613's measures) per attention layer
and head, recorded during training through the runner's visualizer.

Every ``interval`` iterations the forward pass of the batch is watched (:mod:`.capture`) and, averaged over the
batch's attention problems (padding queries left out), ``{prefix}/{layer}/fro[_h{i}]``, ``jac[_h{i}]`` (kernels
without a score map get none, the log says why once), ``rows`` and ``keys`` (softmax's bounds: ||A||_F <=
sqrt(rows), ||J||_F <= 2 sqrt(rows)) are written. Between records no hook is attached to the model.

    custom_hooks = [dict(type='AttentionStatsHook', interval=50)]
"""
from typing import Dict, Optional, Sequence

from mmengine.dist import is_main_process
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper

from .capture import AttentionCapture
from .matrix_norms import AUTOGRAD_MAX_KEYS, call_stats


class AttentionStatsHook(Hook):
    """Record ||A||_F and the score-Jacobian norm per attention layer and head every ``interval`` iterations.

    Args:
        interval (int): record on every ``interval``-th training iteration.
        first (bool): also record on the first iteration (the norms at initialisation).
        layers (list[str] | None): layer names to watch (module paths without ``.kernel``); None = all.
        jacobian (bool): also compute the Jacobian norms.
        per_head (bool): write one scalar per head (besides the mean over heads).
        prefix (str): scalar name prefix.
        file_name (str): the JSON file (in the visualizer's save dir) that gets only these records.
        max_matrix_elements (int): a layer whose A (heads x Nq x Nk of one attention problem) is larger is skipped,
            with a warning (the norms need the explicit matrix; global attention at detection resolutions would
            need gigabytes).
        max_autograd_keys (int): a kernel whose score map has no closed-form Jacobian gets it from autograd, one
            backward pass per key, in layers of at most this many keys; other layers get a note instead.
    """

    priority = 'LOW'

    def __init__(self, interval: int = 50, first: bool = True, layers: Optional[Sequence[str]] = None,
                 jacobian: bool = True, per_head: bool = True, prefix: str = 'attn',
                 file_name: str = 'attention_stats.json', max_matrix_elements: int = 1 << 27,
                 max_autograd_keys: int = AUTOGRAD_MAX_KEYS):
        if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
            raise ValueError(f'AttentionStatsHook: interval must be a positive int, got {interval!r}')
        if layers is not None and (isinstance(layers, str) or not all(isinstance(n, str) for n in layers)):
            raise TypeError(f'AttentionStatsHook: layers must be a list of layer names or None, got {layers!r}')
        if not isinstance(file_name, str) or not file_name.endswith('.json') or file_name == 'scalars.json':
            raise ValueError(f"AttentionStatsHook: file_name must end in '.json' and differ from 'scalars.json', "
                             f'got {file_name!r}')
        for name, val in (('first', first), ('jacobian', jacobian), ('per_head', per_head)):
            if not isinstance(val, bool):
                raise TypeError(f'AttentionStatsHook: {name} must be True or False, got {val!r}')
        for name, val in (('max_matrix_elements', max_matrix_elements), ('max_autograd_keys', max_autograd_keys)):
            if isinstance(val, bool) or not isinstance(val, int) or val < 1:
                raise ValueError(f'AttentionStatsHook: {name} must be a positive int, got {val!r}')
        self.max_matrix_elements, self.max_autograd_keys = max_matrix_elements, max_autograd_keys
        self.interval, self.first, self.layers = interval, first, None if layers is None else list(layers)
        self.jacobian, self.per_head, self.prefix, self.file_name = jacobian, per_head, prefix, file_name
        self._capture: Optional[AttentionCapture] = None
        self._stats: Dict[str, dict] = {}
        self._failed: Dict[str, str] = {}
        self._noted = set()

    # ------------------------------------------------------------------ mmengine
    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        self._detach()
        if not (self.every_n_train_iters(runner, self.interval) or (self.first and runner.iter == 0)):
            return
        if not is_main_process():
            return
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        self._stats = {}
        self._capture = AttentionCapture(model, layers=self.layers, on_call=self._record, store=False)
        self._capture.__enter__()

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        if self._capture is None:
            return
        self._detach()
        scalars = self.scalars(self._stats)
        for name, why in self._failed.items():
            if name not in self._noted:
                self._noted.add(name)
                runner.logger.warning(f'AttentionStatsHook: {name}: no statistics ({why})')
        self._failed = {}
        for name, st in self._stats.items():
            if name in self._noted:
                continue
            self._noted.add(name)
            if st['jac'] is None:
                runner.logger.info(f'AttentionStatsHook: {name}: no Jacobian norm ({st["jac_note"]})')
            if not st['complete']:
                runner.logger.info(f'AttentionStatsHook: {name}: ||A||_F of the matrix part only; the rest of the '
                                   'output is no matrix shared by the channels (per-channel residual)')
        if scalars:
            runner.visualizer.add_scalars(scalars, step=runner.iter + 1, file_path=self.file_name)
        self._stats = {}

    def after_train(self, runner) -> None:
        self._detach()

    def on_exception(self, runner, exception) -> None:  # hooks must never outlive a failed run
        self._detach()

    # ------------------------------------------------------------------ pieces
    def _detach(self):
        if self._capture is not None:
            self._capture.remove()
            self._capture = None

    def _record(self, call) -> None:
        # runs inside the model's forward pass: a failure here is reported, never allowed to stop training
        size = call.q.shape[1] * call.q.shape[2] * call.k.shape[2]
        if size > self.max_matrix_elements:
            self._failed.setdefault(call.name, f'A has {size} elements per attention problem, above '
                                               f'max_matrix_elements={self.max_matrix_elements}')
            return
        try:
            self._stats[call.name] = call_stats(call, jacobian=self.jacobian, max_autograd_keys=self.max_autograd_keys)
        except Exception as e:  # noqa: BLE001
            self._failed.setdefault(call.name, f'{type(e).__name__}: {e}')

    def scalars(self, stats: Dict[str, dict]) -> Dict[str, float]:
        out = {}
        for name, st in stats.items():
            base = f'{self.prefix}/{name}'
            out[f'{base}/fro'] = float(st['fro'].mean())
            if st['jac'] is not None:
                out[f'{base}/jac'] = float(st['jac'].mean())
            out[f'{base}/rows'] = float(st['rows'])
            out[f'{base}/keys'] = float(st['keys'])
            if self.per_head:
                for h, v in enumerate(st['fro'].tolist()):
                    out[f'{base}/fro_h{h}'] = v
                if st['jac'] is not None:
                    for h, v in enumerate(st['jac'].tolist()):
                        out[f'{base}/jac_h{h}'] = v
        return out

