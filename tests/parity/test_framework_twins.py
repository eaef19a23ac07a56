"""The same network exported by three frameworks gets the same relevance.

* Twins (``tests/goldens/twins/``, made by ``scripts/make_framework_twins.py``): small ResNet- and MobileNetV2-style
  nets built in PyTorch, Keras and Flax with the same weights, exported with torch.onnx, tf2onnx and jax2onnx. tf2onnx writes
  Keras BatchNormalization as Mul -> Add (not folded by onnx-lrp before: rel-L2 0.5-10 between the twins), and
  Cropping2D as a Slice that lists the dynamic batch axis; a third net has Keras Maximum/Minimum (ONNX Max/Min), a
  fourth a strided crop (jax2onnx: GatherND; skipped for Flax while this checkout has no GatherND handler). For every built-in CNN composite both exports must match
  zennit on the PyTorch twin and each other; LRP-0 on both must equal gradient x input. Needs neither TensorFlow nor
  torch: only the committed exports and references.
* Hand-built graphs for the canonizer (``canonize.fold_channel_affine`` / ``mark_channel_affine``): a per-channel
  Mul/Add/Sub/Div chain in any order, across NHWC transposes, after Conv and MatMul, is folded exactly (the forward is
  unchanged, and the relevance equals that of the same layer with numpy-folded weights); a constant that varies
  along another axis is not folded; an unfoldable chain gets BatchNormalization's rule (the same relevance as a
  BatchNormalization op).
"""
from __future__ import annotations

import functools
import json

import numpy as np
import onnx
import pytest

import onnx_lrp
from onnx_lrp import load as loader
from onnx_lrp.lrp import rewriter
from onnx_lrp.rules.composite import load_composite, parse_composite

from util import GOLDENS, assert_close, explain, make_model, node, rel_l2_items, run, to_bytes

TWINS = GOLDENS / "twins"
NETS = ("resnet", "mobilenet", "select", "strided")
COMPOSITES = ("epsilon", "epsilon-plus", "epsilon-plus-flat", "epsilon-gamma-box", "epsilon-alpha2-beta1",
              "epsilon-alpha2-beta1-flat", "epsilon@0.01")
TOL = 1e-4  # rel-L2: twin vs twin, and each vs zennit (measured: <= 3.5e-5)

LRP0 = parse_composite("""
name = "lrp0"
[[rules]]
match = { kind = "activation" }
rule = "pass"
[[rules]]
match = { kind = ["maxpool", "shape"] }
rule = "gradient"
[[rules]]
rule = "epsilon"
epsilon = 0.0
""")


def nhwc(x):
    return np.ascontiguousarray(np.asarray(x).transpose(0, 2, 3, 1))


def nchw(x):
    return np.ascontiguousarray(np.asarray(x).transpose(0, 3, 1, 2))


@pytest.fixture(scope="module", params=NETS)
def twin(request):
    name = request.param
    path = TWINS / f"{name}.npz"
    if not path.exists():
        pytest.fail(f"{path} is missing; run scripts/make_framework_twins.py")
    with np.load(path) as data:
        golden = {k: data[k] for k in data.files}
    return name, golden


@functools.lru_cache(maxsize=None)
def missing_handlers(name, framework) -> tuple[str, ...]:
    """Op types of an export that this checkout has no handler for (GatherND, in jax2onnx's strided crop, comes
    with the op-conformance work)."""
    from onnx_lrp.lrp.ops import REGISTRY
    graph = loader.load(str(TWINS / f"{name}_{framework}.onnx")).graph
    return tuple(sorted({n.op_type for n in graph} - set(REGISTRY)))


def box(composite: str) -> dict:
    """ZBox bounds for the inputs ~ N(0, 1) of the twins (those the zennit references use: -3, 3)."""
    return {"low": -3.0, "high": 3.0} if composite == "epsilon-gamma-box" else {}


@pytest.mark.parametrize("composite", COMPOSITES)
def test_twins_agree_with_each_other_and_zennit(twin, composite):
    name, g = twin
    comp, params = (composite.split("@")[0], {"epsilon": float(composite.split("@")[1])}) if "@" in composite \
        else (composite, {})
    x, given = g["x"], int(g["given_target"])
    frameworks = [fw for fw in ("torch", "keras", "flax") if not missing_handlers(name, fw)]
    explainers = {fw: onnx_lrp.Explainer(str(TWINS / f"{name}_{fw}.onnx"), composite=comp, start="one-hot", **params,
                                     **box(comp))
                  for fw in frameworks}
    for tname, target in (("argmax", None), ("given", given)):
        ref, ref_t = g[f"{composite}/b4/{tname}"], g[f"{composite}/b4/{tname}/target"]
        rel = {}
        for fw, ex in explainers.items():
            res = ex.explain(x if fw == "torch" else nhwc(x), target=target)  # Keras, Flax: NHWC
            np.testing.assert_array_equal(res.target, ref_t)
            rel[fw] = res.relevance if fw == "torch" else nchw(res.relevance)
        for fw, r in rel.items():
            for what, ref_ in (("zennit", ref), ("torch", rel["torch"])):
                err = rel_l2_items(r, ref_).max()
                assert err <= TOL, f"{name} {composite} {tname}: {fw} vs {what} rel-L2 {err:.2e}"
    missing = {fw: missing_handlers(name, fw) for fw in ("keras", "flax") if fw not in frameworks}
    if missing:
        pytest.skip(f"{name}: " + "; ".join(f"{fw} export needs a handler for {', '.join(m)}"
                                             for fw, m in missing.items()) + " (the others were checked)")


