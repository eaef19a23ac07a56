"""``onnx-lrp explain MODEL INPUT``: relevance of inputs, written as .npy/.npz and optionally as a heatmap."""
from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Callable

import click
import numpy as np

from onnx_lrp.core.errors import InputError, OutputError
from onnx_lrp.core.files import printable
from onnx_lrp.io import heatmap as hm
from onnx_lrp.io.inputs import input_kind, items_kind
from onnx_lrp.io.kinds import Kind, relevance_name
from onnx_lrp.run.batches import explain_chunks, merge, slices
from onnx_lrp.run import given_past
from onnx_lrp.run.explanation import Explanation

from .class_targets import parse_target, resolve_named, target_option
from .dataset import DATASET_KEYS, dataset_mode, dataset_options, run_dataset
from .helpfmt import Command, Row
from .io import AtomicOutputs, check_writable, guard
from .methods import (METHOD_KEYS, method_explainer, method_keywords, method_options, with_base_params,
                      with_lrp_method)
from .options import (BINDING_ROWS, INPUT_ROWS, RULE_ROWS, common, device_note, explainer_setup, input_options,
                      precision_note, uses_tf32)
from .text import TEXT_KEYS, run_text, text_mode, text_options


PROGRESS_AFTER_S = 2.0  # show a progress bar when the whole run is expected to take longer than this
SUMMARY_ROWS = 20


def _say(msg: str) -> None:
    click.echo(f"onnx-lrp: {msg}", err=True)


EXAMPLES = [
    "onnx-lrp explain models/digits_cnn.onnx models/samples/png \\",
    "    --heatmap digits.png -o digits.npz",
    "onnx-lrp explain resnet18.onnx cat.jpg --mean 0.485,0.456,0.406 \\",
    "    --std 0.229,0.224,0.225 -c epsilon-gamma-box --heatmap cat.heat.png",
    "onnx-lrp explain models/text/sentiment.onnx --text \"a gripping, funny film\"",
    "onnx-lrp explain model.onnx images/ --out-dir relevance/   # a dataset",
]
DOCS = ("Image models", "Text and transformers", "Explaining a whole dataset")
SECTIONS = [
    ("What to explain", ["target", Row(("labels",), "Class names: JSON list, lines, config.json.",
                                       left="--labels FILE"),
                         "output_name", "position", "start", "relevance_at", *RULE_ROWS,
                         Row(METHOD_KEYS, "Methods beyond LRP (see the docs: Methods).")]),
    ("Inputs", [*INPUT_ROWS, *BINDING_ROWS]),
    ("Outputs", ["out", "heatmap_path", Row(("cmap", "heatmap_style"), "Heatmap colours and layout.",
                                            left="--cmap, --heatmap-style"), "as_json"]),
    ("Running", [Row(tuple(k for k in TEXT_KEYS if k != "labels"), "A text instead of INPUT (see the docs)."),
                 Row(("tokens_path", "html_path", "token_scale"), "Token views of token-id arrays."),
                 Row(("device", "tf32"), "cpu (default), cuda or auto; TF32 on CUDA.", left="--device D, --tf32"),
                 "batch_size",
                 Row(("precision", "precise"), "Numerics of float16 and deep models.", left="--precision P, --precise"),
                 Row(("strict", "deployed"), "Exit 1 if not conserved; deployed run.",
                     left="--strict, --deployed D"),
                 "out_dir", Row(DATASET_KEYS[1:], "Dataset mode's settings.")]),
]


@click.command("explain", cls=Command, examples=EXAMPLES, sections=SECTIONS, docs=DOCS)
@click.argument("model", metavar="MODEL")
@click.argument("input_path", metavar="[INPUT]", required=False)
@common
@click.option("--target", "-t", default="argmax", metavar="INT|NAME[,..]",
              help="Class index or name (per item) or argmax.")
@click.option("--output", "output_name", default=None, metavar="NAME",
              help="Output to explain (default: the first).")
@click.option("--position", default=None, metavar="INT[,INT...]",
              help="Sequence outputs: position (default: last).")
@click.option("--start", type=click.Choice(["logit", "one-hot"]), default="logit", metavar="logit|one-hot",
              help="Start: the logit (default) or 1 (zennit).")
@click.option("--device", type=click.Choice(["cpu", "cuda", "auto"]), default="cpu", metavar="cpu|cuda|auto",
              help="onnxruntime device; auto takes CUDA when available and says which it used.")
