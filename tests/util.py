"""The tests' shared helpers (importable from every folder of tests/: pyproject.toml's ``pythonpath``).

* paths: ``ROOT`` (the repository) and ``GOLDENS`` (tests/goldens), so a test file can live in any folder;
* tiny ONNX models built with onnx.helper (``node``, ``make_model``, ``add_probe``) and run with onnxruntime (``run``);
  models are written with IR version 10 (onnx.helper writes a newer one than onnxruntime 1.31 reads);
* comparisons: ``rel_l2`` (one number for whole arrays) and ``rel_l2_items`` (one per item, axis 0); ``f32_tol`` (an
  absolute tolerance of a few float32 steps at the compared values' magnitude) and ``assert_close`` (numpy's
  ``assert_allclose`` with ``atol`` never below it);
* ``explain``: the one explain helper (an Explainer of a path, bytes or a ModelProto, run on ``x``; box bounds for box
  composites, the LrpWarnings raised on request);
* ``explain_probe``: a model's relevance with a linear probe on its outputs (the relevance entering them is known);
* numpy references (``conv_matrix``, ``stab``).
"""
from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[1]
GOLDENS = ROOT / "tests" / "goldens"
IR_VERSION = 10
NP2ONNX = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float64): TensorProto.DOUBLE,
           np.dtype(np.float16): TensorProto.FLOAT16, np.dtype(np.int64): TensorProto.INT64,
           np.dtype(np.int32): TensorProto.INT32, np.dtype(bool): TensorProto.BOOL}


def node(op_type, inputs, outputs, name=None, domain=None, **attrs):
    """``helper.make_node`` with a default name (the op type and first output)."""
    outputs = [outputs] if isinstance(outputs, str) else list(outputs)
    return helper.make_node(op_type, list(inputs), outputs, name=name or f"{op_type}_{outputs[0]}", domain=domain,
                            **attrs)


def make_model(nodes, inputs: dict, outputs, inits: dict | None = None, opset: int = 17, dtype=np.float32,
               extra_opsets=()) -> onnx.ModelProto:
    """A model from nodes; ``inputs`` maps names to shapes (or (shape, dtype)); ``outputs`` lists names (their
    types are left to shape inference: float of ``dtype`` unless given as (name, dtype))."""
    ins = []
    for name, spec in inputs.items():
        shape, dt = spec if isinstance(spec, tuple) and len(spec) == 2 and isinstance(spec[1], type) else (spec, dtype)
        ins.append(helper.make_tensor_value_info(name, NP2ONNX[np.dtype(dt)], list(shape)))
    outs = []
    for o in ([outputs] if isinstance(outputs, str) else outputs):
        name, dt = o if isinstance(o, tuple) else (o, dtype)
        outs.append(helper.make_tensor_value_info(name, NP2ONNX[np.dtype(dt)], None))
    initializers = [numpy_helper.from_array(np.asarray(v), name=k) for k, v in (inits or {}).items()]
    graph = helper.make_graph(list(nodes), "test", ins, outs, initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)] + [
        helper.make_opsetid(d, v) for d, v in extra_opsets])
    model.ir_version = IR_VERSION
    try:  # give the outputs their inferred shapes (the ONNX checker wants a shape on graph outputs)
        inferred = onnx.shape_inference.infer_shapes(model)
        model.graph.ClearField("output")
        model.graph.output.extend(inferred.graph.output)
    except Exception:
        pass
    return model


def to_bytes(model: onnx.ModelProto) -> bytes:
    return model.SerializeToString()


