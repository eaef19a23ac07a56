"""``Explainer(model, method="integrated-gradients", ...)``: any method of :mod:`onnx_lrp.methods` behind the
Explainer's face. :class:`MethodExplainer` answers ``explain(x, target)`` with an
:class:`onnx_lrp.run.explanation.Explanation` whose ``relevance`` is the method's attribution, beside the model's
outputs, the explained target and value, as LRP's Explanation holds them; it names the inputs, the explained output
and the device as an LRP Explainer does, so that the command line runs either.

Every method of :data:`onnx_lrp.methods.METHODS` runs here: ``grad-cam`` (``layer=`` a tensor N x C x spatial
axes) and ``rise`` give their maps N x 1 x the input's spatial axes (as captum's LayerGradCam), the others an
attribution in the input's shape; ``expected-gradients`` / ``gradient-shap`` take their background set as
``baselines=``. A model with several inputs takes a dict by input name (or a tuple in the model's order) and gives a
relevance per attributed input by name (one attributed input: its array), as LRP's Explanation: the float inputs
(occlusion with no float input: every input); integer inputs (token ids, masks) are fed as given
(:attr:`MethodExplainer.held_inputs`), as captum's ``additional_forward_args``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.errors import InputError
from ..core.interface import RELEVANCE_PREFIX, TARGET_OUTPUT
from ..core.relevance_model import InputSpec, carried_model
from ..run.explanation import Explanation
from ..run.runner import Runner
from . import gradients

#: what ``method=`` calls LRP (then ``composite=`` chooses the rules)
LRP = "lrp"


def names_target(target) -> bool:
    """Whether ``target`` names a class (then resolved through ``labels``)."""
    from ..io.labels import by_name

    return by_name(target)


def is_method(method) -> bool:
    """Whether ``method`` is one of the methods beyond LRP (else it is LRP: "lrp" or a composite name)."""
    from . import METHODS

    return isinstance(method, str) and method in METHODS


@dataclass(frozen=True)
class ForwardModel:
    """What a method run on the original model (occlusion, ...) says where an LRP explainer's relevance model is
    asked for: the model as given (``model_bytes``: bytes or a path), no quantized output step, float32."""

    model_bytes: object
    output_step: float | None = None
    model_precision: str = "float32"


class MethodExplainer:
    """One attribution method on one model, built once (:class:`onnx_lrp.methods.Attributor`); ``explain`` returns
    an Explanation with the attribution as ``relevance``."""

    def __init__(self, model, method: str, device: str | None = None, labels=None, **options):
        from ..io import labels as names
        from ..io.model_folder import resolve_model_folder
        from . import Attributor

        self._given = dict(options)  # the method's options and settings as given (payload())
        if device is not None:
            options["device"] = device
        self.attributor = Attributor(model, method, **options)
        self.method = method
        engine = self.attributor.engine
        self._runner = engine.runner if isinstance(engine, gradients.GradientRunner) else \
            engine if isinstance(engine, Runner) else None
        self._source = carried_model(model)
        path = resolve_model_folder(model)[0]
        #: the class names (``labels=``, the model's id2label metadata, the config.json beside it), or None
        self.labels = names.find_labels(labels, self._runner if self._runner is not None else self, path)

    # ------------------------------------------------------------------ what an Explainer names
    @property
    def composite_name(self) -> str:
        return self.method

    composite_reason = ""
    gap_warnings = False
    device_note = None

    @property
    def relevance_model(self):
        """The relevance model the method runs (the true gradient's, or the noise tunnel's base), else the model
        as given (:class:`ForwardModel`)."""
        if self._runner is not None:
            return self._runner.relevance_model
        return ForwardModel(self._source)

    @property
    def device(self) -> str:
        if self._runner is not None:
            return self._runner.device
        return self.attributor.engine.session.device

    @property
    def inputs(self) -> list:
        if self._runner is not None:
            return self._runner.inputs
        session = self.attributor.engine.session
        return [InputSpec(i.name, np.dtype(session.input_types.get(i.name) or np.float32),
                          tuple(d if isinstance(d, int) else None for d in i.shape)) for i in session.inputs()]

    @property
    def relevance_inputs(self) -> list:
        """The inputs the method attributes: the float inputs (gradient methods; integer ones, token ids and masks,
        are fed as given: :attr:`held_inputs`; occlusion and rise alike), the one input otherwise."""
        engine = self.attributor.engine
        if isinstance(engine, gradients.GradientRunner):
            return list(engine.packing.names) if engine.packing is not None else [engine.spec.name]
        if isinstance(engine, Runner):
            return [s.name for s in engine.inputs if s.name in engine.relevance_inputs]
        floats = [s.name for s in self.inputs if np.dtype(s.dtype).kind == "f"]
        if self.method == "occlusion":  # the float inputs (none: every input, token ids occluded with a baseline)
            return floats or list(engine.names)
        return floats[:1] if self.method == "rise" and len(self.inputs) > 1 else [engine.input]

    @property
    def held_inputs(self) -> list:
        """The model's inputs fed as given and not attributed (integer inputs: attention masks, positions)."""
        return [s.name for s in self.inputs if s.name not in self.relevance_inputs]

    @property
    def output_names(self) -> list:
        if self._runner is not None:
            return self._runner.output_names
        return list(self.attributor.engine.session.output_names)

    @property
    def explained_output(self) -> str:
        if self._runner is not None:
            return self._runner.explained_output
        return self.attributor.engine.output

    @property
    def explained_tensor(self) -> str:
        return self.explained_output

    def output_width(self) -> int | None:
        """The number of classes of the explained output per item, when known before a run."""
        if self._runner is not None:
            return self._runner.output_width()
        outs = self.attributor.engine.session.session.get_outputs()
        dims = next((o.shape[1:] for o in outs if o.name == self.explained_output and o.shape), None)
        return int(np.prod(dims)) if dims and all(isinstance(d, int) for d in dims) else None

    def payload(self) -> "MethodPayload":
        """What builds the same explainer in another process (a Ray actor of the dataset engine): the model as that
        process reads it (a path, or bytes), the method and its options."""
        if self._source is None:
            raise InputError(f"method {self.method!r} on Ray builds the model again in each worker: give it as a file "
                             "path or bytes (onnx.save it), not an in-memory model")
        options = {k: v for k, v in self._given.items() if k not in ("device", "threads")}
        return MethodPayload(self._source, self.method, options)

    def __repr__(self) -> str:
        return f"MethodExplainer(method={self.method!r}, device={self.device!r}, explained_output=" \
               f"{self.explained_output!r})"

    # ------------------------------------------------------------------ explain
    def explain(self, x, target=None, start: str | None = None, position=None) -> Explanation:
        """The attribution of ``target`` (None: the arg-max per item; an int; one per item) for ``x`` by the
        method, as an Explanation (``relevance`` in x's shape, or N x 1 x its spatial axes for ``grad-cam`` and
        ``rise``; with or without the batch axis as ``x`` came)."""
        if position is not None or isinstance(target, tuple):
            raise InputError(f"position is for LRP on sequence outputs; method {self.method!r} explains one entry "
                             "per item: give the target as a flat index")
        if start not in (None, "one-hot"):
            raise InputError(f"start={start!r} is LRP's; method {self.method!r} explains the output entry itself")
        x = self._single(x)
        if names_target(target):
            from ..io.labels import resolve_targets

            target = resolve_targets(target, self.labels, self.output_width())
        engine = self.attributor.engine
        if isinstance(engine, gradients.GradientRunner):
            xb, bare = engine.batch(x)
            feeds = engine.feeds(xb)
            outputs, targets, g = self._gradient_run(engine, xb, target)
            relevance = self._from_gradient(g, xb, targets, feeds)
        elif isinstance(engine, Runner):
            xb, bare = self.attributor.noise_input(x)
            several = isinstance(x, dict)  # several inputs: every one fed, the float ones moved, a dict back
            feeds = engine.checked_feeds(x) if several else {self.inputs[0].name: xb}
            lrp = engine.explain(feeds if several else xb, target=target)
            outputs, targets = lrp.forward or lrp.outputs, np.asarray(lrp.target, np.int64).reshape(-1)
            relevance = self.attributor.attribute(feeds if several else xb, targets)
        else:
            xb, bare = engine.prepared(x)
            feeds = engine.feeds(xb)
            outputs, targets = self._forward_run(engine, xb, target)
            relevance = self.attributor.attribute(xb, targets)
            if isinstance(relevance, dict):
                relevance = {k: relevance[k] for k in self.relevance_inputs}
        return self._explanation(relevance, outputs, targets, feeds, bare)

    def _single(self, x):
        """``x`` as the method's engine takes it: the one input's array (from an array or a dict by input name), or
        for a model with several inputs a dict by input name (from a dict, or a tuple in the model's order)."""
        names = [s.name for s in self.inputs]
        if len(names) > 1:
            if isinstance(x, (tuple, list)) and len(x) == len(names):
                x = dict(zip(names, x))
            if not isinstance(x, dict) or set(x) != set(names):
                got = ", ".join(map(repr, x)) if isinstance(x, dict) else type(x).__name__
                raise InputError(f"the model has {len(names)} inputs ({', '.join(names)}): give a dict by input name "
                                 f"or a tuple in that order; got {got or 'none'}")
            return x
        if not isinstance(x, dict):
            return x
        if set(x) != {names[0]}:
            raise InputError(f"method {self.method!r} takes the model's one input {names[0]!r}; got "
                             f"{', '.join(map(repr, x)) or 'none'}")
        return x[names[0]]

    def _gradient_run(self, engine, xb: np.ndarray, target):
        """One run of the gradient graph at ``xb``: (the model's outputs, the targets used, the gradient)."""
        res = engine.run(xb, engine.runner.checked_targets(target, xb.shape[0]))
        outputs = {n: res[n] for n in engine.runner.output_names if n in res}
        targets = np.asarray(res[TARGET_OUTPUT], np.int64).reshape(-1)
        if engine.packing is None:
            return outputs, targets, res[RELEVANCE_PREFIX + engine.spec.name]
        return outputs, targets, engine.packing.pack({n: res[RELEVANCE_PREFIX + n] for n in engine.packing.names})

    def _from_gradient(self, g: np.ndarray, xb: np.ndarray, targets: np.ndarray, feeds: dict):
        """The attribution: the gradient itself (``gradient``, ``gradient-x-input``: no second run), else the method
        run at the targets the gradient run resolved; several inputs (or integer ones held): a dict by input name
        of the attributed inputs."""
        engine = self.attributor.engine
        plain = engine.packing is None and not engine.held_names
        if self.method in ("gradient", "gradient-x-input"):
            out = g * xb if self.method == "gradient-x-input" else np.abs(g) if self.attributor.options.abs else g
            return out if plain else engine.result(out, {}, False)
        out = self.attributor.attribute(xb if plain else feeds, targets)
        return out if plain else {k: out[k] for k in self.relevance_inputs}

    def _forward_run(self, engine, xb: np.ndarray, target):
        """The original model's outputs at ``xb`` (one run) and the targets (None: the arg-max per item)."""
        feeds = engine.feeds(xb)
        n = len(feeds[engine.input])
        outputs = engine.session.run({k: np.ascontiguousarray(a) for k, a in feeds.items()})
        y = np.asarray(outputs[engine.output]).reshape(n, -1)
        if target is None:
            return outputs, np.argmax(y, axis=1).astype(np.int64)
        t = np.asarray(target)
        if t.dtype.kind not in "iu" or t.ndim > 1 or (t.ndim == 1 and len(t) != n) or np.any(t < 0) \
                or np.any(t >= y.shape[1]):
            raise InputError(f"target {target!r}: give one class index in [0, {y.shape[1]}) or one per item ({n})")
        return outputs, np.broadcast_to(t.astype(np.int64).reshape(-1), (n,)).copy()

    def _explanation(self, relevance, outputs: dict, targets: np.ndarray, feeds: dict, bare: bool):
        n = len(np.asarray(targets).reshape(-1))
        explained = np.asarray(outputs[self.explained_output]).reshape(n, -1)
        value = explained[np.arange(n), targets]
        if isinstance(relevance, dict) and len(relevance) == 1:  # one attributed input: its array, as LRP's
            relevance = next(iter(relevance.values()))
        relevance = {k: np.asarray(v) for k, v in relevance.items()} if isinstance(relevance, dict) else \
            np.asarray(relevance)
        res = Explanation(relevance=relevance, outputs=outputs, target=targets,
                          explained_output=self.explained_output, explained_value=value, forward=outputs,
                          inputs=dict(feeds))
        if self.labels:
            res.class_names = self.labels  # captions and .npz name the classes
        return res.without_batch_axis() if bare else res