@click.option("--tf32", is_flag=True, help="CUDA: TF32 convolutions and matrix products (faster, drifts; docs/gpu.md).")
@click.option("--precision", type=click.Choice(["auto", "model", "float32"]), default="auto",
              metavar="auto|model|float32",
              help="What a float16/bfloat16 model's relevance is computed in (docs/deployed.md).")
@click.option("--deployed", type=click.Choice(["auto", "on", "off"]), default="auto", metavar="auto|on|off",
              callback=lambda ctx, param, v: {"auto": "auto", "on": True, "off": False}[v],
              help="Run a quantized/float16 model's deployed form beside, for its outputs and gap (auto: unless "
                   "too large for memory).")
@click.option("--batch-size", type=click.IntRange(min=1), default=32, help="Items per model run (default 32).", metavar="N")
@click.option("--relevance-at", "relevance_at", multiple=True, metavar="TENSOR",
              help="Also this tensor's relevance (repeatable).")
@click.option("-o", "--out", "out", default=None, metavar="OUT.npy|OUT.npz",
              help="Relevance (default ./INPUT.relevance.npy).")
@click.option("--heatmap", "heatmap_path", default=None, metavar="FILE.png",
              help="Also a heatmap, one tile per item.")
@click.option("--cmap", type=click.Choice(list(hm.CMAPS)), default="bwr",
              help="Heatmap colour map (zennit's; default bwr).")
@click.option("--heatmap-style", type=click.Choice(hm.STYLES), default="beside",
              help="The input beside the heatmap (default), the heatmap over it, or alone.")
@input_options
@click.option("--tokens", "tokens_path", default=None, metavar="FILE.txt|FILE.json",
              help="Token text for token-id arrays: one per line, or a JSON list of lists (one per item).")
@click.option("--token-scale", type=click.FloatRange(min=50, max=100), default=100, metavar="PERCENTILE",
              help="Token colours: full colour at this percentile of |relevance| (default 100).")
@click.option("--html", "html_path", default=None, metavar="FILE.html",
              help="With --tokens: an HTML page with the tokens coloured by relevance.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option("--precise", is_flag=True,
              help="onnxruntime without layout optimisations: rounds otherwise (not closer to float64), ~13 % slower.")
@click.option("--strict", is_flag=True, help="Exit 1 if relevance is not conserved.")
@text_options
@dataset_options
@method_options
def explain(**kw):
    """Explain MODEL's prediction for INPUT (an image, a .npy batch, a .npz of one array per model input, or a
    directory of one kind) with LRP or a --method: a summary per item, the relevance, a heatmap if asked.
    """
    o = ExplainOptions.from_click(kw)
    o.model = _model_file(o.model)
    ds = dataset_mode(o.options)
    text = _text_given(o.options)
    mode = next(m for m in MODES if m.chosen(ds, text))
    return mode.run(o, ds, text)


def _text_given(options: dict) -> dict | None:
    """The text options when a text option other than --labels was given (--labels names any classifier's
    classes: alone it keeps explain on INPUT), else None."""
    text = text_mode({**options, "labels": None})
    return None if text is None else {**text, "labels": options.get("labels")}


def _model_file(model: str) -> str:
    """MODEL as given, or an export folder's model file (:func:`onnx_lrp.io.model_folder.resolve_model_folder`)."""
    from onnx_lrp.io.model_folder import model_argument

    return model_argument(model)


def _text_mode(o: "ExplainOptions", ds, text):
    """--text: a text instead of INPUT, explained by its own module (cli/text.py)."""
    return run_text(o.model, text, o.options,
                    refused={"INPUT": o.input_path, "--out-dir": ds and ds["out_dir"], "--tokens": o.tokens_path,
                             "--heatmap": o.heatmap_path,
                             "--relevance-at": o.relevance_at, "--output": o.output_name,
                             **{f"--{k}": o.options.get(k) for k in ("size", "crop", "mean", "std")}})


def _dataset_mode(o: "ExplainOptions", ds, text):
    """--out-dir: every item of SOURCE into shards, by its own module (cli/dataset.py)."""
    _need_input(o)
    for option, why in (("labels", "records class indices (targets by index)"),):
        if o.options.get(option):
            raise InputError(f"--{option} is not taken with --out-dir: the dataset engine {why}; drop --{option}")
    return run_dataset(o.model, o.input_path, ds, o.options, parse_target(o.target),
                       refused={"-o": o.out, "--heatmap": o.heatmap_path, "--tokens": o.tokens_path,
                                "--html": o.html_path, "--position": o.position})


