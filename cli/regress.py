"""``onnx-lrp snapshot / check / diff``: regression checks of explanations for CI (see docs/ci-regression.md).

* ``snapshot MODEL INPUTS -o baseline.npz`` stores inputs, targets, outputs, relevance, the composite (TOML text and
  parameter overrides), the onnx-lrp version and the model's SHA-256 (format: :mod:`onnx_lrp.regression`).
* ``check MODEL baseline.npz`` recomputes with the stored settings and compares per sample; exit 0 when every
  sample passes, 1 when any drifted, 2 on bad input.
* ``diff MODEL_A MODEL_B INPUTS`` compares two model versions directly (B explained at A's targets); same exit codes.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path

import click

from onnx_lrp import regression as rg
from onnx_lrp.core.errors import InputError, OutputError
from onnx_lrp.core.files import printable, require_suffix
from onnx_lrp.core.interface import FORWARD_PREFIX
from onnx_lrp.io import heatmap as hm
from onnx_lrp.io.inputs import items_kind, model_channel_axis
from onnx_lrp.metrics import tracking
from onnx_lrp.regression.html import drift_image
from onnx_lrp.run import deployed_gap as gaps
from onnx_lrp.run.batches import explain_all

from .class_targets import class_names, labels_option, resolve_named, say_names, target_option
from .helpfmt import Command, Row
from .io import AtomicOutputs, Progress, check_writable, guard
from .options import (BINDING_ROWS, INPUT_ROWS, RULE_ROWS, Setup, build_explainer, common, explainer_setup,
                      input_options)
from .methods import (METHOD_KEYS, method_explainer, method_keywords, method_options, snapshot_keywords, snapshot_method,
                      with_base_params, with_lrp_method)
from .regress_options import Asked, Engine, Faith, Reports, packed


EXIT_DRIFT = 1


def _say(msg: str) -> None:
    click.echo(f"onnx-lrp: {msg}", err=True)


# ---------------------------------------------------------------------------------------------- options
def threshold_options(f):
    """Per-metric thresholds (a number, or off), --config, and the report files."""
    d = rg.DEFAULT_THRESHOLDS
    opts = [
        click.option("--max-output-diff", default=None, metavar="FLOAT|off",
                     help=f"Outputs: max|y - y0| / max|y0| ({d.max_output_diff})."),
        click.option("--min-cosine", default=None, metavar="FLOAT|off",
                     help=f"Relevance: cosine similarity ({d.min_cosine})."),
        click.option("--max-rel-l2", default=None, metavar="FLOAT|off",
                     help=f"Relevance: ||r - r0|| / ||r0||, each map over its sum of |r| ({d.max_rel_l2})."),
        click.option("--min-spearman", default=None, metavar="FLOAT|off",
                     help=f"Relevance: Spearman rank correlation ({d.min_spearman})."),
        click.option("--min-topk-iou", default=None, metavar="FLOAT|off",
                     help=f"Relevance: IoU of the top-k % ({d.min_topk_iou})."),
        click.option("--topk-percent", default=None, metavar="FLOAT",
                     help=f"k of the top-k IoU, in % ({d.topk_percent:g})."),
        click.option("--fail-on", "fail_on", default=None, metavar="KINDS",
                     help=f"What fails: {', '.join(rg.KINDS)} or none ({','.join(rg.DEFAULT_FAIL_ON)})."),
        click.option("--config", "config", default=None, metavar="FILE.toml",
                     help=f"Thresholds ([check]; default ./{rg.CONFIG_NAME})."),
        click.option("--report-json", "report_json", default=None, metavar="FILE.json",
                     help="Also every figure as JSON."),
        click.option("--report-html", "report_html", default=None, metavar="FILE.html",
                     help="Also one HTML page: the table and heatmaps."),
        click.option("--junit-xml", "junit_xml", default=None, metavar="FILE.xml",
                     help="Also JUnit XML, one test case per sample."),
        click.option("--heatmap-dir", "heatmap_dir", default=None, metavar="DIR",
                     help="Heatmaps of every drifted sample here."),
        click.option("--max-rows", type=click.IntRange(min=1), default=50, metavar="N",
                     help="Rows of the table on stdout (50)."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


THRESHOLD_ROWS = ["max_output_diff", "min_cosine", "max_rel_l2", "min_spearman", "min_topk_iou", "topk_percent",
                  "fail_on", "config"]
REPORT_ROWS = ["report_json", "junit_xml", "report_html", "heatmap_dir", "max_rows"]


def _pop_thresholds(kw: dict) -> tuple[rg.Thresholds, str | None]:
    overrides = {k: kw.pop(k, None) for k in ("max_output_diff", "min_cosine", "max_rel_l2", "min_spearman",
                                              "min_topk_iou", "topk_percent", "fail_on")}
    return rg.load_thresholds(kw.pop("config", None), overrides)


REPORT_SUFFIXES = {"--report-json": ((".json",), "the JSON report"), "--junit-xml": ((".xml",), "the JUnit report"),
                   "--report-html": ((".html", ".htm"), "the HTML report")}


def _check_outputs(reports, inputs=(), models=()) -> dict:
    """The report files by option (None where not asked for), each checked before anything runs: its suffix,
    writable, not one of ``inputs`` / ``models`` (with their data files; :func:`cli.io.guard`)."""
    report_json, junit_xml, report_html, heatmap_dir = (reports.report_json, reports.junit_xml, reports.report_html,
                                                        reports.heatmap_dir)
    paths = {opt: Path(p) for opt, p in (("--report-json", report_json), ("--junit-xml", junit_xml),
                                         ("--report-html", report_html)) if p is not None}
    guard(inputs, list(paths.items()), models=models)  # first: the refusal names the input it would destroy
    for opt, p in paths.items():
        require_suffix(opt, p, *REPORT_SUFFIXES[opt])
        check_writable(p)
    if len({p.resolve() for p in paths.values()}) < len(paths):
        raise OutputError(f"{', '.join(paths)} name the same file; give different files")
    hdir = Path(heatmap_dir) if heatmap_dir else None
    if hdir is not None and hdir.exists() and not hdir.is_dir():
        raise OutputError(f"--heatmap-dir {hdir} is a file; give a directory")
    if hdir is not None and not hdir.exists():
        check_writable(hdir)  # created later: its parent must exist and be writable
    return dict(report_json=paths.get("--report-json"), junit_xml=paths.get("--junit-xml"),
                report_html=paths.get("--report-html"), heatmap_dir=hdir, inputs=list(inputs), models=list(models))


def _channel_axis(ex) -> int:
    """The channel axis of the first float input, from the model's layout (the Transpose after an NHWC input)."""
    first = ex.relevance_inputs[0]
    spec = next(s for s in ex.inputs if s.name == first)
    return model_channel_axis(ex.relevance_model.model_bytes, first, spec.dims)


