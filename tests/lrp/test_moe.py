"""Mixtral-style sparse mixture of experts (router Linear -> softmax -> TopK(2) -> renormalised weights -> SwiGLU
experts -> weighted sum), exported by TorchScript at opset 17 with the two usual routings: top-k weights scattered
into a dense gate (ScatterElements) and selected expert outputs gathered (GatherElements); see
scripts/make_moe_goldens.py. The routing weights act as gates (signal-take-all: held constant, no relevance through
the router; LXT's explicit Mixtral CP-LRP composite does the same). References: embeds x gradient of the torch block
with the routing weights detached and LXT's expert rules (attnlrp: identity on SiLU, uniform on the SwiGLU product;
cp-lrp: the SiLU factor held). Before the routing weights were recognised as gates, the products got the uniform
rule and the relevance was off by relative L2 0.58 (attnlrp) / 0.30 (cp-lrp)."""
from __future__ import annotations

import numpy as np
import pytest

import onnx_lrp
from util import GOLDENS, assert_close, explain

MOE = GOLDENS / "moe"
EXPERTS = 4
EXPERT_OUT = [f"/experts.{i}/w2/MatMul_output_0" for i in range(EXPERTS)]
ROUTER = ["/gate/MatMul_output_0", "/Softmax_output_0", "/TopK_output_0"]


def golden_run(routing, composite, relevance_at=()):
    """(golden, Explanation) of the MoE export with ``routing`` on the golden's embeddings and target (its logits
    checked against the golden's)."""
    d = np.load(MOE / "moe.npz")
    res = explain(MOE / f"moe_{routing}_torchscript17.onnx", d["embeds"][None], composite, int(d["target"]),
                  relevance_at=list(relevance_at))
    assert_close(res.outputs["logits"][0], d["logits"], rtol=1e-5, atol=1e-5)
    return d, res


@pytest.mark.parametrize("composite", ["attnlrp", "cp-lrp"])
@pytest.mark.parametrize("routing", ["scatter", "gather", "topk_softmax"])
def test_moe_matches_torch_reference(routing, composite):
    d, res = golden_run(routing, composite)
    want = d[f"{routing}_{composite}"].astype(np.float64)
    err = np.linalg.norm(res.relevance[0] - want) / np.linalg.norm(want)
    assert err <= 1e-4, err


@pytest.mark.parametrize("routing", ["scatter", "gather", "topk_softmax"])
def test_moe_relevance_reaches_only_the_selected_experts(routing):
    """Per token, the relevance reaching each expert's output: zero (exactly) for the experts the router did not
    select, the reference's value for the two it selected; the router (logits, softmax, top-k weights) gets none."""
    d, res = golden_run(routing, "attnlrp", EXPERT_OUT + ROUTER)
    per_expert = np.stack([res.relevance_at[n].reshape(-1, res.relevance_at[n].shape[-1]).sum(-1)
                           for n in EXPERT_OUT], -1)                      # [tokens, experts]
    selected = np.zeros_like(per_expert, dtype=bool)
    np.put_along_axis(selected, d["selected"], True, axis=1)
    assert np.all(per_expert[~selected] == 0.0)
    assert np.all(per_expert[selected] != 0.0)
    want = d[f"{routing}_expert_attnlrp"]
    assert np.abs(per_expert - want).max() <= 1e-4 * np.abs(want).max()
    for n in ROUTER:
        assert np.all(res.relevance_at[n] == 0.0), n


def test_routing_weights_are_matched_as_gates():
    """The matcher finds the routing factor of the expert product in both exports (the TopK values through the
    renormalisation, the unsqueeze and the scatter) and holds it; the signal is the experts' output (not routed);
    no other Mul of the block is a routed product."""
    from onnx_lrp import load as loader
    from onnx_lrp.lrp import patterns

    for routing in ("scatter", "gather", "topk_softmax"):
        graph = loader.load((MOE / f"moe_{routing}_torchscript17.onnx").read_bytes()).graph
        matches = [m for n in graph if n.op_type == "Mul" and (m := patterns.match_gate(n)[0]) is not None]
        routed = [m for m in matches if patterns.routing_gate(m.gate) is not None]
        assert len(routed) == 1, routing
        assert patterns.routing_gate(routed[0].gate).op_type == "TopK"
        assert patterns.routing_gate(routed[0].source) is None