def _files_mode(o: "ExplainOptions", ds, text):
    """INPUT (arrays, images or a directory of one kind): one run, the relevance and heatmaps written here."""
    _need_input(o)
    dest = _destinations(o)
    res = _run(o, dest)
    heat_files = _write(o, dest, res)
    _report(o, dest, res, heat_files)


def _need_input(o: "ExplainOptions") -> None:
    if o.input_path is None:
        raise InputError("give INPUT (an .npy/.npz array, an image or a directory), or --text with --tokenizer")


@dataclass(frozen=True)
class Mode:
    """One way ``explain`` runs: ``chosen(dataset options, text options)`` says whether it is this one."""

    name: str
    chosen: Callable[[dict | None, dict | None], bool]
    run: Callable[["ExplainOptions", dict | None, dict | None], object]


MODES = (  # the first that is chosen runs
    Mode("text", lambda ds, text: text is not None, _text_mode),
    Mode("dataset", lambda ds, text: ds is not None, _dataset_mode),
    Mode("arrays and images", lambda ds, text: True, _files_mode),
)


@dataclass
class ExplainOptions:
    """The options of ``onnx-lrp explain`` it reads itself, one field each; ``options`` holds click's whole option
    dict, which ``cli.options.explainer_setup`` (the explainer's BuildOptions / RunOptions: a new one needs no field
    here), ``cli.dataset`` and ``cli.text`` read (never pop)."""

    model: str
    input_path: str
    target: str | None
    output_name: str | None
    position: str | None
    start: str
    device: str
    batch_size: int
    relevance_at: tuple
    out: str | None
    heatmap_path: str | None
    cmap: str
    heatmap_style: str
    tokens_path: str | None
    token_scale: float
    html_path: str | None
    as_json: bool
    options: dict = field(default_factory=dict)

    @classmethod
    def from_click(cls, kw: dict) -> "ExplainOptions":
        names = [f.name for f in fields(cls) if f.name != "options"]
        return cls(**{k: kw[k] for k in names}, options=dict(kw))


@dataclass
class _Destinations:
    """What the run writes and reads besides the model, checked before any work."""

    input_path: Path
    data_kind: Kind  # of the items (items_kind)
    out_path: Path
    heat_path: Path | None
    html_out: Path | None
    tokens: object
    targets: object
    positions: object


@dataclass
class _Result:
    """The run's one :class:`onnx_lrp.Explanation` (every item, merged) and its context beside it: the explainer,
    the items read, a summary row per item, the summary, the timings and the token views."""

    ex: object
    batch: object
    explanation: Explanation
    behind: bool  # relevance starts from the logit behind a softmax output
    items: list
    summary: dict
    t_build: float
    t_explain: float
    token_rows: list | None = None
    item_tokens: list | None = None
    labels: list | None = None  # the class names (--labels, the model's id2label, a config.json beside it)

    @property
    def n(self) -> int:
        return len(self.batch)