def _safe(name: str) -> str:
    """A file-name stem for an item name (``digit_3.png`` -> ``digit_3``, ``batch.npy[2]`` -> ``batch.npy_2``)."""
    name = re.sub(r"\.(png|jpe?g|bmp|gif|tiff?|webp)$", "", name, flags=re.IGNORECASE)
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("._") or "item"


def _maps(ex, base, cur):
    """The first float input's relevance of the baseline and the current run as [N, H, W] maps."""
    first = ex.relevance_inputs[0]
    axis = _channel_axis(ex)
    return hm.relevance_maps(base.relevance[first], axis), hm.relevance_maps(cur.relevance[first], axis)


@dataclass(frozen=True)
class _Compared:
    """What a check or diff compared: the comparison, the baseline and current results, and the explainer whose
    inputs draw the heatmaps."""
    comp: object
    base: object
    cur: object
    ex: object


def _write_reports(compared: _Compared, context, files: dict, suite, faith=None):
    comp, base, cur, ex = compared.comp, compared.base, compared.cur, compared.ex
    written = []
    heatmap_dir = files["heatmap_dir"]
    maps = _maps(ex, base, cur) if files["report_html"] is not None or (heatmap_dir and comp.drifted) else None
    with AtomicOutputs() as w:
        if files["report_json"] is not None:
            written.append(w.write_bytes(files["report_json"], rg.report_json(comp, context).encode()))
        if files["junit_xml"] is not None:
            xml = rg.junit_xml(comp, context, suite=suite)
            if faith is not None:
                xml = tracking.add_to_junit(xml, faith, printable(Path(str(context.get("model", "model"))).stem))
            written.append(w.write_bytes(files["junit_xml"], xml.encode()))
        if files["report_html"] is not None:
            written.append(w.write_bytes(files["report_html"], rg.report_html(comp, context, *maps).encode()))
        if heatmap_dir is not None and faith is not None:
            heatmap_dir.mkdir(parents=True, exist_ok=True)
            guard(files["inputs"], [("--heatmap-dir", heatmap_dir / "faithfulness_curves.png")], models=files["models"])
            written.append(w.save_png(heatmap_dir / "faithfulness_curves.png", _faith_plot(faith, context)))
        if heatmap_dir is not None and comp.drifted:
            heatmap_dir.mkdir(parents=True, exist_ok=True)
            for s in comp.drifted:  # names known only now: each checked against the inputs before the commit
                guard(files["inputs"], [("--heatmap-dir", heatmap_dir / f"{s.index:04d}_{_safe(s.item)}.png")],
                      models=files["models"])
                written.append(w.save_png(heatmap_dir / f"{s.index:04d}_{_safe(s.item)}.png", _drift_picture(s, *maps)))
    return written


