"""From a model and the Explainer's keyword arguments to a running relevance model: the arguments checked and split
into the composite, the build options and the run options; the build; the session; and the one fallback between
them, to float32 when onnxruntime cannot run a float16 / bfloat16 relevance model on this device. What
:class:`onnx_lrp.Explainer` does, for the engines that run a relevance model without the facade (metrics, dataset,
Ray)."""
from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

from ..build import build
from ..build import precision as precision_pass
from ..build.stages import only_lrp_errors
from ..core.errors import InputError, LrpError, LrpWarning
from ..core.relevance_model import BuildOptions
from ..rules.composite import Composite, load_composite
from . import runtime
from .runner import RunOptions, Runner, open_session


def split_options(composite: "str | Path | Composite" = "auto", device: str = "cpu", output: str | None = None,
                  relevance_at=(), explain_logits: bool = True, start: str = "logit", threads: int | None = None,
                  ledger: bool = False, constants: dict | None = None, input_shapes: dict | None = None,
                  strict: bool = False, precise: bool = False, tf32: bool = False, precision: str = "auto",
                  **rule_params) -> tuple[Composite, BuildOptions, RunOptions]:
    """The Explainer's arguments checked (each refused in one line) and split: the composite with its rule
    parameters, what builds the relevance model, what runs it."""
    if start not in ("logit", "one-hot"):
        raise InputError(f"start must be 'logit' or 'one-hot', not {start!r}")
    try:
        composite = load_composite(composite).with_params(**rule_params)
    except ValueError as exc:
        raise InputError(str(exc)) from None
    resolved = runtime.resolve_device(device)
    if not isinstance(tf32, bool):
        raise InputError(f"tf32 must be True or False, not {tf32!r}")
    precision_pass.check(precision)
    if isinstance(relevance_at, str):
        relevance_at = [relevance_at]  # one tensor name
    try:
        relevance_at = tuple(relevance_at)
    except TypeError:
        raise InputError(f"relevance_at must be a list of tensor names, not {relevance_at!r}") from None
    if not all(isinstance(n, str) for n in relevance_at):
        raise InputError(f"relevance_at must be a list of tensor names (strings), not {list(relevance_at)!r}")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 0):
        raise InputError(f"threads must be a non-negative int (0: onnxruntime's default), not {threads!r}")
    build_options = BuildOptions(output=output, explain_logits=explain_logits, relevance_at=relevance_at,
                                 ledger=bool(ledger), constants=constants, input_shapes=input_shapes,
                                 precision=precision, device=resolved)
    # the session resolves "auto" itself: CUDA when it starts, else the CPU
    run_options = RunOptions(device=device, threads=threads, start=start, strict=bool(strict),
                             precise=bool(precise), tf32=tf32)
    return composite, build_options, run_options


def build_and_start(model, composite, build_options: BuildOptions, run_options: RunOptions):
    """(relevance model, its session): built and started. Where onnxruntime cannot start a float16 / bfloat16
    relevance model: precision="auto" builds it again in float32 (one warning), precision="model" is refused."""
    with only_lrp_errors("building the relevance model",
                         hint="; the model (or a dimension of it) is too large for this machine"):
        relevance_model = build(model, composite, build_options)
        try:
            return relevance_model, open_session(relevance_model, run_options)
        except LrpError as exc:
            if relevance_model.model_precision == "float32":
                raise
            _float32_instead(exc, relevance_model.model_precision, build_options)
        del relevance_model
        relevance_model = build(model, composite, dataclasses.replace(build_options, precision="float32"))
        return relevance_model, open_session(relevance_model, run_options)


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


def runner(model, **options) -> Runner:
    """A :class:`onnx_lrp.run.runner.Runner` of ``model`` built with the Explainer's keyword arguments (composite,
    device, output, rule parameters, ...)."""
    composite, build_options, run_options = split_options(**options)
    relevance_model, session = build_and_start(model, composite, build_options, run_options)
    return Runner(relevance_model, run_options, session)


__all__ = ["split_options", "build_and_start", "runner"]