def _destinations(o: ExplainOptions) -> _Destinations:
    """The output files (suffixes, writable, not the input), targets, positions and tokens: refused before any work."""
    input_path = Path(o.input_path)
    kind = input_kind(input_path)
    items = items_kind(input_path)  # a directory's is that of its files; PIXELS for uint8 arrays
    out_path = Path(o.out) if o.out else relevance_name(input_path, kind)
    if out_path.suffix.lower() not in (".npy", ".npz"):
        raise OutputError(f"-o {out_path}: the relevance is written as .npy or .npz; change the suffix")
    if o.relevance_at and out_path.suffix.lower() == ".npy":
        raise OutputError(f"-o {out_path}: --relevance-at needs an .npz output to hold several arrays")
    check_writable(out_path)
    if input_path.is_file() and out_path.exists() and out_path.resolve() == input_path.resolve():
        raise OutputError(f"-o {out_path} is the input; write the relevance to another file")
    heat_path = Path(o.heatmap_path) if o.heatmap_path else None
    if heat_path is not None:
        if heat_path.suffix.lower() not in hm.IMAGE_FORMATS:
            raise OutputError(f"--heatmap {heat_path}: give an image file name ({', '.join(hm.IMAGE_FORMATS)})")
        check_writable(heat_path)
        if heat_path.resolve() == out_path.resolve():
            raise OutputError(f"--heatmap and -o both name {out_path}; give two different files")
    targets = target_option(o.target)
    positions = parse_target(o.position, "--position") if o.position is not None else None
    tokens = None
    if o.html_path and not o.tokens_path:
        raise OutputError("--html needs --tokens FILE (the token text, one token per line)")
    if o.tokens_path:
        from onnx_lrp.io.tokens import read_tokens
        tokens = read_tokens(o.tokens_path)
    html_out = Path(o.html_path) if o.html_path else None
    if html_out is not None:
        if html_out.suffix.lower() not in (".html", ".htm"):
            raise OutputError(f"--html {html_out}: give an .html file name")
        check_writable(html_out)
    guard([("the input", input_path), ("the --tokens file", o.tokens_path),
           ("the --labels file", o.options.get("labels"))],
          [("-o", out_path), ("--heatmap", heat_path), ("--html", html_out)], models=[("the model", o.model)])
    return _Destinations(input_path, items, out_path, heat_path, html_out, tokens, targets, positions)


def _run(o: ExplainOptions, dest: _Destinations) -> _Result:
    """Build the explainer, read the inputs, explain them in batches; the merged arrays and the summary."""
    setup = explainer_setup(o.model, with_lrp_method(o.options), data_kind=dest.data_kind)
    t0 = time.perf_counter()
    past = given_past.npz_names(dest.input_path)  # an .npz INPUT with a decoder's past: the model keeping its past
    ex = setup.explainer(o.model, past_inputs=True) if past and method_keywords(o.options)[0] is None else \
        _explainer(o, setup)
    t_build = time.perf_counter() - t0
    ex.gap_warnings = False  # the summary reports the largest gap of the whole run, once
    if o.device == "auto":
        why = ex.device_note or "onnxruntime has no CUDA provider here"
        _say(f"--device auto: using {ex.device}" + ("" if ex.device == "cuda" else f" ({why})"))
    if setup.zbox_note:
        _say(setup.zbox_note)
    labels = _class_names(o, ex, dest)
    if len(ex.relevance_inputs) > 1 and dest.out_path.suffix.lower() == ".npy":
        raise OutputError(f"-o {dest.out_path}: the model has {len(ex.relevance_inputs)} float inputs "
                          f"({', '.join(ex.relevance_inputs)}); write an .npz to hold a relevance per input")
    batch = _read(dest, ex, setup, past)
    t1 = time.perf_counter()
    merged = _explain_batches(ex, batch, dest, o.batch_size, t1)
    t_explain = time.perf_counter() - t1
    res = _result(o, dest, ex, batch, merged, t_build, t_explain)
    _name_classes(res, labels)
    if dest.tokens is not None:
        from onnx_lrp.io.tokens import tokens_for
        res.token_rows = _token_rows(dest.tokens, merged.relevance, res.n)
        res.item_tokens = [tokens_for(dest.tokens, i, res.n) for i in range(res.n)]
    return res


def _explainer(o: ExplainOptions, setup):
    """The LRP explainer of the setup, or that of --method (a method beyond LRP: its options, cli/methods.py)."""
    method, keywords = method_keywords(o.options)
    if method is None:
        return setup.explainer(o.model)
    refused = [flag for flag, given in (("--relevance-at", o.relevance_at), ("--position", o.position),
                                        ("--start one-hot", o.start != "logit"),
                                        ("--composite", o.options.get("composite", "auto") != "auto"))
               if given]
    if refused:
        raise InputError(f"{refused[0]} is LRP's; --method {method} explains the output entry itself")
    keywords = with_base_params(method, keywords, setup.params)  # --base COMPOSITE: its rule parameters
    return method_explainer(o.model, method, keywords, output=o.output_name, device=o.device)


def _method(ex) -> str | None:
    """The method beyond LRP ``ex`` runs (an onnx_lrp.methods.explain.MethodExplainer), else None."""
    return getattr(ex, "attributor", None) and ex.method


def _numerics(ex) -> dict:
    """The summary's tf32 and precision (LRP), or the method."""
    if _method(ex):
        return dict(method=ex.method, tf32=False, precision="float32")
    return dict(tf32=uses_tf32(ex), precision=ex.relevance_model.model_precision)