def test_twin_references_are_distinct(twin):
    """The composites give different relevances on these nets, so matching each one means something."""
    name, g = twin
    refs = [g[f"{c}/b4/argmax"] for c in COMPOSITES]
    for i in range(len(refs)):
        for j in range(i + 1, len(refs)):
            assert rel_l2_items(refs[i], refs[j]).min() > 1e-2, (COMPOSITES[i], COMPOSITES[j])


@pytest.mark.parametrize("framework", ("torch", "keras", "flax"))
def test_lrp0_is_gradient_times_input(twin, framework):
    name, g = twin
    if missing_handlers(name, framework):
        pytest.skip(f"{name}_{framework}.onnx needs a handler for {', '.join(missing_handlers(name, framework))}")
    nhwc_input = framework in ("keras", "flax")
    r = explain(TWINS / f"{name}_{framework}.onnx", nhwc(g["x"]) if nhwc_input else g["x"], LRP0,
                start="logit").relevance  # R = logit at the start: R = x * dlogit/dx
    r = nchw(r) if nhwc_input else r
    assert rel_l2_items(r, g["gxi"]).max() < 1e-4


def test_keras_batchnorm_gets_batchnorm_rules(twin):
    """tf2onnx's Mul -> Add after a linear layer is folded; the one after the residual sum (resnet) is kind
    "batchnorm" like the torch export's unfolded BatchNormalization; nothing is left as "affine"."""
    name, _ = twin
    kinds, selects = {}, {}
    frameworks = [fw for fw in ("torch", "keras", "flax") if not missing_handlers(name, fw)]
    for fw in frameworks:
        p = rewriter.plan(loader.load(str(TWINS / f"{name}_{fw}.onnx")), load_composite("epsilon-plus-flat"))
        kinds[fw] = [a.kind for a in p.assignments if a.on_path]
        selects[fw] = sum(a.node.op_type in ("Max", "Min") and a.kind == "maxpool" and
                          all(v.const_value is None for v in a.node.inputs) for a in p.assignments if a.on_path)
    assert "affine" not in kinds["keras"]
    for fw in frameworks[1:]:  # jax2onnx's mean (ReduceSum / n) is an average pool like torch's
        for kind in ("convolution", "dense", "avgpool"):
            assert kinds[fw].count(kind) == kinds["torch"].count(kind), (fw, kind)
    n_bn = {"resnet": 1, "mobilenet": 0, "select": 0, "strided": 0}[name]
    assert kinds["torch"].count("batchnorm") == n_bn
    assert kinds["keras"].count("batchnorm") == 2 * n_bn  # Mul and Add
    n_select = {"resnet": 0, "mobilenet": 0, "select": 2, "strided": 0}[name]  # Max, Min of two activations
    for fw in frameworks:
        assert selects[fw] == n_select
    assert "keras" in json.loads((TWINS / "twins.json").read_text())


# ------------------------------------------------------------------------------ hand-built canonizer cases
RNG = np.random.default_rng(0)
C, H = 4, 5


def _conv_chain_model(chain, nhwc_layout):
    """x -> Conv -> [Transpose to NHWC] -> chain of (op, const, const_first) -> [Transpose back] -> Relu -> GAP ->
    Flatten -> Gemm."""
    w = RNG.normal(size=(C, 3, 3, 3)).astype(np.float32)
    b = RNG.normal(size=C).astype(np.float32)
    wd = RNG.normal(size=(C, 3)).astype(np.float32)
    inits = {"w": w, "b": b, "wd": wd}
    nodes = [node("Conv", ["x", "w", "b"], "c", pads=[1, 1, 1, 1])]
    cur = "c"
    if nhwc_layout:
        nodes.append(node("Transpose", [cur], "t", perm=[0, 2, 3, 1]))
        cur = "t"
    for i, (op, k, first) in enumerate(chain):
        inits[f"k{i}"] = k
        nodes.append(node(op, [f"k{i}", cur] if first else [cur, f"k{i}"], f"a{i}"))
        cur = f"a{i}"
    if nhwc_layout:
        nodes.append(node("Transpose", [cur], "tb", perm=[0, 3, 1, 2]))
        cur = "tb"
    nodes += [node("Relu", [cur], "r"), node("GlobalAveragePool", ["r"], "g"), node("Flatten", ["g"], "f"),
              node("Gemm", ["f", "wd"], "y")]
    return make_model(nodes, {"x": [None, 3, H, H]}, ["y"], inits)


