"""Runs through onnxruntime's IOBinding (issue 29, point 2), tested on the CPU: the relevance is bit-identical to a
plain ``InferenceSession.run`` of the same relevance model; device arrays (an ``OrtValue`` here) are bound in place
and come back in their kind; and, structurally for CUDA, what is bound where and which outputs cross the bus."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from families import FAMILIES
from onnx_lrp.core.errors import InputError
from onnx_lrp.run import binding

RNG = np.random.default_rng(2929)
CNN = next(f for f in FAMILIES if f.name == "resnet-epf")


def _plain(ex, feeds: dict, targets) -> dict:
    """The relevance model in a plain onnxruntime session (no IOBinding): the reference run."""
    sess = ort.InferenceSession(ex.relevance_model.model_bytes, providers=["CPUExecutionProvider"])
    steer = {"lrp/target": np.asarray(targets, np.int64), "lrp/one_hot": np.array(False)}
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, {**feeds, **steer})))


@pytest.mark.parametrize("fam", [CNN] + [f for f in FAMILIES if f.name in ("bert-embeds-dynamic", "digits-cnn")],
                         ids=lambda f: f.name)
def test_bound_run_is_bit_identical_to_a_plain_run(fam):
    ex = fam.explainer()
    feeds = ex.checked_feeds(fam.feeds())
    res = ex.explain(feeds)
    ref = _plain(ex, feeds, res.target)
    rel = res.relevance if isinstance(res.relevance, dict) else {ex.relevance_inputs[0]: res.relevance}
    for name, r in rel.items():
        assert r.tobytes() == ref["lrp/relevance/" + name].tobytes()
    for name, y in res.outputs.items():
        assert np.asarray(y).tobytes() == ref[name].tobytes()
    assert ex.last_transfer == {"to_device": 0, "to_host": 0}  # the CPU: every value bound in place


def test_an_ortvalue_input_comes_back_as_ortvalues_with_the_same_values():
    ex = CNN.explainer()
    x = CNN.feeds()["x"] if "x" in CNN.feeds() else next(iter(CNN.feeds().values()))
    ref = ex.explain(x)
    res = ex.explain(ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(x)), target=ref.target)
    assert isinstance(res.relevance, ort.OrtValue) and res.relevance.device_name().lower() == "cpu"
    assert res.relevance.numpy().tobytes() == ref.relevance.tobytes()
    assert all(isinstance(v, ort.OrtValue) for v in res.outputs.values())
    assert isinstance(res.target, np.ndarray)  # the few numbers per item are always numpy
    np.testing.assert_array_equal(res.target, ref.target)
    one = ex.explain(ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(x[0])), target=int(ref.target[0]))
    # one item without its batch axis: an OrtValue has no views, so the returned ones keep the axis of one (numpy,
    # torch and cupy results lose it); the few numbers per item lose it
    assert one.relevance.shape() == [1, *x.shape[1:]] and not one.batched and np.ndim(one.target) == 0
    assert one.relevance.numpy().tobytes() == ex.explain(x[:1], target=int(ref.target[0])).relevance.tobytes()


class FakeCuda:
    """What torch / cupy put on a GPU look like to onnx-lrp: DLPack on device type 2 (kDLCUDA)."""

    __module__ = "torch"

    def __init__(self, shape, dtype="float32", device=0, contiguous=True):
        self.shape, self.dtype, self.device, self._c = tuple(shape), dtype, device, contiguous

    def __dlpack_device__(self):
        return (binding.DL_CUDA, self.device)

    def is_contiguous(self):
        return self._c


OUTPUTS = ["y", "lrp/relevance/x", "lrp/target_used", "lrp/explained_value", "lrp/check/sum/x", "lrp/check/peak/x",
           "lrp/check/finite"]
SMALL = {"lrp/target_used", "lrp/explained_value", "lrp/check/sum/x", "lrp/check/peak/x", "lrp/check/finite"}


def test_cuda_plan_binds_device_arrays_in_place_and_fetches_only_the_small_outputs():
    x = binding.classify(FakeCuda((16, 3, 224, 224)))
    assert x is not None and x.device == "cuda" and x.nbytes == 16 * 3 * 224 * 224 * 4
    feeds = {"x": x, "lrp/target": np.zeros(16, np.int64), "lrp/one_hot": np.array(False)}
    p = binding.plan("cuda", feeds, OUTPUTS, SMALL)
    assert [(q.name, q.device, q.copied) for q in p.inputs] == [
        ("x", "cuda", ""), ("lrp/target", "cpu", "to device"), ("lrp/one_hot", "cpu", "to device")]
    assert {q.name: q.device for q in p.outputs} == {n: "cpu" if n in SMALL else "cuda" for n in OUTPUTS}
    assert sorted(p.copied("to host")) == sorted(SMALL) and p.returned_as == "dlpack"
    results = {n: np.zeros(16, np.float64) for n in SMALL} | {"lrp/check/finite": np.zeros(1)}
    moved = binding.bytes_moved(p, feeds, results)
    assert moved == {"to_device": 16 * 8 + 1, "to_host": 4 * 16 * 8 + 8}  # no image, no relevance crosses


def test_cuda_plan_for_host_arrays_copies_the_input_once_and_every_output_back():
    x = np.zeros((16, 3, 224, 224), np.float32)
    feeds = {"x": x, "lrp/target": np.zeros(16, np.int64), "lrp/one_hot": np.array(False)}
    p = binding.plan("cuda", feeds, OUTPUTS, SMALL)
    assert p.copied("to device") == ["x", "lrp/target", "lrp/one_hot"]
    assert p.copied("to host") == OUTPUTS and p.returned_as == "numpy"
    results = {n: np.zeros(16, np.float64) for n in SMALL} | {"lrp/relevance/x": x, "y": np.zeros((16, 1000),
                                                                                                  np.float32)}
    moved = binding.bytes_moved(p, feeds, results)
    assert moved["to_device"] == x.nbytes + 16 * 8 + 1
    assert moved["to_host"] == x.nbytes + 16 * 1000 * 4 + 4 * 16 * 8 + 16 * 8


def test_device_arrays_are_refused_in_one_line_where_they_cannot_be_bound():
    with pytest.raises(InputError, match="on the GPU .* runs on the CPU"):
        binding.plan("cpu", {"x": binding.classify(FakeCuda((2, 3)))}, ["y"], set())
    with pytest.raises(InputError, match="cuda:1"):
        binding.plan("cuda", {"x": binding.classify(FakeCuda((2, 3), device=1))}, ["y"], set())
    ex = CNN.explainer()
    shape = next(iter(CNN.feeds().values())).shape
    with pytest.raises(InputError, match="device array of float64; the model wants float32"):
        ex.explain(FakeCuda(shape, "float64"))
    with pytest.raises(InputError, match="not contiguous"):
        ex.explain(FakeCuda(shape, contiguous=False))
    with pytest.raises(InputError, match="on the GPU"):
        ex.explain(FakeCuda(shape))


def test_outputs_follow_the_callers_library_through_dlpack():
    """A DLPack caller gets its own library's tensors (torch here, on the CPU: the conversion a CUDA run makes)."""
    torch = pytest.importorskip("torch")
    value = ort.OrtValue.ortvalue_from_numpy(np.arange(6, dtype=np.float32).reshape(2, 3))
    like = binding.DeviceArray(torch.zeros(1), "dlpack", "cuda", 0, (1,), np.dtype(np.float32), "torch")
    out = binding.to_kind(value, like)
    assert isinstance(out, torch.Tensor) and out.tolist() == [[0, 1, 2], [3, 4, 5]]
    assert binding.classify(torch.zeros(2)) is None  # a CPU tensor is host data (numpy's path, as before)
