"""``--target`` as the subcommands read it (``explain``, ``evaluate``, ``trace``, ``snapshot``, ``diff``): an index,
one per item, or class names: the option is read before the model is built (:func:`target_option`) and names are resolved once the
explainer knows the classes (:func:`resolve_named`), from the model's ``id2label`` metadata or the config.json
beside it (or in its export folder), as ``explain`` does.
"""
from __future__ import annotations

import click
import numpy as np

from onnx_lrp.core.errors import InputError, LrpError

#: --labels as every subcommand that names classes takes it (the help row: ``labels``)
LABELS_HELP = "Class names: JSON list, lines, config.json."


def parse_target(text: str | None, what: str = "--target"):
    """None (arg-max), an int, or a list of ints."""
    if text is None or (what == "--target" and str(text).strip().lower() in ("", "argmax")):
        return None
    hint = "give argmax, one class index (3) or one per item (3,1,4)" if what == "--target" else \
        "give one index (5) or one per item (5,7,2)"
    try:
        vals = [int(v) for v in str(text).replace(" ", "").split(",") if v != ""]
    except ValueError:
        raise InputError(f"{what} {text!r}: {hint}") from None
    if not vals:
        raise InputError(f"{what} {text!r}: {hint}")
    if any(v < 0 for v in vals):
        raise InputError(f"{what} {text!r}: indices are >= 0")
    return vals[0] if len(vals) == 1 else vals


def target_option(text, what: str = "--target"):
    """--target as :func:`parse_target` reads it (None, an index, a list of indices), or the text itself when it
    names classes (``tabby``, ``positive,negative``): resolved by :func:`resolve_named` once the model is built."""
    from onnx_lrp.io.labels import by_name

    try:
        return parse_target(text, what)
    except InputError:
        if by_name(str(text)):
            return str(text)
        raise


def resolve_named(targets, ex, model, what: str = "--target", labels=None):
    """``targets`` as :func:`target_option` returned them, with a class name turned into its index: the whole text
    one name, else one name (or index) per item, comma-separated. Names come from the model's ``id2label``
    metadata or the config.json beside ``model`` (``labels``: names already found, e.g. from --labels); a miss is
    refused in one line naming the closest classes."""
    from onnx_lrp.io.labels import find_labels, resolve_target
    from onnx_lrp.io.model_folder import resolve_model_folder

    if not isinstance(targets, str):
        return targets
    path = model
    try:
        path = resolve_model_folder(model)[0]
    except (LrpError, TypeError, OSError):
        pass
    labels = labels or getattr(ex, "labels", None) or find_labels(None, ex, path)
    width = ex.output_width()
    try:
        return resolve_target(targets, labels, width, what)
    except InputError:
        parts = [p.strip() for p in targets.split(",")]
        if len(parts) < 2 or not all(parts):
            raise
        return [resolve_target(p, labels, width, what) for p in parts]


def labels_option(f):
    """``--labels FILE`` (the class names: a JSON list, one name per line, a config.json with ``id2label``) on a
    click command; its value reaches the command as ``labels`` (see :func:`class_names`)."""
    return click.option("--labels", "labels", default=None, metavar="FILE", help=LABELS_HELP)(f)


def class_names(labels_file, ex, model) -> list[str] | None:
    """The class names of ``model`` as ``explain`` finds them: ``--labels`` (refused in one line when it does not
    count the classes), else the model's ``id2label`` metadata, else the config.json beside it; None without."""
    from onnx_lrp.io.labels import find_labels
    from onnx_lrp.io.model_folder import resolve_model_folder

    path = model
    try:
        path = resolve_model_folder(model)[0]
    except (LrpError, TypeError, OSError):
        pass
    return find_labels(labels_file, getattr(ex, "_runner", None) or ex, path)


def one_class(text, ex, model, labels_file=None) -> tuple[int | None, list[str] | None]:
    """(the class index of ``--target`` for a command that explains one class: None for argmax, an index or a
    class name, the class names found): a list of classes is refused in one line."""
    labels = class_names(labels_file, ex, model)
    target = resolve_named(target_option(None if text is None else str(text)), ex, model, labels=labels)
    if isinstance(target, list):
        raise InputError(f"--target {text!r}: this command explains one class; give one index or name")
    return target, labels


def report_names(comp, labels, context: dict) -> list[str]:
    """``check`` / ``diff`` with class names: ``class_names`` in the JSON report's context (its samples' target and
    predicted indices index it), and one line per changed prediction naming both classes (none without names)."""
    if not labels:
        return []
    context["class_names"] = list(labels)
    shown = lambda i: f"{i} {labels[i]!r}" if 0 <= int(i) < len(labels) else f"{i}"  # noqa: E731
    return [f"prediction changed: {s.item}: {shown(s.predicted_baseline)} -> {shown(s.predicted_current)}"
            for s in comp.samples if s.predicted_current != s.predicted_baseline]


def say_names(comp, labels, context: dict) -> None:
    """Print :func:`report_names`' lines (and put the names in ``context``)."""
    for line in report_names(comp, labels, context):
        click.echo(line)


def named(indices, labels) -> list | None:
    """The names of the class ``indices`` (one or many) for JSON, or None without names."""
    from onnx_lrp.io.labels import label_of

    if not labels or indices is None:
        return None
    return [label_of(i, labels) for i in np.asarray(indices).reshape(-1)]


__all__ = ["class_names", "labels_option", "named", "one_class", "report_names", "say_names", "parse_target", "resolve_named", "target_option"]