def _fold_oracle(chain, w, b, channel_shape):
    """The chain as y = a * conv(x) + c per channel, folded into w, b with numpy."""
    a, c = np.ones(C), np.zeros(C)
    for op, k, first in chain:
        k = np.broadcast_to(k, channel_shape).reshape(-1).astype(np.float64)
        if op == "Mul":
            a, c = a * k, c * k
        elif op == "Add":
            c = c + k
        elif op == "Sub":
            a, c = (-a, k - c) if first else (a, c - k)
        else:
            a, c = a / k, c / k
    return (w * a[:, None, None, None]).astype(np.float32), (b * a + c).astype(np.float32)


CHAINS = {
    "mul-add": [("Mul", 1), ("Add", 1)],
    "sub-div-mul-add": [("Sub", 1), ("Div", 1), ("Mul", 1), ("Add", 1)],
    "add-mul-rsub": [("Add", 1), ("Mul", 1), ("Sub", -1)],
    "scalar-mul-then-channel-add": [("Mul", 0), ("Add", 1)],
}


@pytest.mark.parametrize("nhwc_layout", (False, True))
@pytest.mark.parametrize("chain_name", CHAINS)
def test_channel_chain_folds_exactly(chain_name, nhwc_layout):
    shape = (C,) if nhwc_layout else (C, 1, 1)
    chain = []
    for op, per_channel in CHAINS[chain_name]:
        k = RNG.uniform(0.5, 1.5, size=shape if per_channel else ()).astype(np.float32)
        if op in ("Sub", "Add"):
            k = k - 1.0
        chain.append((op, k, per_channel == -1))
    model = _conv_chain_model(chain, nhwc_layout)
    inits = {i.name: np.array(i.float_data or np.frombuffer(i.raw_data, np.float32)).reshape(i.dims)
             for i in model.graph.initializer}
    w_f, b_f = _fold_oracle(chain, inits["w"], inits["b"], shape)
    folded = _conv_chain_model([], False)
    for init in folded.graph.initializer:
        if init.name in ("w", "b", "wd"):
            arr = {"w": w_f, "b": b_f, "wd": inits["wd"]}[init.name]
            init.ClearField("float_data")
            init.raw_data = np.ascontiguousarray(arr, np.float32).tobytes()
    x = RNG.normal(size=(2, 3, H, H)).astype(np.float32)
    ref_y = run(model, {"x": x})[0]
    assert_close(run(folded, {"x": x})[0], ref_y, rtol=1e-5, atol=1e-5)
    p = rewriter.plan(loader.load(to_bytes(model)), load_composite("epsilon-plus-flat"))
    assert [a.node.op_type for a in p.assignments if a.node.op_type in ("Mul", "Add", "Sub", "Div")] == []
    for comp in ("epsilon-plus", "epsilon-gamma-box", "epsilon"):
        res = onnx_lrp.Explainer(to_bytes(model), composite=comp, **box(comp)).explain(x)
        ref = onnx_lrp.Explainer(to_bytes(folded), composite=comp, **box(comp)).explain(x)
        assert_close(res.outputs["y"], ref_y, rtol=1e-5, atol=1e-5)
        assert rel_l2_items(res.relevance, ref.relevance).max() < 1e-5, comp


def test_constant_along_another_axis_is_not_folded():
    """A Mul by a constant that varies along H (not per channel) stays an element-wise affine op."""
    k = RNG.uniform(0.5, 1.5, size=(1, 1, H, 1)).astype(np.float32)
    model = _conv_chain_model([("Mul", k, False)], False)
    p = rewriter.plan(loader.load(to_bytes(model)), load_composite("epsilon-plus-flat"))
    kinds = {a.node.op_type: a.kind for a in p.assignments}
    assert kinds["Mul"] == "affine"
    x = RNG.normal(size=(2, 3, H, H)).astype(np.float32)
    res = onnx_lrp.Explainer(to_bytes(model), composite="epsilon").explain(x)
    assert_close(res.outputs["y"], run(model, {"x": x})[0], rtol=1e-5, atol=1e-5)


def test_dense_chain_folds_into_matmul():
    """Keras Dense -> BatchNormalization: MatMul -> Add(bias) -> Mul -> Add, folded into one dense layer."""
    w = RNG.normal(size=(6, 5)).astype(np.float32)
    b, s, t = (RNG.normal(size=5).astype(np.float32) for _ in range(3))
    w2 = RNG.normal(size=(5, 3)).astype(np.float32)
    nodes = [node("MatMul", ["x", "w"], "m"), node("Add", ["m", "b"], "mb"), node("Mul", ["mb", "s"], "ms"),
             node("Add", ["ms", "t"], "mt"), node("Relu", ["mt"], "r"), node("MatMul", ["r", "w2"], "y")]
    model = make_model(nodes, {"x": [None, 6]}, ["y"], {"w": w, "b": b, "s": s, "t": t, "w2": w2})
    ref_nodes = [node("Gemm", ["x", "wf", "bf"], "mt"), node("Relu", ["mt"], "r"), node("MatMul", ["r", "w2"], "y")]
    ref_model = make_model(ref_nodes, {"x": [None, 6]}, ["y"], {"wf": w * s, "bf": b * s + t, "w2": w2})
    x = RNG.normal(size=(3, 6)).astype(np.float32)
    p = rewriter.plan(loader.load(to_bytes(model)), load_composite("epsilon"))
    assert sorted(a.kind for a in p.assignments) == ["activation", "bias", "dense", "dense"]
    for comp in ("epsilon", "epsilon-plus", "epsilon-alpha2-beta1"):
        res = onnx_lrp.Explainer(to_bytes(model), composite=comp, **box(comp)).explain(x)
        ref = onnx_lrp.Explainer(to_bytes(ref_model), composite=comp, **box(comp)).explain(x)
        assert_close(res.outputs["y"], run(model, {"x": x})[0], rtol=1e-5, atol=1e-5)
        assert rel_l2_items(res.relevance, ref.relevance).max() < 1e-5, comp