def _read(dest: _Destinations, ex, setup, past: list = ()):
    """The inputs as one batch; refused when empty or when --target / --position do not give one per item.
    ``past``: the .npz's names when it holds a decoder's past (the lengths' inputs may be left out)."""
    batch = setup.read(dest.input_path, given_past.given_specs(ex.inputs, past))
    n = len(batch)
    if n == 0:
        raise InputError(f"{dest.input_path} holds no items (an empty batch); give at least one")
    if isinstance(dest.targets, list) and len(dest.targets) != n:
        raise InputError(f"--target gives {len(dest.targets)} classes for {n} item(s); give one, or one per item")
    if isinstance(dest.positions, list) and len(dest.positions) != n:
        raise InputError(f"--position gives {len(dest.positions)} positions for {n} item(s); give one, or one per "
                         "item")
    return batch


def _result(o: ExplainOptions, dest: _Destinations, ex, batch, m: Explanation, t_build: float, t_explain: float
            ) -> _Result:
    """The run's explanation with a summary row per item and the summary of the run."""
    n = len(batch)
    relevance, outputs, target_used, pos_used = m.relevance, m.outputs, m.target, m.position
    explained = outputs[ex.explained_output]
    # what relevance starts from: the explained tensor at the target (the logit behind a softmax output)
    start_values = m.explained_value
    behind = ex.explained_tensor != ex.explained_output and start_values is not None
    if pos_used is not None:  # the explained row of each item
        flat = np.stack([np.asarray(explained[i, pos_used[i]]).reshape(-1) for i in range(n)])
    else:
        flat = explained.reshape(n, -1)
    rel_flat = sum(np.asarray(v, np.float64).reshape(n, -1).sum(1) for v in
                   (relevance.values() if isinstance(relevance, dict) else [relevance]))
    items = [dict(item=batch.names[i], predicted=int(np.argmax(flat[i])), target=int(target_used[i]),
                  output=float(flat[i, target_used[i]]), relevance_sum=float(rel_flat[i])) for i in range(n)]
    for i, it in enumerate(items):
        if pos_used is not None:
            it["position"] = int(pos_used[i])
        if behind:
            it["logit"] = float(start_values[i])  # relevance starts from this value (start logit), not the output
    summary = dict(model=str(o.model), input=str(dest.input_path), composite=ex.composite_name,
                   start=None if _method(ex) else o.start,
                   device=ex.device, **_numerics(ex),
                   explained_output=ex.explained_output, items=items, relevance_file=str(dest.out_path),
                   heatmap_file=str(dest.heat_path) if dest.heat_path else None, build_s=round(t_build, 4),
                   explain_s=round(t_explain, 4))
    if behind:
        summary["logits"] = ex.explained_tensor
    if m.notes:
        summary["notes"] = m.notes  # a given past's part of the relevance
    if _method(ex):
        summary["held_inputs"] = list(ex.held_inputs)  # fed as given to every run, not attributed
    gap = m.deployed_gap
    if gap is not None:
        summary["deployed_gap"] = gap.as_dict()
        if gap.beyond:  # once, for the whole run
            _say("warning: " + gap.message(batch.names))
    return _Result(ex, batch, m, behind, items, summary, t_build, t_explain)


