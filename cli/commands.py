"""``onnx-lrp rewrite``, ``onnx-lrp inspect`` and ``onnx-lrp composites``."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from onnx_lrp.rules.composite import builtin_names, load_composite

from .io import AtomicOutputs, OutputError, check_writable
from .options import common, composite_with, rule_params


@click.command("rewrite")
@click.argument("model", metavar="MODEL")
@click.option("-o", "--out", "out", default=None, metavar="OUT.onnx",
              help="Where to write the relevance model (default: MODEL with .lrp.onnx beside it).")
@common
@click.option("--output", "output_name", default=None, metavar="NAME",
              help="Model output to explain, for models with several (default: the first).")
@click.option("--relevance-at", "relevance_at", multiple=True, metavar="TENSOR",
              help="Add an output with the relevance of this intermediate tensor (repeatable).")
def rewrite(model, out, output_name, relevance_at, composite, **rule_kw):
    """Write MODEL's relevance model: one ONNX file that runs in stock onnxruntime, without onnx-lrp.

    It has the original inputs and outputs, plus outputs lrp/relevance/<input> (one per float input) and
    lrp/target_used, and two optional inputs: lrp/target (int64 [N], -1 = arg-max, the default) and lrp/one_hot
    (bool scalar: start from 1 instead of the target's output value).
    """
    import onnx_lrp

    out_path = Path(out) if out else Path(model).with_name(Path(model).name.removesuffix(".onnx") + ".lrp.onnx")
    if out_path.suffix.lower() != ".onnx":
        raise OutputError(f"-o {out_path}: the relevance model is an ONNX file; give a name ending in .onnx")
    check_writable(out_path)
    if Path(model).exists() and out_path.exists() and out_path.resolve() == Path(model).resolve():
        raise OutputError(f"-o {out_path} is the input model; write the relevance model to another file")
    comp = composite_with(composite, rule_params(rule_kw))
    ex = onnx_lrp.Explainer(model, composite=comp, output=output_name, relevance_at=tuple(relevance_at))
    with AtomicOutputs() as w:
        w.write_bytes(out_path, ex.model_bytes)
    rel_outputs = [f"lrp/relevance/{n}" for n in (*ex.relevance_inputs, *relevance_at)]
    click.echo(f"wrote {out_path} ({len(ex.model_bytes) / 1024:.1f} KiB): composite {comp.name}, explains "
               f"{ex.explained_output!r}")
    click.echo(f"  outputs: {', '.join(ex.output_names + rel_outputs + ['lrp/target_used'])}")
    click.echo("  optional inputs: lrp/target (int64 [N], -1 = argmax), lrp/one_hot (bool, default false)")


@click.command("inspect")
@click.argument("model", metavar="MODEL")
@common
@click.option("--output", "output_name", default=None, metavar="NAME",
              help="Model output to explain, for models with several (default: the first).")
@click.option("--json", "as_json", is_flag=True, help="Print the table as JSON.")
def inspect(model, output_name, as_json, composite, **rule_kw):
    """List MODEL's nodes with the rule the composite assigns to each; exit 1 if any is unsupported.

    Columns: node name, op type, role (activation: computes from the inputs; parameter: computes only from
    weights), the rule, and whether onnx-lrp supports it. The output tensor of each node is the name to give
    --relevance-at. Nodes off the path to the explained output need no rule.
    """
    from onnx_lrp import loader, rewriter

    comp = composite_with(composite, rule_params(rule_kw))
    ir_model = loader.load(model)
    plan = rewriter.plan(ir_model, comp, output=output_name)
    rows = rewriter.describe(plan)
    tensors = {a.node.name: (a.node.outputs[0].name if a.node.outputs else "") for a in plan.assignments}
    for row in rows:
        row["tensor"] = tensors.get(row["name"], "")
        row["status"] = ("ok" if row["supported"] else "UNSUPPORTED") if row["on_path"] else "off path"
    on_path = [r for r in rows if r["on_path"]]
    bad = [r for r in on_path if not r["supported"]]
    coverage = dict(supported=len(on_path) - len(bad), on_path=len(on_path), nodes=len(rows),
                    unsupported=[r["name"] for r in bad])
    if as_json:
        click.echo(json.dumps(dict(model=str(model), composite=comp.name, explained=plan.output.name,
                                   nodes=rows, coverage=coverage), indent=2))
    else:
        cols = [("name", "node"), ("op_type", "op"), ("role", "role"), ("kind", "kind"), ("rule", "rule"),
                ("status", "status"), ("tensor", "output tensor")]
        widths = {k: min(40, max(len(h), *(len(str(r[k])) for r in rows))) if rows else len(h) for k, h in cols}
        widths["tensor"] = 0  # the last column is never cut: it is the name to give --relevance-at
        click.echo("  ".join(f"{h:<{widths[k]}}" for k, h in cols))
        for r in rows:
            line = "  ".join(f"{str(r[k])[:widths[k] or None]:<{widths[k]}}" for k, _ in cols)
            if not r["supported"] and r["on_path"]:
                line += f"  ({r['reason']})"
            click.echo(line.rstrip())
        click.echo(f"coverage: {coverage['supported']}/{coverage['on_path']} nodes on the path to "
                   f"{plan.output.name!r} supported with composite {comp.name}"
                   + (f"; unsupported: {', '.join(coverage['unsupported'])}" if bad else ""))
    if bad:
        click.echo(f"onnx-lrp: {len(bad)} unsupported node(s); map them to a rule in a composite file or add a "
                   "handler in onnx_lrp/ops", err=True)
        sys.exit(1)
    if plan.no_path:
        click.echo(f"onnx-lrp: {plan.no_path}", err=True)
        sys.exit(1)


@click.command("composites")
@click.argument("names", nargs=-1, metavar="[NAME|FILE]...")
def composites(names):
    """List the built-in composites (or the given ones) and the rule each maps every kind of layer to.

    Entries are matched top to bottom, the first match wins. first_linear marks the linear layers nearest the
    input.
    """
    for i, name in enumerate(names or builtin_names()):
        comp = composite_with(name, {}) if names else load_composite(name)
        if i:
            click.echo()
        click.echo(f"{comp.name}: {comp.description}" if comp.description else comp.name)
        for line in comp.describe():
            click.echo(f"  {line}")


__all__ = ["rewrite", "inspect", "composites"]