def run(model, feeds: dict) -> list[np.ndarray]:
    """Run a model (proto or bytes) with onnxruntime on CPU."""
    data = model if isinstance(model, (bytes, bytearray)) else model.SerializeToString()
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(bytes(data), sess_options=opts, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def add_probe(model: onnx.ModelProto, outs, cs, keep_outputs: bool = False, batch: int = 1) -> onnx.ModelProto:
    """Append ``probe = expand(sum_k <reshape(outs[k], [1, -1]), cs[k]>, [batch, 1])`` as the model's first output.

    The explainer starts one relevance per batch item of the input (``batch`` of them); with start="one-hot" the
    relevance entering ``outs[k]`` is then exactly ``batch * cs[k]`` (reshaped to its shape) when the probe nodes
    (named ``probe_*``) get the gradient rule.
    """
    outs = [outs] if isinstance(outs, str) else list(outs)
    cs = [cs] if isinstance(cs, np.ndarray) else list(cs)
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    g.initializer.extend([numpy_helper.from_array(np.array([1, -1], dtype=np.int64), "probe_shape")])
    parts = []
    for k, (out, c) in enumerate(zip(outs, cs)):
        g.initializer.extend([numpy_helper.from_array(np.asarray(c, dtype=np.float32).reshape(-1, 1), f"probe_c{k}")])
        g.node.extend([helper.make_node("Reshape", [out, "probe_shape"], [f"probe_flat{k}"], name=f"probe_reshape{k}"),
                       helper.make_node("MatMul", [f"probe_flat{k}", f"probe_c{k}"], [f"probe{k}"],
                                        name=f"probe_matmul{k}")])
        parts.append(f"probe{k}")
    g.node.extend([helper.make_node("Sum", parts, ["probe_total"], name="probe_sum"),
                   helper.make_node("Expand", ["probe_total", "probe_batch"], ["probe"], name="probe_expand")])
    g.initializer.extend([numpy_helper.from_array(np.array([batch, 1], dtype=np.int64), "probe_batch")])
    old = list(g.output)
    del g.output[:]
    g.output.extend([helper.make_tensor_value_info("probe", TensorProto.FLOAT, [batch, 1])])
    if keep_outputs:
        g.output.extend(old)
    return m


def explain(model, x, composite: str = "epsilon", target=None, *, box=None, position=None, warned: bool = False,
            **kw):
    """``onnx_lrp.Explainer(model, composite=composite, **kw).explain(x, target=target)``: the Explanation.

    ``model``: a path (str or Path), bytes or an ``onnx.ModelProto``; ``box``: ``(low, high)`` given to a composite
    whose name says ``box`` (the others get none); ``position``: explain's (sequence outputs); ``warned``: return
    ``(Explanation, [message of each LrpWarning raised while building and explaining])``."""
    import warnings

    import onnx_lrp

    if isinstance(model, onnx.ModelProto):
        model = to_bytes(model)
    elif isinstance(model, Path):
        model = str(model)
    if box is not None and "box" in (composite if isinstance(composite, str) else getattr(composite, "name", "")):
        kw = dict(kw, low=box[0], high=box[1])
    extra = {} if position is None else {"position": position}

    def run_it():
        return onnx_lrp.Explainer(model, composite=composite, **kw).explain(x, target=target, **extra)

    if not warned:
        return run_it()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        res = run_it()
    return res, [str(w.message) for w in seen if issubclass(w.category, onnx_lrp.LrpWarning)]


def probe_explainer(model: onnx.ModelProto, outs, cs, composite, batch: int, keep_outputs: bool = False, **kw):
    """An ``Explainer`` of ``model`` with ``add_probe(model, outs, cs)`` appended, started one-hot from the probe (the
    probe nodes get the gradient rule when ``composite`` does not name them): the relevance entering ``outs`` is
    ``batch * cs``."""
    import onnx_lrp

    probe = add_probe(model, outs, cs, keep_outputs=keep_outputs, batch=batch)
    return onnx_lrp.Explainer(to_bytes(probe), composite=composite, start="one-hot", **kw)


def explain_probe(model: onnx.ModelProto, outs, cs, composite, feeds, batch: int, keep_outputs: bool = False, **kw):
    """``probe_explainer(...).explain(feeds)`` and the relevance entering ``outs``: ``batch * cs`` in float64 (one
    array for one output, else a list)."""
    res = probe_explainer(model, outs, cs, composite, batch, keep_outputs, **kw).explain(feeds)
    entering = [batch * np.asarray(c).astype(np.float64) for c in ([cs] if isinstance(cs, np.ndarray) else cs)]
    return res, entering[0] if isinstance(cs, np.ndarray) else entering


def dyadic(rng, shape, scale=8, low=-16, high=16, odd=False):
    """Random numbers k / scale (exact in float32, sums of products stay exact)."""
    k = rng.integers(low, high + 1, size=shape)
    if odd:
        k = 2 * (k // 2) + 1
    return (k / scale).astype(np.float32)


# ------------------------------------------------------------------------------------------ numpy references
def conv_matrix(w, in_sp, strides=None, pads=None, dilations=None, group=1):
    """The dense matrix A of an N-D convolution with kernel ``w`` (Cout, Cin/g, k...) on one sample of spatial
    size ``in_sp``: conv(x)[flat] = A @ x[flat] (bias excluded). Written with explicit loops from the definition
    out[o, p] = sum_{i, k} w[o, i, k] x[g(o) * Cin/g + i, p * s + k * d - pad_begin].
    ConvTranspose with weight w (Cin, Cout/g, k...) is, by definition, the transpose of the Conv with the same
    weight acting on the ConvTranspose's output space.
    """
    w = np.asarray(w, dtype=np.float64)
    nd = w.ndim - 2
    strides = list(strides or [1] * nd)
    dil = list(dilations or [1] * nd)
    pads = list(pads or [0] * (2 * nd))
    k = w.shape[2:]
    cout, cin_g = w.shape[:2]
    cin = cin_g * group
    out_sp = [(n + pads[a] + pads[nd + a] - dil[a] * (k[a] - 1) - 1) // strides[a] + 1 for a, n in enumerate(in_sp)]
    n_in, n_out = int(np.prod(in_sp)), int(np.prod(out_sp))
    A = np.zeros((cout * n_out, cin * n_in))
    cout_g = cout // group
    for o in range(cout):
        gi = o // cout_g
        for p_idx, p in enumerate(itertools.product(*[range(n) for n in out_sp])):
            for i in range(cin_g):
                ci = gi * cin_g + i
                for kk in itertools.product(*[range(n) for n in k]):
                    pos = [p[a] * strides[a] + kk[a] * dil[a] - pads[a] for a in range(nd)]
                    if all(0 <= pos[a] < in_sp[a] for a in range(nd)):
                        q = int(np.ravel_multi_index(pos, in_sp))
                        A[o * n_out + p_idx, ci * n_in + q] += w[(o, i) + kk]
    return A, out_sp


def stab(z, eps=1e-6):
    """zennit's stabilizer: z + eps * (sign(z) + (z == 0))."""
    return z + eps * (np.sign(z) + (z == 0))


# --------------------------------------------------------------------------------------------- comparisons
def rel_l2(a, b) -> float:
    """||a - b|| / ||b|| over the whole arrays, in float64; ``b`` is the reference and must not be all zero."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    norm = np.linalg.norm(b)
    assert norm > 0, "an all-zero reference"
    return float(np.linalg.norm(a - b) / norm)


def rel_l2_items(a, b) -> np.ndarray:
    """``rel_l2`` per item (axis 0): one relative L2 distance per row; no reference row may be all zero."""
    a = np.asarray(a, np.float64).reshape(len(a), -1)
    b = np.asarray(b, np.float64).reshape(len(b), -1)
    norm = np.linalg.norm(b, axis=1)
    assert np.all(norm > 0), "an all-zero reference"
    return np.linalg.norm(a - b, axis=1) / norm


def f32_tol(values, ulps: float = 4) -> float:
    """``ulps`` float32 steps at the largest magnitude of ``values``: the least absolute tolerance that means
    anything for float32 results of that size (one float32 step at 24 is 1.9e-6; the kernels of different CPUs,
    AVX2 / AVX-512 / VNNI, sum in different orders and differ by a few steps). Add it to an ``atol`` chosen for
    small values."""
    top = np.max(np.abs(np.asarray(values, np.float64))) if np.size(values) else 0.0
    return float(ulps * np.spacing(np.float32(top)))


def assert_close(actual, desired, rtol: float = 1e-7, atol: float = 0.0, ulps: float = 4, **kw):
    """``np.testing.assert_allclose`` whose absolute tolerance is never below the float32 resolution of the compared
    values: when either side is float32 (or narrower), ``atol`` is raised by ``f32_tol(desired, ulps)``, so an
    element near zero of an array of larger values may differ by the few float32 steps that other CPUs' kernels
    (AVX2 / AVX-512 / VNNI) give. float64 comparisons keep ``atol`` as given."""
    narrow = any(np.asarray(v).dtype.kind == "f" and np.asarray(v).dtype.itemsize <= 4 for v in (actual, desired))
    np.testing.assert_allclose(actual, desired, rtol=rtol, atol=atol + (f32_tol(desired, ulps) if narrow else 0.0),
                               **kw)


def assert_cli_refuses(argv, folder: Path, *words):
    """The command line ``argv`` (after ``onnx-lrp``) exits 2 with one ``onnx-lrp: error:`` line holding every word
    of ``words``, and writes nothing into ``folder``."""
    from click.testing import CliRunner

    from onnx_lrp.cli.main import main

    before = sorted(p.name for p in folder.iterdir())
    result = CliRunner().invoke(main, [str(a) for a in argv])
    err = result.stderr
    assert result.exit_code == 2 and err.count("\n") == 1 and err.startswith("onnx-lrp: error: "), err
    assert all(w in err for w in words), err
    assert sorted(p.name for p in folder.iterdir()) == before


def ort_session(data: bytes, optimise: bool = True):
    """A plain onnxruntime CPU session of ``data`` (the reference run of a test); ``optimise=False``: as written,
    without graph optimisations."""
    so = ort.SessionOptions()
    so.log_severity_level = 3
    if not optimise:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])


#: class names of the digits model in models/ (it carries none of its own)
DIGIT_NAMES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


def cli(*args):
    """``onnx-lrp ARGS`` in-process (click's runner; paths as strings): the click Result."""
    from click.testing import CliRunner

    from onnx_lrp.cli.main import main

    return CliRunner().invoke(main, [str(a) for a in args])


def ok_json(result) -> dict:
    """The --json output of a run that explained (exit 0, or 1 for a verdict)."""
    import json

    assert result.exit_code in (0, 1), (result.exit_code, result.output, result.stderr)
    return json.loads(result.stdout)


def stored_options(npz, case: str) -> dict:
    """A case's method options stored in a goldens .npz as ``<case>/<option>`` (an array, or a 0-d value) or
    ``<case>/<option>/<input>`` (one per input, in order: a tuple); float16-stored arrays as float32."""
    options = {}
    for key in npz.files:
        parts = key.split("/")
        if parts[0] != case or parts[1] == "ref":
            continue
        a = npz[key]
        value = (a.astype(np.float32) if a.dtype == np.float16 else a) if a.ndim else a.item()
        options[parts[1]] = options.get(parts[1], ()) + (value,) if len(parts) == 3 else value
    return options
