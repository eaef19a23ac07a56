"""A model's digest covers its external data files: a changed weight in a data file is a changed model.

Snapshots record the digest, `check` reports `model_changed`, and the dataset engine refuses to resume a run into an
output folder written with other weights (before, only the graph file was hashed, so a run with new weights in the
same data file resumed silently and mixed relevance of two models).
"""

from __future__ import annotations

import hashlib

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_lrp import regression as rg  # noqa: F401
from onnx_lrp.load import model_sha256
from onnx_lrp.dataset import explain_dataset
from onnx_lrp.core.errors import InputError


def _mlp(folder, w1_scale: float = 1.0, external: bool = True):
    rng = np.random.default_rng(0)
    w1 = (rng.standard_normal((6, 16)) * w1_scale).astype(np.float32)
    w2 = rng.standard_normal((16, 3)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["a"]),
         helper.make_node("MatMul", ["a", "w2"], ["y"])], "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    path = folder / "mlp.onnx"
    (folder / "mlp.data").unlink(missing_ok=True)  # onnx appends to an existing data file
    if external:
        onnx.save_model(model, path, save_as_external_data=True, all_tensors_to_one_file=True, location="mlp.data",
                        size_threshold=0)
    else:
        onnx.save_model(model, path)
    return path


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_digest_changes_with_the_data_file_and_equals_the_file_hash_without_one(tmp_path):
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir(), (tmp_path / "c").mkdir()
    a, b = _mlp(tmp_path / "a"), _mlp(tmp_path / "b", w1_scale=2.0)
    assert _sha(a) == _sha(b)  # the graph files are byte-identical: only the data files differ
    assert model_sha256(a) != model_sha256(b)
    assert model_sha256(a) == model_sha256(_mlp(tmp_path / "b", w1_scale=1.0))  # same weights, same digest
    inline = _mlp(tmp_path / "c", external=False)
    assert model_sha256(inline) == _sha(inline)  # snapshots written before keep their digest


def test_dataset_refuses_to_resume_with_other_weights_in_the_same_data_file(tmp_path):
    model = _mlp(tmp_path)
    x = np.random.default_rng(1).standard_normal((4, 6)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "out"
    explain_dataset(model, tmp_path / "x.npy", out, shard_size=2, composite="epsilon")
    explain_dataset(model, tmp_path / "x.npy", out, shard_size=2, composite="epsilon")  # same model: resumes
    graph = _sha(model)
    _mlp(tmp_path, w1_scale=3.0)  # new weights written into the same mlp.data
    assert _sha(model) == graph
    with pytest.raises(InputError, match="model_sha256"):
        explain_dataset(model, tmp_path / "x.npy", out, shard_size=2, composite="epsilon")