@pytest.mark.parametrize("composite", ["attnlrp", "cp-lrp"])
def test_transformers_mixtral_matches_lxt_with_gated_routing(composite):
    """transformers' own MixtralForCausalLM (one layer, 4 experts, top-2, random weights) exported by TorchScript:
    its MoE loop becomes OneHot/NonZero/Gather and index_add_ a ScatterElements(reduction=add). Reference: LXT's
    efficient patches (attention, RMSNorm, gated MLP rules) with the routing weights detached. Before the routing
    weights were gates: relative L2 0.22 (attnlrp) / 0.32 (cp-lrp)."""
    d = np.load(MOE / "mixtral.npz")
    ex = onnx_lrp.Explainer(str(MOE / "mixtral_embeds_torchscript17.onnx"), composite=composite)
    res = ex.explain(d["embeds"][None], target=int(d["target"]))
    assert_close(res.outputs["logits"][0], d["logits"], rtol=1e-5, atol=1e-5)
    want = d[composite].astype(np.float64)
    err = np.linalg.norm(res.relevance[0] - want) / np.linalg.norm(want)
    assert err <= 1e-4, err


@pytest.mark.parametrize("composite", ["epsilon", "epsilon-plus-flat"])
def test_pure_mlp_moe_under_cnn_composites(composite):
    """A MoE with ReLU experts under the CNN composites: the router (Softmax, TopK, renormalisation, scatter) feeds
    only the routing weights and is held (no rule needed, no relevance), the weights are gates. epsilon at 0 is
    LRP-0 = gradient x input with the weights detached; every composite gives relevance only to selected experts."""
    d = np.load(MOE / "moe.npz")
    kw = {"epsilon": 0.0} if composite == "epsilon" else {}
    ex = onnx_lrp.Explainer(str(MOE / "moe_relu_scatter_torchscript17.onnx"), composite=composite,
                            relevance_at=EXPERT_OUT + ROUTER, **kw)
    res = ex.explain(d["embeds"][None], target=int(d["relu_target"]))
    assert_close(res.outputs["logits"][0], d["relu_logits"], rtol=1e-5, atol=1e-5)
    assert np.all(np.isfinite(res.relevance))
    per_expert = np.stack([res.relevance_at[n].sum(-1) for n in EXPERT_OUT], -1)
    selected = np.zeros_like(per_expert, dtype=bool)
    np.put_along_axis(selected, d["relu_selected"], True, axis=1)
    assert np.all(per_expert[~selected] == 0.0) and np.all(per_expert[selected] != 0.0)
    for n in ROUTER:
        assert np.all(res.relevance_at[n] == 0.0), n
    if composite == "epsilon":
        want = d["relu_lrp0"].astype(np.float64)
        assert np.linalg.norm(res.relevance[0] - want) / np.linalg.norm(want) <= 1e-4


def test_dense_softmax_weights_and_topk_indices_are_no_routing_gate():
    """Only TopK's values route: a softmax-weighted (dense, every expert) mixture ``h * softmax(s)`` stays a product
    of two activations (the uniform rule under attnlrp), and TopK's indices output is no routing weight."""
    from util import make_model, node, to_bytes

    from onnx_lrp import load as loader
    from onnx_lrp.lrp import patterns

    nodes = [node("Softmax", ["s"], ["p"], axis=-1), node("Mul", ["h", "p"], ["y"], name="dense"),
             node("TopK", ["s", "k"], ["v", "i"]), node("Cast", ["i"], ["fi"], to=1),
             node("Mul", ["h2", "fi"], ["y2"], name="by_index")]
    m = make_model(nodes, {"h": (2, 4), "s": (2, 4), "h2": (2, 2)}, ["y", "y2"],
                   inits={"k": np.array([2], np.int64)})
    graph = loader.load(to_bytes(m)).graph
    dense = next(n for n in graph if n.name == "dense")
    assert patterns.match_gate(dense)[0] is None
    assert "TopK routing weights" in patterns.match_gate(dense)[1]
    assert patterns.routing_gate(next(n for n in graph if n.name == "by_index").inputs[1]) is None
