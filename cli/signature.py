"""What ``onnx-lrp inspect`` says about a model's interface: its inputs and outputs (name, element type, shape with
its symbolic axes) and an ``explain`` command line that fits them."""
from __future__ import annotations

import shlex
from pathlib import Path

from onnx_lrp.io.inputs import IMAGENET_MEAN, IMAGENET_STD, channels_last, model_signature

TOKEN_NAMES = ("input_ids", "ids", "tokens", "token_ids")


def signature(model, constants: dict | None = None) -> dict:
    """``{"inputs": [...], "outputs": [...]}`` (:func:`onnx_lrp.io.inputs.model_signature`), without the inputs that
    --constant binds (they are no longer fed)."""
    sig = model_signature(model)
    bound = set(constants or ())
    return dict(inputs=[v for v in sig["inputs"] if v["name"] not in bound], outputs=sig["outputs"])


def shape_text(dims) -> str:
    """``[batch, 3, 224, 224]``: sizes, symbolic axes by name, ``?`` for an unnamed dynamic axis."""
    if dims is None:
        return "(shape unknown)"
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


def signature_lines(sig: dict) -> list[str]:
    """The inputs and outputs, one aligned line each."""
    rows = [(what, v) for what in ("inputs", "outputs") for v in sig[what]]
    width = max([len(v["name"]) for _, v in rows] or [0])
    tw = max([len(v["dtype"]) for _, v in rows] or [0])
    lines = []
    for what in ("inputs", "outputs"):
        lines.append(f"{what}:" + ("" if sig[what] else " (none)"))
        lines += [f"  {v['name']:<{width}}  {v['dtype']:<{tw}}  {shape_text(v['dims'])}" for v in sig[what]]
    return lines


def _is_tokens(v: dict) -> bool:
    return v["dtype"].startswith("int") and (v["name"].lower() in TOKEN_NAMES or v["name"].lower().endswith("_ids"))


def suggestion(model, sig: dict, composite: str | None = None, output: str | None = None) -> dict:
    """An ``explain`` command line for the model's inputs (``command``) and what to put in for its placeholders
    (``note``): text models take --text and --tokenizer, a single image-like input an image, a single other input an
    .npy array, several inputs an .npz with one array per input. ``composite``, ``output``: inspect's own options."""
    inputs, outputs = sig["inputs"], sig["outputs"]
    stem = Path(str(model)).name.removesuffix(".onnx")
    head = ["onnx-lrp", "explain", str(model)]
    comp = ["--composite", str(composite)] if composite and composite != "auto" else []
    comp += ["--output", output] if output else []
    floats = [v for v in inputs if v["dtype"].startswith(("float", "bfloat"))]
    if any(_is_tokens(v) for v in inputs):
        args, note = text_args(model)
    elif len(inputs) == 1 and len(floats) == 1 and _image_like(floats[0]["dims"]):
        args, note = _image_args(floats[0]["dims"], stem)
    elif len(inputs) == 1:
        v = inputs[0]
        args = ["INPUT.npy", "-o", f"{stem}.relevance.npy"]
        note = f"INPUT.npy: a {v['dtype']} array shaped {shape_text(v['dims'])} (the batch axis may be left out)"
    else:
        args = ["INPUTS.npz", "-o", f"{stem}.relevance.npz"]
        note = "INPUTS.npz: one array per input, named " + ", ".join(v["name"] for v in inputs) + " (np.savez)"
    if len(outputs) > 1 and not output:
        note += f"; --output NAME explains another of its {len(outputs)} outputs (default: the first)"
    if composite and composite != "auto" and "box" in composite and "--mean" not in note:
        note += "; the box rule's bounds: --mean/--std (normalised inputs) or --low/--high"
    return dict(command=" ".join(shlex.quote(a) for a in head + args + comp), note=note)


def text_args(model) -> tuple[list, str]:
    """--text's arguments for a text model: the tokenizer.json and the class names beside the model, by paths that
    work from the current directory (the model's path as given, joined: relative stays relative to here)."""
    import os

    folder = os.path.dirname(str(model))
    tokenizer = os.path.join(folder, "tokenizer.json")
    page = f"{_page_stem(model)}.tokens.html"
    found = os.path.isfile(tokenizer)
    args = ["--text", "TEXT", "--tokenizer", tokenizer if found else "TOKENIZER.json", "--html", page]
    note = "TEXT: the text to explain (needs pip install 'onnx-lrp[text]'); " + (
        f"{tokenizer}: the model's own tokenizer, found beside it" if found else
        "TOKENIZER.json: the model's own tokenizer (none is beside the model)")
    names = _class_names(os.path.join(folder, "config.json"))
    if names:
        shown = ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")
        note += f"; --target NAME explains a class by its name from the config.json beside it ({shown})"
    return args, note


def _page_stem(model) -> str:
    """The default token page's name: the model file's stem, its folder's name for a generic model.onnx."""
    p = Path(str(model)).absolute()
    return p.parent.name if p.stem == "model" and p.parent.name else p.stem


def _class_names(config) -> list:
    from onnx_lrp.io.text_inputs import config_labels

    try:
        names = config_labels(Path(config).parent)
    except Exception:  # noqa: BLE001 - a suggestion: a config.json it cannot read names no classes
        return []
    return [names[k] for k in sorted(names)] if names else []


def _image_like(dims) -> bool:
    if not dims or len(dims) != 4:
        return False
    c = dims[3] if channels_last(dims) else dims[1]
    return c in (1, 3) or not isinstance(c, int)


def _image_args(dims, stem: str) -> tuple[list, str]:
    last = channels_last(dims)
    c, h, w = (dims[3], dims[1], dims[2]) if last else (dims[1], dims[2], dims[3])
    args = ["IMAGE.png"]
    if not (isinstance(h, int) and isinstance(w, int)):
        args += ["--size", "H,W"]
        size = "H,W: the size it was trained at"
    else:
        size = f"resized to {h}x{w} keeping the aspect (the shorter side fitted, the centre cut, or --squash)"
    args += ["--heatmap", f"{stem}.heat.png", "-o", f"{stem}.relevance.npy"]
    norm = (f"add --mean/--std as in training (ImageNet: --mean {','.join(map(str, IMAGENET_MEAN))} --std "
            f"{','.join(map(str, IMAGENET_STD))})") if c != 1 else "add --mean/--std if it was trained on normalised pixels"
    return args, f"IMAGE.png: any image (or a directory of them), {size}; {norm}"


__all__ = ["shape_text", "signature", "signature_lines", "suggestion"]
