"""Transformers end to end: onnx-lrp's attnlrp / cp-lrp composites against LXT 2.1 goldens.

The goldens (tests/goldens/transformers, made by scripts/make_lxt_goldens.py in a separate venv with LXT and
transformers 4.53) are small random-weight BERT (sequence classifier, padded attention mask), GPT-2 and LLaMA
(grouped-query attention, rotary embeddings) explained with LXT's efficient AttnLRP, and torchvision's ViT with
LXT's CP-LRP; each exported by torch.onnx's TorchScript exporter at opset 17, at opset 14 (decomposed LayerNorm)
and by the dynamo exporter, with the embeddings as a float input and with token ids. GPT-2 and LLaMA are also
compared with LXT's CP-LRP (``<model>_cp-lrp.npz``). No torch is needed here.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

import onnx_lrp
from onnx_lrp.io import tokens
from util import GOLDENS, assert_close, rel_l2

TRANSFORMERS = GOLDENS / "transformers"
TOL = 1e-3  # relative L2 error to LXT, per sample


def _cases():
    status = json.loads((TRANSFORMERS / "exports.json").read_text()) if (TRANSFORMERS / "exports.json").exists() else {}
    return sorted(k for k, v in status.items() if v == "ok" and (TRANSFORMERS / f"{k}.onnx").exists())


def _cp_cases():
    return [(c, "cp-lrp") for c in _cases() if c.split("_")[0] in ("gpt2", "llama")
            and (TRANSFORMERS / f"{c.split('_')[0]}_cp-lrp.npz").exists()]


# The composites use LRP-0 (epsilon = 0) and carry relevance in gradient form (no denominators); a tiny epsilon
# instead sends every rule through its relevance form (R / stab(z), then x * J^T s): both must match LXT.
FORMS = {"gradient-form": {}, "relevance-form": {"epsilon": 1e-12}}


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("case,mode", [(c, "attnlrp") for c in _cases()] + _cp_cases())
def test_matches_lxt(case, mode, form):
    model, kind, _ = case.split("_", 2)
    g = np.load(TRANSFORMERS / (f"{model}.npz" if mode == "attnlrp" else f"{model}_{mode}.npz"))
    ex = onnx_lrp.Explainer(TRANSFORMERS / f"{case}.onnx", composite=str(g["composite"]), **FORMS[form])
    if kind == "image":
        feeds, ref = {"image": g["image"]}, g["relevance_image"]
    elif kind == "embeds":
        feeds, ref = {"embeds": g["embeds"]}, g["relevance_embeds"]
    else:
        feeds, ref = {"input_ids": g["input_ids"]}, g["relevance_tokens"]
    if "attention_mask" in g:
        feeds["attention_mask"] = g["attention_mask"]
    res = ex.explain(feeds)
    logits = res.outputs["logits"]
    np.testing.assert_allclose(logits, g["logits"], rtol=1e-4, atol=1e-4)  # the export computes what torch does
    assert int(res.target[0]) == int(g["target"])
    if "position" in g and int(g["position"]) >= 0:
        assert int(res.position[0]) == int(g["position"])  # the default: the last position
    rel = res.relevance[list(feeds)[0]] if isinstance(res.relevance, dict) else res.relevance
    assert rel.shape == ref.shape
    err = rel_l2(rel, ref)
    assert err <= TOL, f"{case}: relative L2 error to LXT {err:.2e}"


def test_token_ids_and_embeddings_agree():
    """Relevance per token id is the embedding relevance summed over the embedding dimension."""
    case = next((c for c in _cases() if c.startswith("llama_ids")), None)
    if case is None:
        pytest.skip("no LLaMA goldens")
    g = np.load(TRANSFORMERS / "llama.npz")
    ids = onnx_lrp.Explainer(TRANSFORMERS / "llama_ids_torchscript.onnx", composite="attnlrp").explain(g["input_ids"])
    emb = onnx_lrp.Explainer(TRANSFORMERS / "llama_embeds_torchscript.onnx", composite="attnlrp").explain(g["embeds"])
    assert ids.relevance.shape == g["input_ids"].shape
    assert_close(ids.relevance, emb.relevance.sum(-1), rtol=1e-4, atol=1e-6)


def test_relevance_at_an_inner_tensor_and_cp_lrp_differs():
    """relevance_at picks any float tensor; CP-LRP and AttnLRP differ on a causal LM (softmax path)."""
    path = TRANSFORMERS / "gpt2_embeds_torchscript.onnx"
    if not path.exists():
        pytest.skip("no GPT-2 goldens")
    g = np.load(TRANSFORMERS / "gpt2.npz")
    from onnx_lrp import load as loader
    graph = loader.load(path).graph
    ln = next(n for n in graph if n.op_type == "LayerNormalization")
    name = ln.outputs[0].name
    a = onnx_lrp.Explainer(path, composite="attnlrp", relevance_at=[name]).explain(g["embeds"])
    c = onnx_lrp.Explainer(path, composite="cp-lrp").explain(g["embeds"])
    assert a.relevance_at[name].shape == tuple(ln.outputs[0].shape)
    assert np.abs(a.relevance_at[name]).sum() > 0
    assert rel_l2(c.relevance, a.relevance) > 1e-3


# ------------------------------------------------------------------------------------------ token heatmaps
def test_token_heatmap_html_and_terminal(tmp_path):
    toks = ["The", "<cat>", " sat", "&"]
    rel = np.array([[0.5, -1.0, 0.0, 0.25]])
    f = tmp_path / "tokens.txt"
    f.write_text("\n".join(toks) + "\n", encoding="utf-8")
    assert tokens.read_tokens(f) == toks
    page = tokens.html_page(toks, rel)
    assert "&lt;cat&gt;" in page and "&amp;" in page and "<cat>" not in page
    assert "rgb(0,0,255)" in page  # the most negative token: full blue
    assert "rgb(255,128,128)" in page  # half the largest magnitude, positive: half red
    assert "rgb(255,255,255)" in page  # zero: white
    out = tmp_path / "t.html"
    tokens.write_html(out, toks, rel)
    assert out.read_text(encoding="utf-8") == page
    term = tokens.terminal(toks, rel)
    assert term.count("\x1b[0m") == 4 and "\x1b[48;2;0;0;255m" in term
    assert tokens.terminal(toks, rel, color=False).split() == ["The[+0.5]", "<cat>[-1]", "sat[+0]", "&[+0.25]"]
    # (T, H) embedding relevance is summed per token
    np.testing.assert_allclose(tokens.per_token(np.ones((1, 4, 3))), [3, 3, 3, 3])
    with pytest.raises(onnx_lrp.InputError, match="3 tokens but 4"):
        tokens.html_page(toks[:3], rel)
    with pytest.raises(onnx_lrp.InputError, match="not found"):
        tokens.read_tokens(tmp_path / "missing.txt")


def test_dynamic_axes_export_explains_a_batch():
    """BERT exported with dynamic batch and sequence axes: a batch of two items gives LXT's relevance per item."""
    path = TRANSFORMERS / "bert_ids_torchscriptdyn.onnx"
    if not path.exists():
        pytest.skip("no dynamic-axes BERT golden")
    g = np.load(TRANSFORMERS / "bert.npz")
    ex = onnx_lrp.Explainer(path, composite="attnlrp")
    ids = np.repeat(g["input_ids"], 2, 0)
    mask = np.repeat(g["attention_mask"], 2, 0)
    res = ex.explain({"input_ids": ids, "attention_mask": mask}, target=int(g["target"]))
    assert res.relevance.shape == ids.shape
    for row in res.relevance:
        assert rel_l2(row, g["relevance_tokens"][0]) <= TOL