def test_unfoldable_channel_affine_is_batchnorm():
    """Mul -> Add per channel after a residual sum equals a BatchNormalization op there, for every composite."""
    a = RNG.uniform(0.5, 1.5, size=(C, 1, 1)).astype(np.float32)
    c = RNG.uniform(-0.3, 0.3, size=(C, 1, 1)).astype(np.float32)
    w1 = RNG.normal(size=(C, 3, 3, 3)).astype(np.float32)
    w2 = RNG.normal(size=(C, C, 3, 3)).astype(np.float32)
    wd = RNG.normal(size=(C, 3)).astype(np.float32)
    head = [node("Conv", ["x", "w1"], "c1", pads=[1, 1, 1, 1]), node("Relu", ["c1"], "r1"),
            node("Conv", ["r1", "w2"], "c2", pads=[1, 1, 1, 1]), node("Add", ["r1", "c2"], "s")]
    tail = [node("Relu", ["bn"], "r"), node("GlobalAveragePool", ["r"], "g"), node("Flatten", ["g"], "f"),
            node("Gemm", ["f", "wd"], "y")]
    inits = {"w1": w1, "w2": w2, "wd": wd}
    m_mul = make_model(head + [node("Mul", ["s", "a"], "sa"), node("Add", ["sa", "c"], "bn")] + tail,
                       {"x": [None, 3, H, H]}, ["y"], dict(inits, a=a, c=c))
    eps = 1e-5
    m_bn = make_model(head + [node("BatchNormalization", ["s", "g_", "b_", "m_", "v_"], "bn", epsilon=eps)] + tail,
                      {"x": [None, 3, H, H]}, ["y"],
                      dict(inits, g_=a.reshape(-1), b_=c.reshape(-1), m_=np.zeros(C, np.float32),
                           v_=np.full(C, 1.0 - eps, np.float32)))
    x = RNG.normal(size=(2, 3, H, H)).astype(np.float32)
    assert_close(run(m_mul, {"x": x})[0], run(m_bn, {"x": x})[0], rtol=1e-5, atol=1e-5)
    p = rewriter.plan(loader.load(to_bytes(m_mul)), load_composite("epsilon-plus-flat"))
    assert {a.node.name: a.kind for a in p.assignments if a.node.op_type in ("Mul",)} == {"Mul_sa": "batchnorm"}
    for comp in ("epsilon", "epsilon-plus-flat", "epsilon-gamma-box", "attnlrp"):
        r1 = onnx_lrp.Explainer(to_bytes(m_mul), composite=comp, **box(comp)).explain(x).relevance
        r2 = onnx_lrp.Explainer(to_bytes(m_bn), composite=comp, **box(comp)).explain(x).relevance
        assert rel_l2_items(r1, r2).max() < 1e-5, comp


