"""Options are objects (issue 33): BuildOptions, RunOptions, ExplainOptions, EvaluateOptions and DatasetOptions
check each value once, when they are made, and refuse a bad one in one line (InputError) before any work; the
Explainer built from its keywords equals the one built from the objects, bit for bit."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

import onnx_lrp
from onnx_lrp.core.errors import InputError
from onnx_lrp.core.relevance_model import BuildOptions
from onnx_lrp.dataset import DatasetOptions
from onnx_lrp.metrics import EvaluateOptions
from onnx_lrp.run.launch import ExplainOptions
from onnx_lrp.run.options import RunOptions

from util import ROOT  # noqa: E402
DIGITS = ROOT / "models" / "digits_cnn.onnx"

# (what is made, a word the one-line refusal must hold)
BAD = [
    (lambda: BuildOptions(precision="half"), "precision"),
    (lambda: BuildOptions(relevance_at=3), "relevance_at"),
    (lambda: BuildOptions(relevance_at=["a", 1]), "relevance_at"),
    (lambda: BuildOptions(device="gpu"), "device"),
    (lambda: RunOptions(start="zero"), "start"),
    (lambda: RunOptions(tf32=1), "tf32"),
    (lambda: RunOptions(threads=-1), "threads"),
    (lambda: RunOptions(threads=True), "threads"),
    (lambda: RunOptions(threads=2.0), "threads"),
    (lambda: RunOptions(device=0), "device"),
    (lambda: EvaluateOptions(metric="accuracy"), "metric"),
    (lambda: EvaluateOptions(baseline="grey"), "baseline"),
    (lambda: EvaluateOptions(prob="odds"), "prob"),
    (lambda: EvaluateOptions(orders=("morf", "sideways")), "order"),
    (lambda: DatasetOptions(engine="spark"), "engine"),
    (lambda: DatasetOptions(batch_size=0), "batch_size"),
    (lambda: DatasetOptions(shard_size=0), "shard_size"),
    (lambda: DatasetOptions(workers=0), "workers"),
    (lambda: ExplainOptions.from_keywords(device="gpu"), "device"),
    (lambda: ExplainOptions.from_keywords("epsilon", no_such_parameter=1.0), "no_such_parameter"),
    (lambda: ExplainOptions.from_keywords("no-such-composite"), "no-such-composite"),
    (lambda: ExplainOptions.from_keywords(run=RunOptions(), tf32=True), "tf32"),
    (lambda: ExplainOptions.from_keywords(run=RunOptions(), device="cuda"), "device"),
    (lambda: ExplainOptions.from_keywords(build=BuildOptions(), output="logits"), "output"),
    (lambda: ExplainOptions.from_keywords(build={"output": "logits"}), "BuildOptions"),
]


@pytest.mark.parametrize("make, word", BAD, ids=[w + str(i) for i, (_, w) in enumerate(BAD)])
def test_each_bad_value_is_refused_in_one_line_when_made(make, word):
    with pytest.raises(InputError) as info:
        make()
    message = str(info.value)
    assert "\n" not in message and word in message, message


def test_a_bad_option_is_refused_before_any_build(monkeypatch):
    """Checked once, up front: the Explainer refuses a bad run option without loading the model (the build is
    replaced by one that fails the test)."""
    from onnx_lrp.run import launch

    def no_build(*args, **kwargs):
        raise AssertionError("built although an option was bad")

    monkeypatch.setattr(launch, "build", no_build)
    for bad in (dict(start="zero"), dict(tf32="yes"), dict(threads=-2), dict(precision="half"),
                dict(relevance_at=7), dict(composite="epsilon", gamma_typo=0.1)):
        with pytest.raises(InputError):
            onnx_lrp.Explainer(str(DIGITS), **bad)
    with pytest.raises(InputError, match="batch_size"):
        onnx_lrp.explain_dataset(str(DIGITS), str(ROOT / "models" / "samples" / "batch.npy"), "/nonexistent/out",
                                 batch_size=0)


def test_values_are_normalised_once_and_the_objects_are_frozen():
    assert BuildOptions(relevance_at="t").relevance_at == ("t",)
    assert BuildOptions(relevance_at=["a", "b"], ledger=1).relevance_at == ("a", "b")
    assert BuildOptions(ledger=1).ledger is True
    run = RunOptions(strict=1, precise=0)
    assert run.strict is True and run.precise is False
    assert EvaluateOptions(metric="faithfulness-correlation").prob == "logit"
    assert EvaluateOptions(metric="pixel-flipping").prob == "softmax"
    assert EvaluateOptions(orders=["lerf"]).all_orders() == ["lerf", "random"]
    assert DatasetOptions(batch_size="4").batch_size == 4
    for obj, name in ((BuildOptions(), "output"), (run, "tf32"), (EvaluateOptions(), "seed"),
                      (DatasetOptions(), "engine")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(obj, name, None)
    # replace() checks again: a carried RunOptions (Runner.payload) cannot be made bad on the way
    with pytest.raises(InputError, match="start"):
        dataclasses.replace(run, start="zero")


def test_from_keywords_splits_the_explainers_keywords():
    opts = ExplainOptions.from_keywords("epsilon-plus-flat", "cpu", epsilon=0.5, output="logits",
                                        relevance_at="t", start="one-hot", threads=1, tf32=False, precision="float32")
    assert opts.build == BuildOptions(output="logits", relevance_at=("t",), precision="float32", device="cpu")
    assert opts.run == RunOptions(device="cpu", threads=1, start="one-hot", tf32=False)
    assert opts.params == {"epsilon": 0.5}
    assert opts.composite.name == "epsilon-plus-flat"
    eps = {e.rule.params().get("epsilon") for e in opts.composite.entries} - {None}
    assert eps == {0.5}, eps
    # the objects as given travel unchanged; the same device beside run= is no clash
    run = RunOptions(start="one-hot")
    assert ExplainOptions.from_keywords(run=run, device="cpu").run is run


def _digits_batch(n: int = 3) -> np.ndarray:
    return np.random.default_rng(33).random((n, 1, 16, 16), dtype=np.float32)


def test_explainer_from_keywords_equals_explainer_from_objects():
    """The same relevance model (bytes) and the same relevance, outputs and targets (bits) on the digits model,
    built from the friendly keywords and from BuildOptions / RunOptions."""
    x = _digits_batch()
    by_keywords = onnx_lrp.Explainer(str(DIGITS), "epsilon-gamma-box", epsilon=0.25, gamma=0.5, low=0.0, high=1.0,
                                     start="one-hot", strict=True, precise=True)
    by_objects = onnx_lrp.Explainer(str(DIGITS), "epsilon-gamma-box",
                                    build=BuildOptions(device="cpu"),
                                    run=RunOptions(start="one-hot", strict=True, precise=True),
                                    epsilon=0.25, gamma=0.5, low=0.0, high=1.0)
    assert by_keywords.options == by_objects.options
    assert by_keywords.relevance_model.source.options == by_objects.relevance_model.source.options
    assert by_keywords.relevance_model.model_bytes == by_objects.relevance_model.model_bytes
    a, b = by_keywords.explain(x, target=[1, 2, 3]), by_objects.explain(x, target=[1, 2, 3])
    assert a.relevance.tobytes() == b.relevance.tobytes()
    assert a.target.tolist() == b.target.tolist() == [1, 2, 3]
    assert all(a.outputs[k].tobytes() == b.outputs[k].tobytes() for k in a.outputs)
    # the options do change the result: a different epsilon / start is not the same relevance (the test can fail)
    other = onnx_lrp.Explainer(str(DIGITS), "epsilon-gamma-box", epsilon=0.25, gamma=0.5, low=0.0, high=1.0)
    assert other.explain(x, target=[1, 2, 3]).relevance.tobytes() != a.relevance.tobytes()


def test_every_session_of_a_relevance_model_takes_the_run_options_settings():
    """A new session setting is a RunOptions field and one entry of its session_settings(): every onnxruntime
    session made outside run/runtime.py (the relevance model's, the deployed model's, the diagnostic one, the concept
    models') receives the settings as ``**`` keywords, none names one by hand. (The model's own forward for the
    metrics, the deployed-gap probes, occlusion, grad-cam's layer values, the methods' tensor listing and the
    greedy decoder of a generation run the model as written: no settings, as before.)"""
    import ast

    calls = []
    as_written = {"run/runtime.py", "metrics/forward.py", "run/deployed_gap.py", "methods/occlusion.py",
                  "methods/gradcam.py", "methods/explain.py", "run/generation.py"}
    for path in sorted((ROOT / "onnx_lrp").rglob("*.py")):
        if path.relative_to(ROOT / "onnx_lrp").as_posix() in as_written:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "Session" \
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "runtime":
                named = {k.arg for k in node.keywords if k.arg is not None}
                spread = any(k.arg is None for k in node.keywords)
                calls.append((path.relative_to(ROOT).as_posix(), spread, named & {"tf32"}))
    assert len(calls) >= 4, calls
    assert [c for c in calls if not c[1] or c[2]] == [], calls
    assert RunOptions(tf32=True).session_settings() == {"tf32": True}


def test_the_cli_maps_click_options_to_the_option_objects_by_field_name():
    """cli.options.explainer_setup, the one mapping: a click option named as a RunOptions / BuildOptions field sets
    it (a new run option needs no line there), --output's dest sets ``output``, --constant / --input-shape are
    parsed into the build options; click's dict is read, not changed."""
    from onnx_lrp.cli.options import RUN_FIELDS, explainer_setup

    assert set(RUN_FIELDS) == {f.name for f in dataclasses.fields(RunOptions)}
    given = dict(composite="epsilon", epsilon=0.5, threads=1, start="one-hot", strict=True, tf32=False,
                 output_name="logits", relevance_at=("t",), precision="float32", constants=("k=3",),
                 input_shapes=(), device="cpu")
    kept = dict(given)
    setup = explainer_setup(str(DIGITS), given, data_kind="npy")
    assert given == kept
    assert setup.run == RunOptions(device="cpu", threads=1, start="one-hot", strict=True)
    assert setup.build.output == "logits" and setup.build.relevance_at == ("t",)
    assert setup.build.precision == "float32" and int(setup.build.constants["k"]) == 3
    assert setup.build.input_shapes is None and setup.params == {"epsilon": 0.5}
    with pytest.raises(InputError, match="start"):
        explainer_setup(str(DIGITS), dict(given, start="zero"), data_kind="npy")
