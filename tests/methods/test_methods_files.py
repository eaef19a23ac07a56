"""The black-box methods (occlusion, RISE) read the model file through the loader's checks before onnxruntime sees
it: a file that is not ONNX, or external data outside the model's folder, is refused in one line naming the file
(exit 2), nothing written."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from util import cli


def _escaping(folder):
    """A model in folder/m whose weight lies in folder/secret.bin: '../secret.bin', outside the model's folder."""
    w = np.arange(12, dtype=np.float32).reshape(4, 3)
    (folder / "secret.bin").write_bytes(w.tobytes())
    t = TensorProto(name="W", data_type=TensorProto.FLOAT, dims=[4, 3], data_location=TensorProto.EXTERNAL)
    for k, v in (("location", "../secret.bin"), ("offset", "0"), ("length", str(w.nbytes))):
        e = t.external_data.add()
        e.key, e.value = k, v
    g = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])], [t])
    (folder / "m").mkdir()
    path = folder / "m" / "model.onnx"
    path.write_bytes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    return path


@pytest.mark.parametrize("method, extra", [("occlusion", ["--sliding-window-shapes", "1"]), ("rise", [])])
def test_black_box_methods_refuse_bad_model_files(tmp_path, method, extra):
    np.save(tmp_path / "x.npy", np.ones((2, 4), np.float32))
    (tmp_path / "bad.onnx").write_bytes(b"\x08\x07garbage" * 20)
    for model, words in ((tmp_path / "bad.onnx", "is not a valid ONNX model"),
                         (_escaping(tmp_path), "outside the model's folder")):
        r = cli("explain", model, tmp_path / "x.npy", "--method", method, *extra, "-o", tmp_path / "r.npy")
        assert r.exit_code == 2 and words in r.output and len(r.output.strip().splitlines()) == 1, r.output
        assert not (tmp_path / "r.npy").exists()