def _explain_batches(ex, batch, dest: _Destinations, batch_size: int, t1: float) -> Explanation:
    """``ex.explain`` per batch of ``batch_size`` items (:mod:`onnx_lrp.run.batches`), merged into one
    Explanation; a progress bar when the run will take a while."""
    total = -(-len(batch) // batch_size)
    chunks, bar = [], None
    try:
        for chunk in explain_chunks(ex, slices(batch.arrays, batch_size), target=dest.targets,
                                    position=dest.positions):
            chunks.append(chunk)
            if len(chunks) == 1 and total > 1 and (time.perf_counter() - t1) * total > PROGRESS_AFTER_S:
                bar = click.progressbar(length=total, label="explaining", file=sys.stderr)
                bar.__enter__()
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.__exit__(None, None, None)
    return merge(chunks)


def _write(o: ExplainOptions, dest: _Destinations, res: _Result) -> list:
    """The relevance (.npy, or .npz with outputs, targets, ...), heatmaps and the token page, all or none; the
    heatmap files written."""
    out_path, relevance, items = dest.out_path, res.explanation.relevance, res.items
    heat_files = []
    with AtomicOutputs() as w:
        if out_path.suffix.lower() == ".npy":
            w.save_npy(out_path, relevance)
        else:
            w.save_npz(out_path, res.explanation.arrays(items=res.batch.names))
        if dest.heat_path is not None:
            labels = [_tile_label(it, res.ex, o.start) for it in items]
            for path, image in _heatmap(res.ex, res.batch, relevance, o.cmap, o.heatmap_style, labels,
                                        dest.heat_path, o.model):
                if path != dest.heat_path:  # one file per page: each checked against the inputs as --heatmap was
                    guard([("the input", dest.input_path)], [("--heatmap", path)], models=[("the model", o.model)])
                w.save_image(path, image)
                heat_files.append(path)
        if dest.html_out is not None:
            from onnx_lrp.io.tokens import html_items
            w.write_bytes(dest.html_out, html_items(res.item_tokens, res.token_rows, [
                f"item {it['item']}: target {it['target']}" + (f" at position {it['position']}" if "position" in it
                                                               else "") for it in items],
                percentile=o.token_scale).encode())
    if len(heat_files) > 1:
        res.summary["heatmap_files"] = [str(p) for p in heat_files]
    return heat_files


def _report(o: ExplainOptions, dest: _Destinations, res: _Result, heat_files: list) -> None:
    """The summary: JSON, or a table of the first items and where the files went."""
    if o.as_json:
        click.echo(json.dumps(res.summary, indent=2))
        return
    ex, items, n, pos_used, behind = res.ex, res.items, res.n, res.explanation.position, res.behind
    width = max(len("item"), *(len(printable(it["item"])) for it in items[:SUMMARY_ROWS]))
    out_head = f"output {ex.explained_output}"
    ow = max(12, len(out_head))
    extra_head = ""
    if pos_used is not None:
        extra_head += f"  {'position':>8}"
    if behind:
        lw = max(12, len(f"logit {ex.explained_tensor}"))
        extra_head += f"  {('logit ' + ex.explained_tensor):>{lw}}"
    click.echo(f"{'item':<{width}}  predicted  target{extra_head}  {out_head:>{ow}}  relevance sum"
               + ("  class (target)" if res.labels else ""))
    for it in items[:SUMMARY_ROWS]:
        extra = ""
        if pos_used is not None:
            extra += f"  {it['position']:>8}"
        if behind:
            extra += f"  {it['logit']:>{lw}.6g}"
        click.echo(f"{printable(it['item']):<{width}}  {it['predicted']:>9}  {it['target']:>6}{extra}  {it['output']:>{ow}.6g}  "
                   f"{it['relevance_sum']:>13.6g}" + (f"  {printable(it.get('target_label') or '')}"
                                                      if res.labels else ""))
    if n > SUMMARY_ROWS:
        click.echo(f"... {n - SUMMARY_ROWS} more item(s) (--json lists all)")
    if behind:
        click.echo(f"relevance starts from the logit ({ex.explained_tensor}, before the softmax of "
                   f"{ex.explained_output})" + (" times one (--start one-hot)" if o.start == "one-hot" else ""))
    for line in res.explanation.notes + held_line(ex):
        click.echo(line)
    chosen = f" ({ex.composite_reason}; --composite overrides)" if ex.composite_reason else ""
    resized = res.batch.resize_note()
    how = f"method {ex.method}" if _method(ex) else f"composite {ex.composite_name}{chosen}, start {o.start}"
    click.echo(f"{n} item(s), {how}, device {ex.device}"
               f"{'' if _method(ex) else device_note(ex) + precision_note(ex)}: explained in "
               f"{res.t_explain:.3f} s "
               f"(model built in {res.t_build:.3f} s)" + (f"; {resized}" if resized else ""))
    if res.token_rows is not None:
        from onnx_lrp.io.tokens import terminal
        color = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
        for it, toks, row in zip(items, res.item_tokens, res.token_rows):
            where = f" (position {it['position']})" if "position" in it else ""
            click.echo(f"{printable(it['item'])}{where}: {terminal(toks, row, color=color, percentile=o.token_scale)}")
    heat_text = ""
    if heat_files:
        heat_text = f"; heatmap -> {heat_files[0]}" if len(heat_files) == 1 else \
            f"; heatmaps -> {heat_files[0]} ... {heat_files[-1]} ({len(heat_files)} files, 48 items each)"
    click.echo(f"relevance -> {dest.out_path}" + heat_text + (f"; tokens -> {dest.html_out}" if dest.html_out else ""))


def held_line(ex) -> list:
    """A method's inputs fed as given and not attributed (attention masks, positions), as one line (or none)."""
    held = list(getattr(ex, "held_inputs", None) or []) if _method(ex) else []
    if not held:
        return []
    return [f"held: {', '.join(held)} fed as given to every run of {ex.method}, not attributed (relevance of "
            f"{', '.join(ex.relevance_inputs)})"]


def _class_names(o: ExplainOptions, ex, dest: _Destinations):
    """The class names (--labels, the model's id2label metadata, a config.json beside it) or None; a --target
    given by name resolved with them (:func:`cli.class_targets.resolve_named`)."""
    from onnx_lrp.io.labels import find_labels

    given = o.options.get("labels")
    labels = ex.labels if given is None and hasattr(ex, "labels") else find_labels(given, ex, o.model)
    dest.targets = resolve_named(dest.targets, ex, o.model, labels=labels)
    return labels


def _name_classes(res: _Result, labels) -> None:
    """The class names of each item's prediction and target in its summary row (JSON, table, captions)."""
    from onnx_lrp.io.labels import label_of

    res.labels = res.explanation.class_names = labels  # the .npz's target_labels / predicted_labels
    note = res.batch.resize_note()
    if note:
        res.summary["resized"] = note
    if not labels:
        return
    for it in res.items:
        it["predicted_label"], it["target_label"] = label_of(it["predicted"], labels), label_of(it["target"], labels)


def _tile_label(it: dict, ex, start: str) -> list[str]:
    """Caption lines of one heatmap tile: the item, predicted class, explained target and the value explained."""
    where = f" @{it['position']}" if "position" in it else ""
    value = f"logit {it['logit']:.4g}" if "logit" in it else f"{ex.explained_output} {it['output']:.4g}"
    lines = [it["item"], f"pred {it['predicted']}  target {it['target']}{where}",
             f"{value}  sum R {it['relevance_sum']:.4g}"]
    if "target_label" in it:  # class names known: the target's (and the prediction's when it differs)
        pred = it.get("predicted_label")
        lines.append(f"{it['target_label'] or it['target']}"
                     + (f" (pred {pred})" if pred != it["target_label"] else ""))
    return lines


def _token_rows(tokens, relevance, n):
    """One relevance value per token and item (the first input's relevance, summed over embedding dims)."""
    from onnx_lrp.io.tokens import per_token, tokens_for
    rel = next(iter(relevance.values())) if isinstance(relevance, dict) else relevance
    rows = []
    for i in range(n):
        toks = tokens_for(tokens, i, n)
        try:
            rows.append(per_token(np.asarray(rel[i]), len(toks)))
        except InputError as exc:
            raise InputError(f"--tokens, item {i}: {exc}") from None
    return rows


TILES_PER_FILE = 48


def _heatmap(ex, batch, relevance, cmap, style, labels, heat_path, model):
    """(path, image) pages of the first float input's relevance: at most TILES_PER_FILE items per file."""
    from onnx_lrp.io.inputs import model_channel_axis
    first = ex.relevance_inputs[0]
    rel = relevance[first] if isinstance(relevance, dict) else relevance
    layout = batch.layout
    spec = next(s for s in ex.inputs if s.name == first)
    channel_axis = layout.channel_axis if layout is not None else model_channel_axis(model, first, spec.dims)
    maps = hm.relevance_maps(rel, channel_axis)
    images = batch.images if batch.kind == Kind.IMAGE else hm.display_images(batch.arrays[first], channel_axis)
    n = len(maps)
    pages = []
    for k, lo in enumerate(range(0, n, TILES_PER_FILE)):
        hi = min(n, lo + TILES_PER_FILE)
        path = heat_path if k == 0 else heat_path.with_name(f"{heat_path.stem}-{k + 1}{heat_path.suffix}")
        pages.append((path, hm.render(maps[lo:hi], None if images is None else images[lo:hi], cmap=cmap,
                                      style=style, labels=labels[lo:hi],
                                      colorbar="colours scaled per tile to its largest |relevance|")))
    return pages
