"""A relevance model's digest covers its weights wherever they live: the graph's bytes, the external data files it
names (a large model's float weights, an int4 model's 4-bit file), the tensors handed over from memory. RelMax keys
its resumable scans on it: a model whose weights changed under the same graph must not resume the old shards."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_lrp.load import parts_sha256


def _graph_bytes(folder) -> bytes:
    """A MatMul whose weight lives in ``folder``/w.data (written there), the graph alone serialised."""
    w = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(3, 4), "W")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [w])
    m = helper.make_model(g)
    onnx.external_data_helper.convert_model_to_external_data(m, location="w.data", size_threshold=0)
    onnx.save_model(m, str(folder / "m.onnx"))
    return onnx.load_model(str(folder / "m.onnx"), load_external_data=False).SerializeToString()


def test_a_changed_weight_in_an_external_file_changes_the_digest(tmp_path):
    graph = _graph_bytes(tmp_path)
    before = parts_sha256(graph, tmp_path)
    assert parts_sha256(graph, tmp_path) == before  # deterministic
    data = bytearray((tmp_path / "w.data").read_bytes())
    data[5] ^= 1  # one bit of one weight
    (tmp_path / "w.data").write_bytes(bytes(data))
    assert parts_sha256(graph, tmp_path) != before
    assert parts_sha256(graph) != parts_sha256(graph, tmp_path)  # the file is part of it


def test_arrays_handed_over_from_memory_are_part_of_the_digest():
    graph = b"graph"
    a = {"w": np.ones((2, 3), np.float32), "b": np.zeros(3, np.float32)}
    d = parts_sha256(graph, arrays=a)
    assert parts_sha256(graph, arrays=dict(reversed(list(a.items())))) == d  # order of the dict: no matter
    changed = {"w": a["w"].copy(), "b": a["b"]}
    changed["w"][1, 2] = np.nextafter(np.float32(1), np.float32(2))
    assert parts_sha256(graph, arrays=changed) != d
    assert parts_sha256(graph, arrays={"w": a["w"].reshape(3, 2), "b": a["b"]}) != d  # same bytes, other shape
    assert parts_sha256(graph, arrays={"w": a["w"].astype(np.int32), "b": a["b"]}) != d


@pytest.mark.parametrize("missing", ["w.data"])
def test_a_missing_data_file_is_not_hashed_as_empty(tmp_path, missing):
    graph = _graph_bytes(tmp_path)
    (tmp_path / missing).unlink()
    with pytest.raises(OSError):
        parts_sha256(graph, tmp_path)