@dataclass(frozen=True)
class MethodPayload:
    """A method explainer as plain data (:meth:`MethodExplainer.payload`): ``explainer(device, threads)`` builds it
    again (the model loaded and the method's graph built in that process)."""

    model: object  # a path or bytes
    method: str
    options: dict
    kind = "method"  # what onnx_lrp.dataset.ray tells it from an LRP payload by

    def explainer(self, device: str | None = None, threads: int | None = None) -> MethodExplainer:
        extra = {} if threads is None else {"threads": threads}
        return MethodExplainer(self.model, self.method, device, **self.options, **extra)


#: ops whose output grad-cam's default layer is never (no activation of their own, or not float)
_NOT_LAYERS = {"Constant", "Shape", "Size", "Cast", "ConstantOfShape", "Range", "Unsqueeze", "Squeeze", "Reshape",
               "Gather", "Concat", "Slice", "Identity"}


def spatial_tensors(model, x: np.ndarray, device: str = "cpu") -> list[str]:
    """The model's tensors that are N x C x spatial axes at ``x`` (the first item; the rank of ``x``, at least 3,
    more than one spatial entry), in the graph's order: the last is grad-cam's default layer (the output of the last
    convolution block, before pooling or flattening ends the spatial axes). One run of the model with every such
    tensor as an output."""
    from .. import load
    from ..run import runtime

    x = np.asarray(x)
    if x.ndim < 3:
        raise InputError(f"grad-cam needs an input with spatial axes (N x C x H x W); this one is "
                         f"{' x '.join(map(str, x.shape))}: name a layer or use another method")
    ir_model = load.to_ir(load.read_proto(model), load.data_folder(model))
    graph = ir_model.graph
    if len(graph.inputs) != 1:
        raise InputError(f"grad-cam takes a model with one input; this one has {len(graph.inputs)}")
    values = [o for n in graph for o in n.outputs if o.name and n.op_type not in _NOT_LAYERS]
    graph.outputs.clear()
    graph.outputs.extend(values)
    parts = load.serialize_parts(ir_model)
    session = runtime.Session(parts.model_bytes, device, deployed=True,
                              external=runtime.ExternalData(parts.folder, parts.arrays, parts.prepack))
    given = graph.inputs[0]
    first = x[:1].astype(given.dtype.numpy()) if given.dtype is not None else x[:1]
    out = session.run({given.name: np.ascontiguousarray(first)}, [v.name for v in values])
    return [v.name for v in values if _spatial(out.get(v.name), x.ndim)]


def _spatial(a, rank: int) -> bool:
    a = None if a is None else np.asarray(a)
    return a is not None and a.dtype.kind == "f" and a.ndim == rank and a.shape[0] == 1 and \
        int(np.prod(a.shape[2:])) > 1


__all__ = ["MethodExplainer", "MethodPayload", "is_method", "LRP", "spatial_tensors"]