@pytest.mark.parametrize("kind", ["embeds", "ids"])
def test_dynamic_sequence_length_is_causal(kind):
    """GPT-2 exported with dynamic batch and sequence axes (causal mask and positions computed from the input's
    shape at run time): explaining position 4 of the full sequence equals explaining the last position of the first
    5 tokens (a causal LM's logit there cannot see later tokens, which get no relevance), and a batch of two gives
    the single item's relevance twice."""
    path = TRANSFORMERS / f"gpt2_{kind}_torchscriptdyn.onnx"
    if not path.exists():
        pytest.skip("no dynamic-axes GPT-2 golden")
    g = np.load(TRANSFORMERS / "gpt2.npz")
    feed = "embeds" if kind == "embeds" else "input_ids"
    x = g[feed]
    ex = onnx_lrp.Explainer(path, composite="attnlrp")
    full = ex.explain({feed: x}, position=4)
    short = ex.explain({feed: x[:, :5]})  # default: the last position
    assert int(short.position[0]) == 4 and int(full.position[0]) == 4
    assert int(short.target[0]) == int(full.target[0])
    assert np.abs(full.relevance[:, 5:]).max() == 0.0
    assert rel_l2(full.relevance[:, :5], short.relevance) <= 1e-5
    twice = ex.explain({feed: np.repeat(x, 2, 0)}, position=(-4))
    once = ex.explain({feed: x}, position=4)
    for row in twice.relevance:
        assert rel_l2(row, once.relevance[0]) <= 1e-5


def test_cli_colours_tokens_and_writes_the_html_page(tmp_path, run_cli):
    """`onnx-lrp explain --tokens --html` on token ids: the page colours each token by the API's relevance (the
    command in-process: conftest's run_cli)."""
    g = np.load(TRANSFORMERS / "llama.npz")
    ids = g["input_ids"]
    np.save(tmp_path / "ids.npy", ids)
    tokens = [f"tok{i}" for i in range(ids.shape[1])]
    (tmp_path / "tokens.txt").write_text("\n".join(tokens) + "\n")
    model = TRANSFORMERS / "llama_ids_torchscript.onnx"
    code, out, err = run_cli("explain", model, tmp_path / "ids.npy", "--composite", "attnlrp", "--tokens",
                             tmp_path / "tokens.txt", "--html", tmp_path / "t.html", "-o", tmp_path / "r.npy",
                             cwd=tmp_path)
    assert code == 0, err
    rel = onnx_lrp.Explainer(model, composite="attnlrp").explain(ids).relevance[0]
    assert_close(np.load(tmp_path / "r.npy")[0], rel, rtol=1e-5, atol=1e-7)
    page = (tmp_path / "t.html").read_text()
    assert all(t in page for t in tokens)
    top = tokens[int(np.argmax(rel))]
    assert f'rgb(255,0,0)" title="{rel.max():.6g}">{top}<' in page  # the most relevant token is pure red
    assert "tok0[" in out  # terminal line without colour (stdout is not a tty)
    code, out, err = run_cli("explain", model, tmp_path / "ids.npy", "--composite", "attnlrp", "--html",
                             tmp_path / "u.html", cwd=tmp_path)
    assert code == 2 and "--tokens" in err and not (tmp_path / "u.html").exists()
