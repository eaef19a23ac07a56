"""``onnx-lrp trace MODEL INPUT``: the conservation ledger, node by node from the explained output to the input.

The numbers are sums of the relevance model's own tensors (``Explainer(ledger=True)``: ReduceSum outputs of every
node's incoming and outgoing relevance), not a second implementation of the rules.
"""
from __future__ import annotations

import json

import click
import numpy as np

from onnx_lrp.core.errors import InputError
from onnx_lrp.io.inputs import items_kind

from .class_targets import class_names, labels_option, named, parse_target, resolve_named, target_option
from .helpfmt import Command
from .options import BINDING_ROWS, INPUT_ROWS, RULE_ROWS, common, explainer_setup, input_options
from .text import text_batch, text_setup


def _say(msg: str) -> None:
    click.echo(f"onnx-lrp: {msg}", err=True)


def ledger_rows(rows, entering, leaving, start: float, tolerance: float) -> list[dict]:
    """One dict per node: relevance entering (from the output side), leaving (to its inputs), absorbed, the
    running total still in flight after the node, and whether |absorbed| exceeds ``tolerance * |start|``."""
    out, running = [], float(start)
    limit = tolerance * max(abs(float(start)), 1e-30)
    for row, e, l in zip(rows, np.asarray(entering, np.float64), np.asarray(leaving, np.float64)):
        absorbed = float(e - l)
        running -= absorbed
        breaks = bool(not np.isfinite(absorbed) or abs(absorbed) > limit)
        sinks = row.sinks or (f"the {row.rule} rule (does not conserve)" if breaks else "")
        out.append(dict(node=row.name, op_type=row.op_type, kind=row.kind, rule=row.rule, entering=float(e),
                        leaving=float(l), absorbed=absorbed, running=running, sinks=sinks, breaks=breaks))
    return out


@click.command("trace", cls=Command, sections=[
    ("What to explain", ["item", "target", "labels", "output_name", "position", "start", *RULE_ROWS]),
    ("Inputs", [*INPUT_ROWS, *BINDING_ROWS, "text", "tokenizer_path"]),
    ("Output", ["tolerance", "as_json", "device"])],
    examples=["onnx-lrp trace models/digits_cnn.onnx models/samples/png/digit_3.png",
              "onnx-lrp trace models/digits_cnn.onnx models/samples/batch.npy --item 8 --json",
              "onnx-lrp trace models/text/sentiment.onnx --text 'a funny film'"])
@click.argument("model", metavar="MODEL")
@click.argument("input_path", metavar="[INPUT]", required=False)
@click.option("--text", default=None, metavar="TEXT",
              help="Trace this text instead of INPUT (its tokenizer.json beside MODEL, or --tokenizer).")
@click.option("--tokenizer", "tokenizer_path", default=None, metavar="tokenizer.json",
              help="With --text: the model's tokenizer.json (default: the one beside MODEL).")
@common
@input_options
@click.option("--item", type=click.IntRange(min=0), default=0, metavar="N",
              help="Which item of INPUT to trace (default 0).")
@click.option("--target", "-t", default="argmax", metavar="INT|NAME|argmax",
              help="Class to explain, index or name (default: argmax).")
@labels_option
@click.option("--output", "output_name", default=None, metavar="NAME",
              help="Output to explain (default: the first).")
@click.option("--position", default=None, metavar="INT", help="Sequence outputs: position (default: last).")
@click.option("--start", type=click.Choice(["logit", "one-hot"]), default="logit", metavar="logit|one-hot",
              help="Start: the logit (default) or 1 (zennit).")
@click.option("--device", type=click.Choice(["cpu", "cuda", "auto"]), default="cpu", metavar="cpu|cuda|auto",
              help="onnxruntime device (default cpu).")
@click.option("--tolerance", type=click.FloatRange(min=0), default=1e-3, metavar="FRACTION",
              help="Mark (!) nodes absorbing more (default 1e-3).")
@click.option("--json", "as_json", is_flag=True, help="Print the ledger as JSON.")
def trace(model, input_path, **options):
    """The conservation ledger of one explanation: where the relevance goes, node by node.

    Per node from the explained output to the input: the relevance entering, leaving, absorbed (biases,
    stabilisers, rules that do not conserve) and still in flight, read from the relevance model itself.
    """
    text = _text_of(input_path, options)
    setup = explainer_setup(model, options, data_kind=items_kind(input_path)) if text is None else \
        text_setup(model, options)
    item, target, position, start = options["item"], options["target"], options["position"], options["start"]
    tolerance, as_json = options["tolerance"], options["as_json"]
    if setup.zbox_note:
        _say(setup.zbox_note)
    targets = target_option(target)  # an index, or a class name resolved once the model is built
    if isinstance(targets, list):
        raise InputError(f"--target {target!r}: trace explains one item; give one class")
    pos = parse_target(position, "--position") if position is not None else None
    if isinstance(pos, list):
        raise InputError(f"--position {position!r}: trace explains one item; give one position")
    ex = setup.explainer(model, ledger=True)
    ex.gap_warnings = False  # reported in the ledger's header instead
    labels = class_names(options["labels"], ex, model)
    targets = resolve_named(targets, ex, model, labels=labels)
    if isinstance(targets, list):
        raise InputError(f"--target {target!r}: trace explains one item; give one class")
    batch = setup.read(input_path, ex.inputs) if text is None else text_batch(model, ex, text,
                                                                               options["tokenizer_path"])
    if item >= len(batch):
        raise InputError(f"--item {item}: INPUT holds {len(batch)} item(s); give 0 to {len(batch) - 1}")
    feeds = {name: a[item:item + 1] for name, a in batch.arrays.items()}
    extra = {"position": pos} if pos is not None else {}
    res = ex.explain(feeds, target=targets, **extra)
    summary = ledger_summary(ex, res, tolerance)
    summary = dict(model=str(model), input=str(input_path) if text is None else None, item=batch.names[item],
                   composite=ex.composite_name, start=start, explained_output=ex.explained_output, target=int(res.target[0]), **summary)
    if labels:
        summary["target_label"] = named(res.target, labels)[0]
        predicted = _predicted(res)
        if predicted is not None:
            summary.update(predicted=predicted, predicted_label=named(predicted, labels)[0])
    if res.position is not None:
        summary["position"] = int(np.asarray(res.position).reshape(-1)[0])
    if start == "logit" and ex.explained_output in res.outputs:
        summary["output_value_note"] = "start relevance = the explained output's value at the target"
    if res.deployed_gap is not None:
        summary["deployed_gap"] = res.deployed_gap.as_dict()
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    _print_ledger(summary, ex, res.deployed_gap, batch.names[item], start, tolerance)