def _drift_picture(s, rb, rc):
    """Baseline and current heatmaps of one sample (each on its own scale) and their difference on the baseline's
    scale (the HTML report's tile: a small drift stays near white), with its figures in the captions."""
    i = s.index
    m = s.metrics
    pred = f"pred {s.predicted_baseline}" + ("" if s.predicted_current == s.predicted_baseline
                                             else f" -> {s.predicted_current}")
    labels = [[f"baseline: {s.item}", f"target {s.target}, {pred}"],
              ["current", rg.sample_status(s)[:200]],
              ["difference, on the baseline's scale",
               f"cos {m['cosine']:.3f}  rel-L2 {m['rel_l2']:.3f}  out {m['output_diff']:.2g}"]]
    return drift_image(rb[i], rc[i], labels, size=200,
                       colorbar="baseline, current: each its own largest |R|; difference: the baseline's")


def _faith_plot(faith, context):
    """Baseline (dashed) and candidate (solid) perturbation curves, mean over the items."""
    from .curves import line_plot, perturbation_series

    series = perturbation_series(faith.curves["baseline"], "baseline ", dashed=True)
    series += perturbation_series(faith.curves["current"], "current ")
    return line_plot(series, f"region perturbation: {Path(str(context.get('model', ''))).name} against its baseline",
                     "regions replaced", "score of the target (mean over items)")


def _report(compared: _Compared, context, files: dict, max_rows, suite, seconds, faith=None, faith_lines=()):
    comp = compared.comp
    context = dict(context, seconds=round(seconds, 3))
    if faith is not None:
        context["faithfulness"] = faith.as_dict()
    click.echo(rg.format_table(comp, max_rows))
    for line in faith_lines:
        click.echo(line)
    written = _write_reports(compared, context, files, suite, faith)
    n, d = len(comp.samples), len(comp.drifted)
    fail_on = comp.thresholds.fail_on
    for kind, count in comp.drift_counts().items():
        if count and kind not in fail_on:
            click.echo(f"note: {kind} drift in {count} of {n} sample(s), reported, not failing (--fail-on "
                       f"{','.join(k for k in rg.KINDS if k in fail_on or k == kind)} fails on it)")
    if d:
        kinds = ", ".join(f"{k} {v}" for k, v in comp.drift_counts().items() if k in fail_on and v)
        names = ", ".join(s.item for s in comp.drifted[:10]) + (f" and {d - 10} more" if d > 10 else "")
        click.echo(f"DRIFT: {d} of {n} sample(s) beyond the thresholds ({kinds}): {names}")
    else:
        click.echo(f"OK: all {n} sample(s) within the thresholds (fail on {', '.join(fail_on) or 'nothing'})")
    if faith is not None and not faith.passed:
        click.echo("FAITHFULNESS: " + "; ".join(faith.failed))
    for p in written:
        click.echo(f"wrote {p}")
    return EXIT_DRIFT if d or (faith is not None and not faith.passed) else 0


