"""``onnx-lrp rewrite`` and ``onnx-lrp inspect`` (``composites`` lives in cli/composites.py: it imports no numpy)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from onnx_lrp.core.errors import OutputError

from .helpfmt import Command, Row
from .io import AtomicOutputs, check_writable, guard
from .methods import METHOD_KEYS, method_keywords, method_options
from .options import BINDING_ROWS, RULE_ROWS, common, explainer_setup, rule_params
from .signature import signature, signature_lines, suggestion


@click.command("rewrite", cls=Command, sections=[
    ("Options", ["out", "output_name", "relevance_at", "computed_weights", *RULE_ROWS, *BINDING_ROWS]),
    ("Method", [Row(METHOD_KEYS, "An attribution method in the graph instead of LRP (docs/methods.md)."),
                Row(("baseline_input",), "integrated-gradients: the baseline; expected-gradients, gradient-shap: "
                                         "the background set; as the input lrp/baselines.")])],
    examples=["onnx-lrp rewrite models/digits_cnn.onnx -o digits.lrp.onnx",
              "onnx-lrp rewrite resnet18.onnx -o resnet18.ig.onnx \\",
              "    --method integrated-gradients --n-steps 32"])
@click.argument("model", metavar="MODEL")
@click.option("-o", "--out", "out", default=None, metavar="OUT.onnx",
              help="Where to write it (default: ./MODEL.lrp.onnx).")
@common
@click.option("--output", "output_name", default=None, metavar="NAME",
              help="Output to explain (default: the first).")
@click.option("--relevance-at", "relevance_at", multiple=True, metavar="TENSOR",
              help="Also this tensor's relevance (repeatable).")
@click.option("--computed-weights", is_flag=True,
              help="No weight copies: about the model's size.")
@method_options
@click.option("--baseline-input", "baseline_input", is_flag=True,
              help="The baseline (background set) as the input lrp/baselines.")
def rewrite(model, out, computed_weights, baseline_input, **options):
    """Write MODEL's relevance model: one ONNX file that runs in stock onnxruntime, without onnx-lrp.

    It has the model's inputs and outputs, plus outputs lrp/relevance/<input>, lrp/target_used and
    lrp/explained_value, and inputs lrp/target (int64 [N], -1 = arg-max) and lrp/one_hot (bool); sequence outputs
    add lrp/position (docs/python-api.md).
    """
    import onnx_lrp

    out_path = Path(out) if out else Path(Path(model).name.removesuffix(".onnx") + ".lrp.onnx")  # here, not beside
    if out_path.suffix.lower() != ".onnx":
        raise OutputError(f"-o {out_path}: the relevance model is an ONNX file; give a name ending in .onnx")
    check_writable(out_path)
    if Path(model).exists() and out_path.exists() and out_path.resolve() == Path(model).resolve():
        raise OutputError(f"-o {out_path} is the input model; write the relevance model to another file")
    # MODEL.lrp.onnx.data too (written with a large model): never over the model's own data files
    guard([], [("-o", out_path), ("-o's data file", out_path.with_name(out_path.name + ".data"))],
          models=[("the model", model)])
    method, keywords = method_keywords({**options, "baseline_input": baseline_input})
    if method is not None or baseline_input:
        return _rewrite_method(model, out_path, method, keywords, {**options, "computed_weights": computed_weights},
                               baseline_input)
    setup = explainer_setup(model, options)
    ex = onnx_lrp.Explainer(model, composite=setup.composite, build=setup.build, run=setup.run)
    parts = ex.model_parts(computed_weights)
    if parts.large:  # MODEL.lrp.onnx + MODEL.lrp.onnx.data, the weights streamed from file to file
        ex.save(out_path, computed_weights)
        data_path = out_path.with_name(out_path.name + ".data")
        written = out_path.stat().st_size + data_path.stat().st_size
        size = model_bytes_on_disk(model)
        where = f" and {data_path.name}"
    else:
        with AtomicOutputs() as w:
            w.write_bytes(out_path, parts.model_bytes)
        written, where = len(parts.model_bytes), ""
        size = Path(model).stat().st_size if Path(model).is_file() else 0
    rel_outputs = [f"lrp/relevance/{n}" for n in (*ex.relevance_inputs, *setup.build.relevance_at)]
    ratio = f", {written / size:.2f}x the model" if size else ""
    click.echo(f"wrote {out_path}{where} ({written / 1024:.1f} KiB{ratio}): composite {ex.composite.name}, explains "
               f"{ex.explained_output!r}" + (" (modified weights computed at load)" if computed_weights else ""))
    click.echo(f"  outputs: {', '.join(ex.output_names + rel_outputs + ['lrp/target_used', 'lrp/explained_value'])}")
    seq = ", lrp/position (int64 [N], -1 = the last)" if ex.relevance_model.sequence_rows is not None else ""
    click.echo(f"  inputs to feed besides the model's: lrp/target (int64 [N], -1 = argmax), lrp/one_hot (bool scalar, "
               f"false = start from the logit){seq}")


# what each input of a method's model holds (onnx_lrp.methods.ingraph.METHOD_INPUTS)
_FEEDS = {"lrp/baselines": "the baseline, the input's shape", "lrp/noise": "samples x N x an item's shape",
          "lrp/baseline_indices": "int64 samples x N, rows of lrp/baselines", "lrp/alphas": "samples x N in [0, 1]",
          "lrp/masks": "n_masks x the masked axes"}


def _rewrite_method(model, out_path: Path, method, keywords: dict, options: dict, baseline_input: bool) -> None:
    """rewrite --method: one ONNX model of the prediction and a method's attribution (onnx_lrp.methods.ingraph);
    OUT + OUT.data for a model with external data."""
    from onnx_lrp.core.errors import InputError
    from onnx_lrp.methods.ingraph import save_method_model

    if method is None:
        raise InputError("--baseline-input is for --method integrated-gradients, expected-gradients or gradient-shap")
    lrp_only = [flag for flag, given in (("--relevance-at", options.get("relevance_at")),
                                         ("--composite", options.get("composite", "auto") != "auto"),
                                         ("--computed-weights", options.get("computed_weights")),
                                         ("--constant", options.get("constants")),
                                         ("--input-shape", options.get("input_shapes")),
                                         ("a rule parameter", rule_params(options))) if given]
    if lrp_only:
        raise InputError(f"{lrp_only[0]} is LRP's; rewrite --method {method} writes the method's graph")
    inputs, large = save_method_model(model, out_path, method, baseline_input, output=options.get("output_name"),
                                      **keywords)
    data_path = out_path.with_name(out_path.name + ".data")
    written = out_path.stat().st_size + (data_path.stat().st_size if large else 0)
    click.echo(f"wrote {out_path}{f' and {data_path.name}' if large else ''} ({written / 1024:.1f} KiB): method "
               f"{method}" + (f", {keywords['n_steps']} steps" if "n_steps" in keywords else ""))
    what = {**_FEEDS, "lrp/baselines": "the background set, rows x an item's shape"} if method in (
        "expected-gradients", "gradient-shap") else _FEEDS
    kind = {n: n if n in what else n.rsplit("/", 1)[0] for n in inputs}  # lrp/noise/<input>: several float inputs
    feeds = ["lrp/target (int64 [N], -1 = argmax)"] + [f"{n} ({what[kind[n]]})" for n in inputs if kind[n] in what]
    click.echo(f"  outputs: the model's, lrp/relevance/<input> (the attribution), lrp/target_used; inputs to feed "
               f"besides the model's: {', '.join(feeds)}")


def model_bytes_on_disk(model) -> int:
    """The model file's bytes plus those of the data files beside it that it names (external data)."""
    path = Path(model)
    if not path.is_file():
        return 0
    from onnx_lrp import load as loader

    return path.stat().st_size + sum(f.stat().st_size for f in loader.data_files(path))