# ------------------------------------------------------------------------------------- Keras recurrent layers
def test_keras_gru_loop_is_unrolled_and_explained():
    """tf2onnx writes a Keras GRU as a Loop whose body reads the sequence by name: the Loop is unrolled at load time
    (onnx_lrp/load/passes/control_flow.py; its trip count is the static sequence length), the forward equals Keras' and LRP-0
    conserves (Keras' default biases are zero). Parity with unroll=True and the torch GRU: tests/load/test_control_flow.py."""
    g = np.load(TWINS / "recurrent.npz")
    ex = onnx_lrp.Explainer(str(TWINS / "gru_keras.onnx"), composite="epsilon", epsilon=0.0)
    res = ex.explain(g["x"], target=0)
    assert_close(res.outputs[next(iter(res.outputs))], g["gru/logits"], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(res.relevance.sum(axis=(1, 2)), g["gru/logits"][:, 0], rtol=1e-5)


def test_keras_lstm_is_refused_or_explained():
    """tf2onnx writes a Keras LSTM as an ONNX LSTM op: refused naming it while it has no handler; once it has one,
    the forward equals Keras' and the relevance is finite."""
    from onnx_lrp.core.errors import UnsupportedError
    g = np.load(TWINS / "recurrent.npz")
    try:
        res = onnx_lrp.Explainer(str(TWINS / "lstm_keras.onnx"), composite="epsilon").explain(g["x"])
    except UnsupportedError as exc:
        assert "ai.onnx::LSTM" in str(exc)
        return
    assert_close(res.outputs[next(iter(res.outputs))], g["lstm/logits"], rtol=1e-4, atol=1e-5)
    assert np.all(np.isfinite(res.relevance))


# ----------------------------------------------------------------------------------------------- Max / Min
@pytest.mark.parametrize("op", ("Max", "Min"))
def test_max_min_of_activations_route_to_the_winner(op):
    """Max/Min of three inputs (one broadcast along the last axis): under the gradient rule the relevance of each
    position goes to the input(s) attaining the extremum, split evenly between ties (numpy oracle)."""
    a = RNG.normal(size=(2, 3, 4)).astype(np.float32)
    b = RNG.normal(size=(2, 3, 4)).astype(np.float32)
    c = RNG.normal(size=(2, 3, 1)).astype(np.float32)
    a[:, 0, :2] = b[:, 0, :2] = 5.0 if op == "Max" else -5.0  # ties between a and b that win
    w = RNG.normal(size=(12, 5)).astype(np.float32)
    nodes = [node(op, ["a", "b", "c"], "m"), node("Reshape", ["m", "shape"], "f"), node("MatMul", ["f", "w"], "y")]
    model = make_model(nodes, {"a": [2, 3, 4], "b": [2, 3, 4], "c": [2, 3, 1]}, ["y"],
                       {"w": w, "shape": np.array([2, 12], np.int64)})
    comp = parse_composite('name = "g"\n[[rules]]\nmatch = { kind = "activation" }\nrule = "pass"\n'
                           '[[rules]]\nmatch = { kind = ["maxpool", "shape"] }\nrule = "gradient"\n'
                           '[[rules]]\nrule = "epsilon"\nepsilon = 0.0\n')
    p = rewriter.plan(loader.load(to_bytes(model)), comp)
    assert {a_.node.op_type: a_.kind for a_ in p.assignments}[op] == "maxpool"
    res = onnx_lrp.Explainer(to_bytes(model), composite=comp, **box(comp)).explain({"a": a, "b": b, "c": c}, target=3)
    xs = [v.astype(np.float64) for v in (a, b, np.broadcast_to(c, a.shape))]
    fn = np.maximum if op == "Max" else np.minimum
    m = fn(fn(xs[0], xs[1]), xs[2])
    r_m = m * w[:, 3].reshape(1, 3, 4)  # LRP-0 on the bias-free MatMul from the logit: gradient x input
    hits = [(x == m).astype(np.float64) for x in xs]
    assert np.sum(sum(hits) > 1) == 4  # the ties are there
    want = [h * r_m / sum(hits) for h in hits]
    want[2] = want[2].sum(axis=2, keepdims=True)
    for name, exp in zip("abc", want):
        assert_close(res.relevance[name], exp, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("composite", ["attnlrp", "cp-lrp"])
def test_flax_transformer_twin(composite):
    """A pre-norm transformer in Flax (jax2onnx: LayerNorm written out with Flax's fast variance
    ``max(mean(x*x) - mean(x)**2, 0)``, nnx.MultiHeadAttention) and its PyTorch twin with the same weights
    (TorchScript: LayerNormalization ops): the same forward and the same relevance per sample (before: the Flax
    export was refused, its normalisations not recognised). scripts/make_transformer_twins.py made the files."""
    ref = np.load(TWINS / "transformer.npz")
    x = ref["x"]
    res = {fw: onnx_lrp.Explainer(TWINS / f"transformer_{fw}.onnx", composite=composite).explain(x, target=1)
           for fw in ("flax", "torch")}
    assert_close(next(iter(res["flax"].outputs.values())), ref["y_flax"], rtol=1e-5, atol=1e-6)
    assert_close(res["torch"].outputs["y"], ref["y_torch"], rtol=1e-5, atol=1e-6)
    assert np.all(np.abs(res["torch"].relevance).reshape(len(x), -1).sum(1) > 0)
    assert np.all(rel_l2_items(res["flax"].relevance, res["torch"].relevance) < 1e-5)
    from onnx_lrp.lrp import patterns
    kinds = [m.name for m in patterns.annotate(loader.load(TWINS / "transformer_flax.onnx").graph)]
    assert kinds.count("layernorm-scale") == 5, kinds


# ------------------------------------------------- Keras-only twins: LRP-0 against TensorFlow's gradient x input
EXTRA = {"conv1d": (13, 17), "conv1d_dilated": (13, 17), "conv1d_causal": (17,), "densenet": (17,)}
LRP0_TOL = 1e-5


@pytest.fixture(scope="module")
def keras_extra():
    with np.load(TWINS / "keras_extra.npz") as data:
        return {k: data[k] for k in data.files}


@pytest.mark.parametrize("name,opset", [(n, o) for n, opsets in EXTRA.items() for o in opsets])
@pytest.mark.parametrize("composite", ["lrp0", "epsilon@0"])
def test_keras_lrp0_is_tensorflow_gradient_times_input(keras_extra, name, opset, composite):
    """Keras Conv1D nets (tf2onnx: Unsqueeze -> Conv -> Squeeze, then the BatchNorm's Mul -> Add; before: not folded
    across the Squeeze, so the epsilon composite passed the BatchNorm: rel-L2 2.4-18) and a DenseNet-like net
    (BatchNorms after concatenations; before, at epsilon = 0: rel-L2 1.5e3) equal TF's float64 gradient x input
    under LRP-0: the twins' LRP-0 composite, and the epsilon composite at epsilon = 0."""
    x, gxi = keras_extra[f"{name}/x"], keras_extra[f"{name}/gxi"]
    comp, params = (LRP0, {}) if composite == "lrp0" else ("epsilon", {"epsilon": 0.0})
    ex = onnx_lrp.Explainer(str(TWINS / f"{name}_keras_op{opset}.onnx"), composite=comp, start="logit", **params)
    res = ex.explain(x)
    assert_close(res.outputs[ex.explained_output], keras_extra[f"{name}/logits"], rtol=1e-4,
                               atol=1e-5)
    assert rel_l2_items(res.relevance, gxi).max() <= LRP0_TOL


@pytest.mark.parametrize("name", ["conv1d", "conv1d_dilated"])
def test_keras_conv1d_batchnorm_is_folded(name):
    """The Mul -> Add of a BatchNormalization after tf2onnx's Conv -> Squeeze is folded into the Conv, as after a
    2-D convolution: no node of kind batchnorm/affine is left."""
    p = rewriter.plan(loader.load(str(TWINS / f"{name}_keras_op17.onnx")), load_composite("epsilon"))
    kinds = [a.kind for a in p.assignments if a.on_path]
    assert "batchnorm" not in kinds and "affine" not in kinds and kinds.count("convolution") == 2


@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("composite", ["epsilon", "epsilon-plus-flat"])
def test_keras_text_model_token_relevance(keras_extra, kind, composite):
    """Keras Embedding -> LSTM | GRU -> Dense on int32 token ids (tf2onnx casts the ids, wraps negative ones with
    Less/Not/Cast/Mul/Add, then Gathers the table; before: refused, "output 'output' is not a float tensor computed
    from the inputs") is explained per token: the relevance at the lookup, summed over the embedding dimension,
    equals that of the same layers exported with the embedded sequence as a float input."""
    ids = keras_extra["text/ids"]
    ex = onnx_lrp.Explainer(str(TWINS / f"text_{kind}_keras.onnx"), composite=composite)
    res = ex.explain(ids)
    assert_close(res.outputs[ex.explained_output], keras_extra[f"text_{kind}/logits"], rtol=1e-4,
                               atol=1e-5)
    assert res.relevance.shape == ids.shape and np.isfinite(res.relevance).all()
    ref = onnx_lrp.Explainer(str(TWINS / f"text_{kind}_embedded_keras.onnx"), composite=composite).explain(
        keras_extra[f"text_{kind}/embedded"], target=res.target)
    np.testing.assert_array_equal(res.target, ref.target)
    assert rel_l2_items(res.relevance, ref.relevance.sum(-1)).max() < 1e-5


@pytest.mark.parametrize("opset", [17, 23])
@pytest.mark.parametrize("composite", ["lrp0", "epsilon@0"])
def test_flax_resblock_lrp0_is_jax_gradient_times_input(opset, composite):
    """A Flax (nnx) CNN with max/average pooling, a crop and residual blocks whose sum is followed by a BatchNorm
    (jax2onnx: a BatchNormalization op that cannot be folded; opset 23 writes the crop as GatherND). Before: the
    epsilon composite at epsilon = 0 passed that BatchNorm (zennit's Pass), rel-L2 61 to JAX's gradient x input;
    now LRP-0 reaches it too (rules/composite.py: lrp0_batchnorm)."""
    with np.load(TWINS / "flax_extra.npz") as g:
        x, logits, gxi = g["x"], g["logits"], g["gxi"]
    comp, params = (LRP0, {}) if composite == "lrp0" else ("epsilon", {"epsilon": 0.0, "stabilizer": 0.0})
    ex = onnx_lrp.Explainer(str(TWINS / f"resflax_flax_op{opset}.onnx"), composite=comp, start="logit", **params)
    res = ex.explain(x)
    assert_close(res.outputs[ex.explained_output], logits, rtol=1e-4, atol=1e-5)
    assert rel_l2_items(res.relevance, gxi).max() <= LRP0_TOL


# ------------------------------------------------------------ Slices bounded by the dynamic batch size (jax2onnx)
def _batch_bounded_slice(form: str) -> bytes:
    """x [N, 5, 3] -> Slice(x[:, 1:4, :]) -> MatMul w [3, 2] -> ReduceSum over axis 1 -> y [N, 2], the Slice's ends
    written as jax2onnx writes them for a dynamic batch: ``Concat(Gather(Shape(x), 0), 4, 3)`` ("concat"),
    ``starts + Concat(Gather(Shape(x), 0), 3, 3)`` (lax.dynamic_slice: "add"), or with the (dynamic) length T of
    axis 1 in the batch's place ("wrong": not the sliced axis' length, so not "to the end")."""
    w = np.array([[1.0, -0.5], [0.25, 1.0], [0.5, 0.75]], np.float32)
    pick = [1] if form == "wrong" else [0]
    nodes = [node("Shape", ["x"], "shape", name="shape"), node("Gather", ["shape", "pick"], "n", axis=0, name="n")]
    inits = {"w": w, "pick": np.array(pick, np.int64), "starts": np.array([0, 1, 0], np.int64),
             "axes": np.array([0, 1, 2], np.int64), "one": np.array([1], np.int64)}
    if form == "add":
        inits.update(size1=np.array([3], np.int64), size2=np.array([3], np.int64))
        nodes += [node("Concat", ["n", "size1", "size2"], "sizes", axis=0, name="sizes"),
                  node("Add", ["starts", "sizes"], "ends", name="ends")]
    else:
        inits.update(end1=np.array([4], np.int64), end2=np.array([3], np.int64))
        nodes.append(node("Concat", ["n", "end1", "end2"], "ends", axis=0, name="ends"))
    nodes += [node("Slice", ["x", "starts", "ends", "axes"], "s", name="crop"),
              node("MatMul", ["s", "w"], "h", name="mm"), node("ReduceSum", ["h", "one"], "y", keepdims=0, name="sum")]
    model = make_model(nodes, {"x": ["N", "T" if form == "wrong" else 5, 3]}, ["y"], inits)
    del model.graph.output[:]  # shape inference cannot tell the sliced length: declare the output
    model.graph.output.append(onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N", 2]))
    return to_bytes(model)


@pytest.mark.parametrize("form", ["concat", "add"])
def test_slice_ends_from_the_dynamic_batch_size_are_to_the_end(form):
    """LRP-0 of the linear net is x * gradient: rows 1-3 get x w[:, target], rows 0 and 4 nothing (numpy oracle);
    before, these Slices were refused ("starts/ends/axes/steps are not constants")."""
    model = _batch_bounded_slice(form)
    x = np.random.default_rng(0).normal(size=(3, 5, 3)).astype(np.float32)
    w = np.array([[1.0, -0.5], [0.25, 1.0], [0.5, 0.75]])
    res = onnx_lrp.Explainer(model, composite="epsilon", epsilon=0.0, stabilizer=0.0).explain(x, target=1)
    assert_close(res.outputs["y"], x[:, 1:4] .dot(w).sum(1), rtol=1e-5, atol=1e-6)
    want = x * w[:, 1]
    want[:, [0, 4]] = 0
    assert_close(res.relevance, want, rtol=1e-5, atol=1e-7)


def test_slice_ends_from_another_axis_length_stay_refused():
    with pytest.raises(onnx_lrp.UnsupportedError, match=r"\[crop\]: starts/ends/axes/steps are not constants"):
        onnx_lrp.Explainer(_batch_bounded_slice("wrong"), composite="epsilon")


# ------------------------------------------------------------ an affine chain before a SiLU written out (jax2onnx)
@pytest.mark.parametrize("act", ["silu", "gelu"])
def test_affine_before_a_written_out_activation_is_its_own_layer(act):
    """x -> Mul(s) -> Add(b) -> f(y) -> MatMul(w) (a decomposed norm's scale and shift, then SiLU = y * sigmoid(y) or
    tanh-GELU as jax2onnx writes them). attnlrp, numpy oracle (LXT): LRP-0 on the MatMul, the identity rule on f,
    LRP-0 on the affine (the shift absorbs its share): R_x = x s (f(y) / y) w[:, t]. Before, the Mul and Add were held
    inside the activation's pattern and passed the relevance unchanged: R_x = f(y) w[:, t]."""
    rng = np.random.default_rng(0)
    s, b = np.array([1.5, -0.5, 2.0, 0.75], np.float32), np.array([0.3, -0.2, 0.1, 0.5], np.float32)
    w = rng.normal(size=(4, 3)).astype(np.float32)
    nodes = [node("Mul", ["x", "s"], "xs", name="scale"), node("Add", ["xs", "b"], "y", name="shift")]
    inits = {"s": s, "b": b, "w": w}
    if act == "silu":
        nodes += [node("Sigmoid", ["y"], "g", name="sig"), node("Mul", ["y", "g"], "f", name="silu")]
    else:  # 0.5 y (1 + tanh(sqrt(2 / pi) (y + 0.044715 y^3)))
        inits.update(half=np.float32(0.5), one=np.float32(1.0), c=np.float32(np.sqrt(2 / np.pi)),
                     k=np.float32(0.044715), three=np.float32(3.0))
        nodes += [node("Pow", ["y", "three"], "y3", name="cube"), node("Mul", ["y3", "k"], "ky3", name="k"),
                  node("Add", ["y", "ky3"], "inner", name="inner"), node("Mul", ["inner", "c"], "arg", name="c"),
                  node("Tanh", ["arg"], "t", name="tanh"), node("Add", ["t", "one"], "t1", name="t1"),
                  node("Mul", ["y", "half"], "hy", name="hy"), node("Mul", ["hy", "t1"], "f", name="gelu")]
    nodes.append(node("MatMul", ["f", "w"], "out", name="mm"))
    model = to_bytes(make_model(nodes, {"x": ["N", 4]}, ["out"], inits))
    x = rng.normal(size=(5, 4)).astype(np.float32)
    y = x.astype(np.float64) * s + b
    f = y / (1 + np.exp(-y)) if act == "silu" else 0.5 * y * (1 + np.tanh(np.sqrt(2 / np.pi) * (y + 0.044715 * y ** 3)))
    res = onnx_lrp.Explainer(model, composite="attnlrp").explain(x, target=1)
    assert_close(res.outputs["out"], f @ w, rtol=1e-5, atol=1e-6)
    want = x * s * (f / y) * w[:, 1]
    assert rel_l2_items(res.relevance, want).max() < 1e-5


# ------------------------------------------------------------ a hand-written LayerNorm as jax2onnx writes it
def _hand_layernorm(where: bool) -> bytes:
    """x [N, 4] -> (x - mean) / sqrt(var + eps) -> MatMul w [4, 3], written as jax2onnx writes ``keepdims=True``
    reductions and ``jnp.var``: ReduceSum / ReduceSumSquare with keepdims=0, then Reshape to [N, 1] and Expand to
    [N, 1] (both shapes from Shape(...)), the divisor n - ddof guarded by a Where with a constant condition."""
    w = np.array([[1.0, -0.5, 0.25], [0.5, 1.0, -1.0], [-0.75, 0.25, 0.5], [0.2, -0.3, 1.0]], np.float32)
    inits = {"w": w, "ax": np.array([1], np.int64), "zero": np.array([0], np.int64), "one": np.array([1], np.int64),
             "n": np.float32(4.0), "eps": np.float32(1e-5), "cond": np.array(True), "nan": np.float32(np.nan)}
    nodes = []

    def keepdims(red_op, src, tag):
        nodes.extend([
            node(red_op, [src, "ax"] if red_op == "ReduceSum" else [src], f"{tag}_r", keepdims=0,
                 **({} if red_op == "ReduceSum" else {"axes": [1]}), name=f"{tag}_red"),
            node("Shape", [f"{tag}_r"], f"{tag}_shape", name=f"{tag}_shape"),
            node("Gather", [f"{tag}_shape", "zero"], f"{tag}_n", axis=0, name=f"{tag}_gather"),
            node("Concat", [f"{tag}_n", "one"], f"{tag}_target", axis=0, name=f"{tag}_cat"),
            node("Reshape", [f"{tag}_r", f"{tag}_target"], f"{tag}_kept", name=f"{tag}_reshape"),
            node("Expand", [f"{tag}_kept", f"{tag}_target"], f"{tag}_b", name=f"{tag}_expand"),
            node("Div", [f"{tag}_b", "n"], f"{tag}_mean", name=f"{tag}_div")])
        return f"{tag}_mean"
    mu = keepdims("ReduceSum", "x", "mu")
    nodes.append(node("Sub", ["x", mu], "d", name="center"))
    var = keepdims("ReduceSumSquare", "d", "var")
    if where:
        nodes.append(node("Where", ["cond", var, "nan"], "var_ok", name="guard"))
        var = "var_ok"
    nodes += [node("Add", [var, "eps"], "ve", name="eps"), node("Sqrt", ["ve"], "sd", name="sqrt"),
              node("Div", ["d", "sd"], "z", name="normalize"), node("MatMul", ["z", "w"], "y", name="mm")]
    return to_bytes(make_model(nodes, {"x": ["N", 4]}, ["y"], inits))


@pytest.mark.parametrize("where", [False, True])
def test_hand_written_layernorm_is_a_held_normalisation(where):
    """Refused before (ReduceSumSquare has no handler; the Div's scale came through Reshape/Expand/Where). Now LRP-0
    with the std held (numpy oracle): R_x = x (w_t - mean(w_t)) / std; the forward is unchanged."""
    x = np.random.default_rng(1).normal(size=(5, 4)).astype(np.float32)
    w = np.array([[1.0, -0.5, 0.25], [0.5, 1.0, -1.0], [-0.75, 0.25, 0.5], [0.2, -0.3, 1.0]])
    x64 = x.astype(np.float64)
    sd = np.sqrt(x64.var(1, keepdims=True) + 1e-5)
    res = onnx_lrp.Explainer(_hand_layernorm(where), composite="epsilon", epsilon=0.0, stabilizer=0.0).explain(
        x, target=2)
    assert_close(res.outputs["y"], (x64 - x64.mean(1, keepdims=True)) / sd @ w, rtol=1e-5, atol=1e-6)
    want = x64 * (w[:, 2] - w[:, 2].mean()) / sd
    assert rel_l2_items(res.relevance, want).max() < 1e-5