def _setup(model, composite, kw: dict, inputs_path) -> Setup:
    """The options' explainer setup (:func:`explainer_setup`); the ZBox note on stderr."""
    setup = explainer_setup(model, dict(kw, composite=composite), data_kind=items_kind(inputs_path))
    if setup.zbox_note:
        _say(setup.zbox_note)
    return setup


def _explainer(model, composite, output_name, start, **bindings):
    from onnx_lrp.core.relevance_model import BuildOptions
    from onnx_lrp.run.options import RunOptions

    ex = build_explainer(model, composite, BuildOptions(output=output_name, **bindings), RunOptions(start=start))
    ex.gap_warnings = False  # the report says it, once
    return ex


def _gap_note(gap_list: list, names: list) -> dict | None:
    """The largest gap between deployed outputs and explained forward of a run (printed when beyond its tolerance)."""
    gap = gaps.worst(gap_list)
    if gap is not None and gap.beyond:
        click.echo(f"note: {gap.message(names)}")
    return gap.as_dict() if gap is not None else None


def _inputs_for(ex, arrays: dict, where: str) -> dict:
    want = {s.name for s in ex.inputs}
    if set(arrays) != want:
        raise InputError(f"{where} holds inputs {', '.join(sorted(arrays))} but the model's inputs are "
                         f"{', '.join(sorted(want))}; the model's interface changed: take a new snapshot")
    return arrays


def _targets(targets, n):
    if isinstance(targets, list) and len(targets) != n:
        raise InputError(f"--target gives {len(targets)} classes for {n} item(s); give one, or one per item")
    return targets


