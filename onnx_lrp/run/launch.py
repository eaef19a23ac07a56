"""From a model and the Explainer's options to a running relevance model: :class:`ExplainOptions` (the composite, the
build options and the run options, each checked once when made); the build; the session; and the one fallback between
them, to float32 when onnxruntime cannot run a float16 / bfloat16 relevance model on this device. What
:class:`onnx_lrp.Explainer` does, for the engines that run a relevance model without the facade (metrics, dataset,
Ray)."""
from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from ..building import build
from ..building.stages import only_lrp_errors
from ..core.errors import InputError, LrpError, LrpWarning
from ..core.relevance_model import BuildOptions
from ..rules.composite import Composite, load_composite
from . import runtime
from .options import RunOptions
from .runner import Runner, open_session


_BUILD = frozenset(f.name for f in dataclasses.fields(BuildOptions)) - {"device"}
_RUN = frozenset(f.name for f in dataclasses.fields(RunOptions)) - {"device"}


@dataclass(frozen=True)
class ExplainOptions:
    """What makes a running relevance model besides the model: the composite (its rule parameters set), how it is
    built (:class:`BuildOptions`) and how it runs (:class:`onnx_lrp.run.options.RunOptions`). Each part checks its
    values once, when it is made; :meth:`from_keywords` makes all three from the Explainer's keywords."""

    composite: Composite
    build: BuildOptions = BuildOptions()
    run: RunOptions = RunOptions()
    params: dict = field(default_factory=dict)  # the rule parameters given (set in ``composite`` already)

    @classmethod
    def from_keywords(cls, composite: "str | Path | Composite" = "auto", device: str | None = None, *,
                      build: BuildOptions | None = None, run: RunOptions | None = None,
                      **keywords) -> "ExplainOptions":
        """The Explainer's keywords split: the fields of :class:`BuildOptions` and of :class:`RunOptions` (``device``
        is both: the run's as given, the build's resolved), the rest rule parameters of the composite. ``build`` /
        ``run``: those objects as made by the caller (then none of their keywords may be given too)."""
        params = {k: v for k, v in keywords.items() if k not in _BUILD | _RUN}
        run = _part(RunOptions, run, {k: v for k, v in keywords.items() if k in _RUN}, device, "run")
        if build is None:
            given = {k: v for k, v in keywords.items() if k in _BUILD}
            build = BuildOptions(**given, device=runtime.resolve_device(run.device))
        else:
            _part(BuildOptions, build, {k: v for k, v in keywords.items() if k in _BUILD}, None, "build")
        try:
            loaded = load_composite(composite).with_params(**params)
        except ValueError as exc:
            raise InputError(str(exc)) from None
        return cls(loaded, build, run, params)

    def with_composite(self, composite) -> "ExplainOptions":
        """These options with another composite (a name, a file or a Composite), the same rule parameters set."""
        return dataclasses.replace(self, composite=load_composite(composite).with_params(**self.params))


def _part(kind, given, keywords: dict, device, name: str):
    """One part of the options: made from ``keywords`` (and ``device``), or ``given`` when no keyword of it is."""
    if given is None:
        return kind(**keywords, **({} if device is None else {"device": device}))
    if not isinstance(given, kind):
        raise InputError(f"{name}= must be a {kind.__name__}, not {type(given).__name__}")
    clash = sorted(keywords) + (["device"] if device is not None and device != given.device else [])
    if clash:
        raise InputError(f"{', '.join(clash)} given beside {name}={kind.__name__}(...); give them in it")
    return given


def build_and_start(model, composite, build_options: BuildOptions, run_options: RunOptions, config=None):
    """(relevance model, its session): built and started. Where onnxruntime cannot start a float16 / bfloat16
    relevance model: precision="auto" builds it again in float32 (one warning), precision="model" is refused."""
    relevance_model = build(model, composite, build_options)  # only LrpError escapes it
    try:
        return relevance_model, _started(relevance_model, run_options, config)
    except LrpError as exc:
        if relevance_model.model_precision == "float32":
            raise
        _float32_instead(exc, relevance_model.model_precision, build_options)
    del relevance_model
    relevance_model = build(model, composite, dataclasses.replace(build_options, precision="float32"))
    return relevance_model, _started(relevance_model, run_options, config)


def _started(relevance_model, run_options: RunOptions, config=None):
    """The relevance model's session; as the build, only :class:`onnx_lrp.LrpError` escapes."""
    with only_lrp_errors("building the relevance model",
                         hint="; the model (or a dimension of it) is too large for this machine"):
        return open_session(relevance_model, run_options, config)


def _float32_instead(exc: LrpError, model_precision: str, options: BuildOptions) -> None:
    """onnxruntime cannot run the relevance model in ``model_precision``: precision="auto" warns once (it is then
    built in float32), precision="model" is refused in one line."""
    why = str(exc).split("; ")[0]
    why = why[why.find("[ONNXRuntimeError]"):] if "[ONNXRuntimeError]" in why else why
    if options.precision != "auto":
        raise InputError(f"onnxruntime cannot run the relevance model in {model_precision} on {options.device} "
                         f"(precision={options.precision!r}): {why}; use precision='float32' (computed in float32)"
                         ) from None
    warnings.warn(f"onnxruntime cannot run the relevance model in {model_precision} on {options.device} ({why}); "
                  "it is computed in float32 (precision='float32' skips the attempt)", LrpWarning, stacklevel=4)


def runner(model, options: ExplainOptions, config: dict | None = None) -> Runner:
    """A :class:`onnx_lrp.run.runner.Runner` of ``model`` built and started with ``options`` (``config``: its
    session's, :class:`onnx_lrp.run.runtime.Session`)."""
    relevance_model, session = build_and_start(model, options.composite, options.build, options.run, config)
    return Runner(relevance_model, options.run, session)


__all__ = ["ExplainOptions", "build_and_start", "runner"]
