"""``--target`` by class name for the subcommands beyond ``explain`` (``evaluate``, ``trace``, ``snapshot``,
``diff``): the option is read before the model is built (:func:`target_option`) and names are resolved once the
explainer knows the classes (:func:`resolve_named`), from the model's ``id2label`` metadata or the config.json
beside it (or in its export folder), as ``explain`` does.
"""
from __future__ import annotations

from onnx_lrp.core.errors import InputError, LrpError

from .explain import parse_target


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


def resolve_named(targets, ex, model, what: str = "--target"):
    """``targets`` as :func:`target_option` returned them, with a class name turned into its index: the whole text
    one name, else one name (or index) per item, comma-separated. Names come from the model's ``id2label``
    metadata or the config.json beside ``model``; a miss is refused in one line naming the closest classes."""
    from onnx_lrp.io.labels import find_labels, resolve_target
    from onnx_lrp.io.model_folder import resolve_model_folder

    if not isinstance(targets, str):
        return targets
    path = model
    try:
        path = resolve_model_folder(model)[0]
    except (LrpError, TypeError, OSError):
        pass
    labels = getattr(ex, "labels", None) or find_labels(None, ex, path)
    width = ex.output_width()
    try:
        return resolve_target(targets, labels, width, what)
    except InputError:
        parts = [p.strip() for p in targets.split(",")]
        if len(parts) < 2 or not all(parts):
            raise
        return [resolve_target(p, labels, width, what) for p in parts]


__all__ = ["resolve_named", "target_option"]