# ---------------------------------------------------------------------------------------------- faithfulness
def faith_options(f):
    """snapshot --metrics and the region-perturbation settings stored with them."""
    opts = [
        click.option("--metrics", default=None, metavar="aopc,abpc",
                     help="Also store faithfulness (for check --metric-tol)."),
        click.option("--metric-patch", type=click.IntRange(min=1), default=8, metavar="N",
                     help="--metrics: side of the regions (8)."),
        click.option("--metric-steps", type=click.IntRange(min=1), default=50, metavar="N",
                     help="--metrics: regions replaced (50)."),
        click.option("--metric-baseline", type=click.Choice(["black", "white", "mean", "uniform"]), default="black",
                     metavar="black|white|mean|uniform", help="--metrics: the replacement value (black)."),
        click.option("--metric-seed", type=int, default=0, metavar="INT", help="--metrics: seeds the random order."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def _faith_eval(model, ex, arrays: dict, rel: dict, targets, settings: dict):
    if len(rel) != 1 or len(arrays) != 1:
        raise InputError("faithfulness metrics need a model with one float input; this one has "
                         f"{', '.join(sorted(arrays))}: drop --metrics")
    x = next(iter(arrays.values()))
    with Progress("faithfulness") as bar:
        bar.update(0, 1)
        ev = tracking.compute(model, ex, x, next(iter(rel.values())), targets, settings)
        bar.update(1, 1)
    return ev


# ---------------------------------------------------------------------------------------------- snapshot
@click.command("snapshot", cls=Command, sections=[
    ("What to store", ["out", "target", "labels", "output_name", "start", "batch_size",
                       Row(("metrics", "metric_patch", "metric_steps", "metric_baseline", "metric_seed"),
                           "Faithfulness too (region perturbation), for check --metric-tol.")]),
    ("Explanations", [*RULE_ROWS, Row(METHOD_KEYS, "Methods beyond LRP (docs/methods.md)."), *INPUT_ROWS,
                      *BINDING_ROWS])],
    examples=["onnx-lrp snapshot models/digits_cnn.onnx models/samples/npy -o baseline.npz",
              "onnx-lrp snapshot model.onnx inputs.npz -o baseline.npz --metrics aopc,abpc"])
@click.argument("model", metavar="MODEL")
@click.argument("inputs_path", metavar="INPUTS")
@click.option("-o", "--out", "out", required=True, metavar="BASELINE.npz", help="Where to write the snapshot.")
@common
@click.option("--target", "-t", default="argmax", metavar="INT|NAME[,..]|argmax",
              help="Class, one per item, or argmax (default).")
@labels_option
@click.option("--output", "output_name", default=None, metavar="NAME", help="Output to explain (default: the first).")
@click.option("--start", type=click.Choice(["logit", "one-hot"]), default="logit", metavar="logit|one-hot",
              help="Start: the logit (default) or 1 (zennit).")
@click.option("--batch-size", type=click.IntRange(min=1), default=32, metavar="N", help="Items per model run (32).")
@faith_options
@input_options
@method_options
@packed("asked", Asked)
@packed("faith", Faith)
def snapshot(model, inputs_path, out, asked: Asked, faith: Faith, composite, **rule_kw):
    """Store MODEL's explanations of INPUTS as a baseline for `onnx-lrp check`.

    INPUTS: a .npy, a .npz (one array per model input), an image or a directory of these. The snapshot keeps the
    inputs, targets (arg-max resolved now), outputs, relevance, composite and settings: a later check needs nothing
    else (docs/ci-regression.md).
    """
    target, output_name, start, batch_size = asked.target, asked.output_name, asked.start, asked.batch_size
    metrics, metric_patch, metric_steps, metric_baseline, metric_seed = (
        faith.metrics, faith.metric_patch, faith.metric_steps, faith.metric_baseline, faith.metric_seed)
    out_path = Path(out)
    if out_path.suffix.lower() != ".npz":
        raise OutputError(f"-o {out_path}: a snapshot is an .npz file; change the suffix")
    check_writable(out_path)
    guard([("the input", inputs_path)], [("-o", out_path)], models=[("the model", model)])
    tracked = tracking.parse_metrics(metrics)
    targets, labels = target_option(target), rule_kw.pop("labels", None)  # a name: resolved with the model
    composite = with_lrp_method(dict(rule_kw, composite=composite))["composite"]  # --method COMPOSITE
    setup = _setup(model, composite, rule_kw, inputs_path)
    t0 = time.perf_counter()
    method, method_kw = method_keywords(rule_kw)
    if method is not None:  # --base COMPOSITE: its rule parameters (--epsilon, --low/--high, ...)
        method_kw = with_base_params(method, method_kw, setup.params)
    ex = _explainer(model, setup.composite, output_name, start, **setup.bindings()) if method is None else \
        method_explainer(model, method, method_kw, output=output_name)
    comp_name, comp_toml = (method, "") if method else \
        rg.composite_source(ex.composite_name if ex.composite_reason else composite)  # auto
    batch = setup.read(inputs_path, ex.inputs)
    if len(batch) == 0:
        raise InputError(f"{inputs_path} holds no items (an empty batch); give at least one")
    targets = resolve_named(targets, ex, model, labels=class_names(labels, ex, model))
    _targets(targets, len(batch))
    gap_list = []
    with Progress("explaining") as bar:
        rel, outs, used = explain_all(ex, batch.arrays, targets, batch_size, progress=bar.update, gaps_out=gap_list)
    arrays = rg.snapshot_arrays(
        rg.Recorded(inputs=batch.arrays, targets=used, outputs=outs, relevance=rel, items=batch.names),
        rg.Provenance(model_path=model, composite_name=comp_name, composite_toml=comp_toml, params=setup.params,
                      start=start, output=output_name, explained_output=ex.explained_output, target_request=target,
                      batch_size=batch_size, machine=gaps.machine_facts(ex.device),
                      deployed_gap=gaps.worst(gap_list) and gaps.worst(gap_list).as_dict()))
    arrays = snapshot_method(arrays, method, method_kw)
    if tracked:
        settings = dict(patch=metric_patch, steps=metric_steps, baseline=metric_baseline, prob="softmax",
                        seed=metric_seed)
        ev = _faith_eval(model, ex, batch.arrays, rel, used, settings)
        meta_entry, extra = tracking.snapshot_part(ev, tracked)
        arrays = tracking.add_to_snapshot(arrays, meta_entry, extra)
        s = ev.summary()
        click.echo(f"faithfulness stored: AOPC {s['aopc/morf']:.4f}, ABPC {s['abpc']:.4f}, random order AOPC "
                   f"{s['aopc/random']:.4f} (region perturbation, patch {ev.params['patch']}, {ev.params['steps']} "
                   "regions)")
    with AtomicOutputs() as w:
        w.save_npz(out_path, arrays, compressed=True)
    click.echo(f"snapshot of {len(batch)} item(s) -> {out_path} (composite {comp_name}, start {start}, explained "
               f"output {ex.explained_output}, {time.perf_counter() - t0:.2f} s)")
    _gap_note(gap_list, batch.names)


# ---------------------------------------------------------------------------------------------- check
@click.command("check", cls=Command, sections=[
    ("Thresholds (per sample)", THRESHOLD_ROWS),
    ("Reports", [*REPORT_ROWS, "labels"]),
    ("Running", ["batch_size", Row(("engine", "workers", "ray_address"), "Recompute here or on Ray Data."),
                 "metric_tol"])],
    examples=["onnx-lrp check models/digits_cnn.onnx baseline.npz",
              "onnx-lrp check model.onnx baseline.npz --junit-xml lrp-junit.xml \\",
              "    --report-html lrp-report.html --fail-on outputs,relevance,predictions"])
@click.argument("model", metavar="MODEL")
@click.argument("baseline", metavar="BASELINE.npz")
@threshold_options
@click.option("--batch-size", type=click.IntRange(min=1), default=None, metavar="N",
              help="Items per model run (default: the snapshot's).")
@click.option("--engine", type=click.Choice(["local", "ray"]), default="local", metavar="local|ray",
              help="Recompute here, or on Ray Data actors for large snapshots (pip install 'onnx-lrp[ray]').")
@click.option("--workers", type=click.IntRange(min=1), default=None, metavar="N",
              help="--engine ray: actors (default: one per CPU, or per GPU).")
@click.option("--ray-address", "ray_address", default=None, metavar="ADDR",
              help="--engine ray: the cluster to join (auto: the one `ray start --head` started).")
@click.option("--metric-tol", "metric_tol", multiple=True, metavar="NAME=DROP|off",
              help=f"Faithfulness: most drop of aopc, abpc ({tracking.DEFAULT_TOLERANCE:g}).")
@labels_option
@packed("reports", Reports)
@packed("where", Engine)
def check(model, baseline, reports: Reports, batch_size, where: Engine, metric_tol, **kw):
    """Recompute MODEL's explanations with BASELINE's stored settings and compare them per sample.

    Output drift, relevance drift and changed predictions are reported apart; exit 1 when a kind --fail-on names
    happened (default: relevance drift or a changed prediction; the samples named on stdout and in the reports), 0
    when none did, 2 on bad input (docs/ci-regression.md).
    """
    th, config_used, labels = *_pop_thresholds(kw), kw.pop("labels", None)
    tolerances = tracking.parse_tolerances(metric_tol)
    max_rows, engine, workers, ray_address = reports.max_rows, where.engine, where.workers, where.ray_address
    files = _check_outputs(reports, [("the baseline", baseline), ("the --config file", config_used)],
                           [("the model", model)])
    snap = rg.read_snapshot(baseline)
    meta = snap.meta
    stored = _stored_faithfulness(baseline, meta, len(snap.targets), tolerances)
    t0 = time.perf_counter()
    method, method_kw = snapshot_keywords(baseline, meta)
    ex = _explainer(model, snap.composite(), meta.get("output"), meta["start"]) if method is None else \
        method_explainer(model, method, method_kw, output=meta.get("output"))
    arrays = _inputs_for(ex, snap.inputs, f"baseline {baseline}")
    batch_size = batch_size or int(meta.get("batch_size") or 32)
    rel, outs, gap_list = _recompute(ex, arrays, snap.targets, batch_size, engine, workers, ray_address)
    base = snap.result()
    if ex.explained_output not in outs:
        raise InputError(f"the model has no output {meta['explained_output']!r}")
    cur = rg.Result(rel, outs[ex.explained_output], snap.targets, base.items, outs,
                    outs.get(FORWARD_PREFIX + ex.explained_output))
    comp = rg.compare(base, cur, th)
    context = _check_context(model, baseline, meta, ex, config_used, base, cur)
    click.echo(f"check {model} against {baseline}: {len(comp.samples)} sample(s), composite "
               f"{meta['composite']['name']}, model {'changed' if context['model_changed'] else 'unchanged'} "
               f"(sha256 {context['model_sha256']['current'][:12]})"
               + (f", thresholds from {config_used}" if config_used else ""))
    say_names(comp, class_names(labels, ex, model), context)
    deployed_diff = context.get("deployed_outputs")
    if deployed_diff is not None and deployed_diff["differ"]:
        click.echo(f"note: {rg.deployed_difference_message(deployed_diff, ex.explained_output)}")
    gap_now = _gap_note(gap_list, base.items)
    if gap_now is not None:
        context["deployed_gap"] = gap_now
    faith, lines = None, ()
    if stored is not None:
        ev = _faith_eval(model, ex, arrays, rel, snap.targets, stored.settings)
        faith = tracking.check(stored, ev, tolerances)
        lines = tracking.format_lines(faith, stored.settings)
    code = _report(_Compared(comp, base, cur, ex), context, files, max_rows, "onnx-lrp check",
                   time.perf_counter() - t0, faith, lines)
    raise SystemExit(code)


def _stored_faithfulness(baseline, meta: dict, n: int, tolerances: dict):
    """The faithfulness figures a snapshot stores (None without), refused when --metric-tol asks for others."""
    stored = tracking.read_stored(baseline, meta, n)
    if tolerances and stored is None:
        raise InputError(f"--metric-tol: baseline {baseline} holds no faithfulness metrics; take it with "
                         "`onnx-lrp snapshot --metrics aopc,abpc`")
    missing = [n for n in tolerances if stored is not None and n not in stored.settings["metrics"]]
    if missing:
        raise InputError(f"--metric-tol {missing[0]}: baseline {baseline} stores "
                         f"{', '.join(stored.settings['metrics'])} only; take it with `onnx-lrp snapshot --metrics "
                         f"{','.join(tracking.TRACKED)}`")
    return stored


def _recompute(ex, arrays: dict, targets, batch_size: int, engine: str, workers, ray_address):
    """(relevance, outputs, deployed-output gaps) of a snapshot's inputs, here or on Ray."""
    from onnx_lrp.dataset import explain_arrays

    gap_list = []
    with Progress("explaining") as bar:
        if engine == "local":
            rel, outs, _ = explain_all(ex, arrays, targets, batch_size, progress=bar.update, gaps_out=gap_list)
        else:
            rel, outs, _ = explain_arrays(ex, arrays, targets, batch_size, engine, workers, ray_address,
                                          progress=bar.update)
    return rel, outs, gap_list


def _check_context(model, baseline, meta: dict, ex, config_used, base, cur) -> dict:
    """What a check's reports record besides the samples: model digests and versions of both runs, the deployed
    outputs' difference between the two machines; a line on stderr when the onnx-lrp versions differ."""
    from onnx_lrp import __version__
    from onnx_lrp.load import model_sha256

    machine = gaps.machine_facts(ex.device) if base.forward is not None else None
    deployed_diff = rg.deployed_difference(base, cur, ex.relevance_model.output_step,
                                           dict(baseline=meta.get("machine"), current=machine))
    sha = model_sha256(model)
    context = dict(command="check", model=str(model), baseline=str(baseline),
                   composite=meta["composite"]["name"], start=meta["start"],
                   explained_output=ex.explained_output, config=config_used,
                   model_sha256=dict(baseline=meta.get("model", {}).get("sha256"), current=sha),
                   model_changed=sha != meta.get("model", {}).get("sha256"),
                   onnx_lrp_version=dict(baseline=meta.get("onnx_lrp_version"), current=__version__))
    if deployed_diff is not None:
        context["deployed_outputs"] = deployed_diff
    if context["onnx_lrp_version"]["baseline"] != __version__:
        _say(f"the baseline was made with onnx-lrp {meta.get('onnx_lrp_version')}, this is {__version__}: "
             "differences can come from onnx-lrp itself")
    return context


# ---------------------------------------------------------------------------------------------- diff
@click.command("diff", cls=Command, sections=[
    ("What to explain", ["target", "labels", "output_name", "start", "batch_size", *RULE_ROWS]),
    ("Inputs", [*INPUT_ROWS, *BINDING_ROWS]),
    ("Thresholds (per sample)", THRESHOLD_ROWS),
    ("Reports", REPORT_ROWS)],
    examples=["onnx-lrp diff model.onnx model.int8.onnx inputs.npz",
              "onnx-lrp diff v1.onnx v2.onnx images/ --mean 0.5 --std 0.25 --max-rows 10"])
@click.argument("model_a", metavar="MODEL_A")
@click.argument("model_b", metavar="MODEL_B")
@click.argument("inputs_path", metavar="INPUTS")
@common
@click.option("--target", "-t", default="argmax", metavar="INT|NAME[,..]|argmax",
              help="Class (argmax: MODEL_A's), one per item.")
@labels_option
@click.option("--output", "output_name", default=None, metavar="NAME", help="Output to explain (default: the first).")
@click.option("--start", type=click.Choice(["logit", "one-hot"]), default="logit", metavar="logit|one-hot",
              help="Start: the logit (default) or 1 (zennit).")
@threshold_options
@click.option("--batch-size", type=click.IntRange(min=1), default=32, metavar="N", help="Items per model run (32).")
@input_options
@packed("asked", Asked)
@packed("reports", Reports)
def diff(model_a, model_b, inputs_path, asked: Asked, reports: Reports, composite, **kw):
    """Compare the explanations of two model versions on INPUTS (MODEL_A is the reference), without a baseline.

    The same metrics, thresholds and --fail-on as `check`; exit 1 when a kind of drift it names happened, else 0.
    MODEL_B is explained at MODEL_A's targets.
    """
    from onnx_lrp.load import model_sha256

    target, output_name, start, batch_size = asked.target, asked.output_name, asked.start, asked.batch_size
    max_rows = reports.max_rows
    th, config_used, labels = *_pop_thresholds(kw), kw.pop("labels", None)
    files = _check_outputs(reports, [("the input", inputs_path), ("the --config file", config_used)],
                           [("MODEL_A", model_a), ("MODEL_B", model_b)])
    targets = target_option(target)  # an index, or a class name resolved once the model is built
    setup = _setup(model_a, composite, kw, inputs_path)
    comp_rules = setup.composite
    t0 = time.perf_counter()
    ex_a = _explainer(model_a, comp_rules, output_name, start, **setup.bindings())
    ex_b = _explainer(model_b, comp_rules, output_name, start, **setup.bindings())
    batch = setup.read(inputs_path, ex_a.inputs)
    if len(batch) == 0:
        raise InputError(f"{inputs_path} holds no items (an empty batch); give at least one")
    targets = resolve_named(targets, ex_a, model_a, labels=(names := class_names(labels, ex_a, model_a)))
    _targets(targets, len(batch))
    arrays_b = _inputs_for(ex_b, batch.arrays, f"MODEL_B {model_b} (inputs of MODEL_A)")
    n = len(batch)
    gap_list = []  # MODEL_B's deployed outputs against its explained forward
    with Progress("explaining") as bar:
        rel_a, outs_a, used = explain_all(ex_a, batch.arrays, targets, batch_size,
                                             progress=lambda d, t: bar.update(d, 2 * t))
        rel_b, outs_b, _ = explain_all(ex_b, arrays_b, used, batch_size,
                                          progress=lambda d, t: bar.update(n + d, 2 * t), gaps_out=gap_list)
    base = rg.Result(rel_a, outs_a[ex_a.explained_output], used, batch.names, outs_a,
                     outs_a.get(FORWARD_PREFIX + ex_a.explained_output))
    cur = rg.Result(rel_b, outs_b[ex_b.explained_output], used, batch.names, outs_b,
                    outs_b.get(FORWARD_PREFIX + ex_b.explained_output))
    comp = rg.compare(base, cur, th)
    context = dict(command="diff", model=str(model_b), model_a=str(model_a), model_b=str(model_b),
                   inputs=str(inputs_path), composite=comp_rules.name, start=start,
                   explained_output=ex_a.explained_output, config=config_used,
                   model_sha256=dict(a=model_sha256(model_a), b=model_sha256(model_b)))
    click.echo(f"diff {model_a} -> {model_b}: {len(comp.samples)} sample(s), composite {comp_rules.name}"
               + (f", thresholds from {config_used}" if config_used else ""))
    say_names(comp, names, context)
    gap_b = _gap_note(gap_list, batch.names)
    if gap_b is not None:
        context["deployed_gap"] = gap_b
    code = _report(_Compared(comp, base, cur, ex_b), context, files, max_rows, "onnx-lrp diff",
                   time.perf_counter() - t0)
    raise SystemExit(code)


__all__ = ["snapshot", "check", "diff", "threshold_options"]