def _predicted(res):
    """The arg-max class of the explained output (first item; at the explained position for sequences)."""
    if res.explained_output not in res.outputs:
        return None
    y = np.asarray(res.outputs[res.explained_output])
    if res.position is not None and y.ndim >= 3:
        y = y[:, int(np.asarray(res.position).reshape(-1)[0])]
    return int(np.argmax(y.reshape(y.shape[0], -1)[0]))


def _text_of(input_path, options) -> str | None:
    """--text (then no INPUT, nor image options), or None: INPUT is traced."""
    text = options.get("text")
    if text is None and options.get("tokenizer_path") is not None:
        raise InputError("--tokenizer goes with --text: give the text to trace")
    if (input_path is None) == (text is None):
        raise InputError("give INPUT (an image, .npy/.npz array) or --text TEXT: one of them")
    return text


def ledger_summary(ex, res, tolerance: float) -> dict:
    """The ledger of one explanation: the rows (:func:`ledger_rows`), the start, input and absorbed relevance."""
    entering, leaving = res.ledger["entering"], res.ledger["leaving"]
    start_value = float(entering[0]) if len(entering) else 0.0
    rel = res.relevance.values() if isinstance(res.relevance, dict) else [res.relevance]
    input_sum = float(sum(np.asarray(r, np.float64).sum() for r in rel))
    rows = ledger_rows(ex.relevance_model.ledger_rows, entering, leaving, start_value, tolerance)
    # token ids: their relevance is reported at the embedding lookups, which the ledger shows as absorbed there
    tokens = any(s.dtype.kind in "iu" and s.name in ex.relevance_inputs for s in ex.inputs)
    for r in rows:
        r["to_tokens"] = tokens and "integer inputs" in r["sinks"]
        if r["to_tokens"]:
            r["sinks"] = "token relevance (reported per token as the input relevance)"
            r["breaks"] = False
    absorbed = float(sum(r["absorbed"] for r in rows if not r["to_tokens"]))
    return dict(start_relevance=start_value, input_relevance=input_sum, absorbed=absorbed,
                unaccounted=start_value - absorbed - input_sum, tolerance=tolerance, nodes=rows)


def _print_ledger(summary: dict, ex, gap, item_name: str, start: str, tolerance: float) -> None:
    rows, start_value = summary["nodes"], summary["start_relevance"]
    width = max([len("node")] + [len(r["node"]) for r in rows])
    opw = max([len("op")] + [len(r["op_type"]) for r in rows])
    rw = max([len("rule")] + [len(r["rule"]) for r in rows])
    name = f" {summary['target_label']!r}" if summary.get("target_label") else ""
    click.echo(f"ledger of {item_name}: {ex.explained_output}[{summary['target']}]{name}"
               + (f" at position {summary['position']}" if "position" in summary else "")
               + f", composite {ex.composite_name}, start {start}: relevance {start_value:.6g} enters at the output")
    if gap is not None and gap.beyond:
        click.echo(f"note: {gap.message([item_name])}")
    click.echo(f"  {'node':<{width}}  {'op':<{opw}}  {'rule':<{rw}}  {'entering':>11}  {'leaving':>11}  "
               f"{'absorbed':>11}  {'running':>11}  absorbed by")
    for r in rows:
        mark = "!" if r["breaks"] else " "
        click.echo(f"{mark} {r['node']:<{width}}  {r['op_type']:<{opw}}  {r['rule']:<{rw}}  {r['entering']:>11.5g}  "
                   f"{r['leaving']:>11.5g}  {r['absorbed']:>11.4g}  {r['running']:>11.5g}  {r['sinks']}".rstrip())
    click.echo(f"start {start_value:.6g} = input relevance {summary['input_relevance']:.6g} + absorbed "
               f"{summary['absorbed']:.6g} (unaccounted {summary['unaccounted']:.3g})")
    breaks = [r for r in rows if r["breaks"]]
    if breaks:
        click.echo(f"{len(breaks)} node(s) marked ! absorb more than {tolerance:g} x the start relevance: "
                   + ", ".join(r["node"] for r in breaks[:8]) + (" ..." if len(breaks) > 8 else ""))
    else:
        click.echo(f"every node conserves within {tolerance:g} x the start relevance")


__all__ = ["ledger_rows", "ledger_summary", "trace"]