@click.command("inspect", cls=Command, sections=[("Options", ["output_name", "as_json", "wide", *RULE_ROWS,
                                                                *BINDING_ROWS])],
               examples=["onnx-lrp inspect models/digits_cnn.onnx",
                         "onnx-lrp inspect resnet18.onnx -c epsilon-gamma-box --json"])
@click.argument("model", metavar="MODEL")
@common
@click.option("--output", "output_name", default=None, metavar="NAME",
              help="Output to explain (default: the first).")
@click.option("--json", "as_json", is_flag=True, help="Print it all as JSON (names whole).")
@click.option("--wide", is_flag=True, help="One line per node, however long its names.")
def inspect(model, as_json, wide, **options):
    """MODEL's inputs and outputs, the rule the composite assigns to every node, and an explain command line.

    Per node: name, op type, role (activation: computes from the inputs; parameter: only from weights), kind, rule,
    status, and its output tensor (the name to give --relevance-at). Nodes off the path to the explained output need
    no rule. Exit 1 when a node on the path is unsupported or no input reaches the output.
    """
    from onnx_lrp import load as loader
    from onnx_lrp.building import auto_composite as choice
    from onnx_lrp.core.errors import UnsupportedError
    from onnx_lrp.lrp import rewriter

    from onnx_lrp.io.model_folder import model_argument

    model = model_argument(model)  # an export folder: its model.onnx
    setup = explainer_setup(model, options)
    output_name, composite = options["output_name"], options["composite"]
    sig = signature(model, setup.constants)
    try:
        ir_model = loader.load(model, constants=setup.constants or None, input_shapes=setup.input_shapes or None)
    except UnsupportedError as exc:  # refused while loading (deployed forms): still a failed check, listed whole
        _refused_while_loading(model, setup.composite, sig, exc, as_json)
    comp, why = choice.resolve(setup.composite, ir_model, output_name)
    plan = rewriter.plan(ir_model, comp, output=output_name)
    rows, coverage = _node_rows(plan)
    bad = coverage["unsupported"]
    tip = None if bad or plan.no_path else suggestion(model, sig, composite, output_name)
    if as_json:
        click.echo(json.dumps(dict(model=str(model), composite=comp.name, explained=plan.output.name, **sig,
                                   nodes=rows, coverage=coverage, suggested=tip), indent=2))
    else:
        _print_table(rows, wide)
        for line in signature_lines(sig):
            click.echo(line)
        click.echo(f"coverage: {coverage['supported']}/{coverage['on_path']} nodes on the path to "
                   f"{plan.output.name!r} supported with composite {comp.name}" + (f" ({why})" if why else "")
                   + (f"; unsupported: {', '.join(bad)}" if bad else ""))
        if tip is not None:
            click.echo(f"explain it: {tip['command']}")
            for part in tip["note"].split("; "):
                click.echo(f"  {part}")
    if bad:
        hint = rewriter.unsupported_hint(ir_model.graph, plan, comp).split(";")[0].split(": ")[-1]
        click.echo(f"onnx-lrp: {len(bad)} unsupported node(s); "
                   + (hint if "attnlrp" in hint else "map them to a rule in a composite file or add a handler in "
                      "onnx_lrp/lrp/ops"), err=True)
        sys.exit(1)
    if plan.no_path:
        click.echo(f"onnx-lrp: {plan.no_path}", err=True)
        sys.exit(1)


def _node_rows(plan) -> tuple[list, dict]:
    """inspect's rows (one per node, with its output tensor and status) and the coverage of the path."""
    from onnx_lrp.lrp import rewriter

    rows = rewriter.describe(plan)
    tensors = {a.node.name: (a.node.outputs[0].name if a.node.outputs else "") for a in plan.assignments}
    for row in rows:
        row["tensor"] = tensors.get(row["name"], "")
        row["status"] = ("ok" if row["supported"] else "UNSUPPORTED") if row["on_path"] else "off path"
    on_path = [r for r in rows if r["on_path"]]
    bad = [r["name"] for r in on_path if not r["supported"]]
    return rows, dict(supported=len(on_path) - len(bad), on_path=len(on_path), nodes=len(rows), unsupported=bad)


def _refused_while_loading(model, comp, sig: dict, exc, as_json: bool) -> None:
    """The nodes the loader refused (deployed forms it cannot explain), listed whole; exit 1."""
    if as_json:
        click.echo(json.dumps(dict(model=str(model), composite=comp.name, **sig, nodes=exc.nodes,
                                   coverage=dict(unsupported=[n["name"] for n in exc.nodes]), suggested=None),
                              indent=2))
    else:
        for n in exc.nodes:
            click.echo(f"{n['name']}  {n['op_type']}  UNSUPPORTED  ({n['reason']})")
        for line in signature_lines(sig):
            click.echo(line)
    click.echo(f"onnx-lrp: {str(exc).split('. ')[0]}", err=True)
    sys.exit(1)


def _print_table(rows: list, wide: bool) -> None:
    """inspect's table: one row per node; a name longer than its column gets a line of its own above the row."""
    cols = [("name", "node"), ("op_type", "op"), ("role", "role"), ("kind", "kind"), ("rule", "rule"),
            ("status", "status"), ("tensor", "output tensor")]
    cap = None if wide else 40  # names are never cut: a longer one gets a line of its own
    widths = {k: max(len(h), *(len(str(r[k])) for r in rows)) if rows else len(h) for k, h in cols}
    if cap is not None:
        widths = {k: min(cap, w) for k, w in widths.items()}
    widths["tensor"] = 0  # the last column: the name to give --relevance-at
    click.echo("  ".join(f"{h:<{widths[k]}}" for k, h in cols))
    for r in rows:
        cells = []
        for k, _ in cols:
            text = str(r[k])
            if widths[k] and len(text) > widths[k]:  # whole name on its own line, the row below it
                click.echo(text)
                text = "\u21b3"  # "see above"
            cells.append(f"{text:<{widths[k]}}")
        line = "  ".join(cells)
        if not r["supported"] and r["on_path"]:
            line += f"  ({r['reason']})"
        click.echo(line.rstrip())


__all__ = ["rewrite", "inspect"]
