"""What one ``explain`` call returns: `Explanation` (the relevance, the outputs, the targets), its short
``repr`` and its heatmap picture (``heatmap()``, ``_repr_png_`` for notebooks).

An item given without its batch axis gets every per-item field without one too, as a PyTorch module called on an
unbatched input answers (zennit and captum return the input's shape): `given_without_batch_axis` tells such a
call from its inputs, `Explanation.without_batch_axis` drops the axis.
"""
from __future__ import annotations

import dataclasses
import io
from dataclasses import dataclass, field

import numpy as np

from ..core.brief import brief_repr

NOTEBOOK_ITEMS = 48  # _repr_png_ draws at most this many items (as the CLI's --heatmap puts on one page)


@dataclass(repr=False)
class Explanation:
    """What one `explain` call returns: the relevance, the model's outputs and what was explained.

    One item given without its batch axis (every input one axis short of the model's, e.g. an image [C, H, W] for a
    model of [N, C, H, W]; for a dict, every input so) gets every per-item field without one too, as a PyTorch
    module called on an unbatched input answers: `batched` is False, `relevance` is [C, H, W], `target`,
    `position` and `explained_value` are numpy scalars, and `outputs`, `forward` and `relevance_at` lose their
    leading axis of length 1. (Tensors returned as onnxruntime `OrtValue`s, for an `OrtValue` input, keep the
    axis.)

    For quantized and float16 models `outputs` are the deployed model's, as onnxruntime computes them on this
    machine from the file as written; `forward` holds the outputs of the explained forward the relevance is
    computed on.

    Attributes:
        relevance: the relevance, in the shape of `x` as given (a dict by input name when the model has several
            float inputs). For integer inputs (token ids) one value per token: the relevance at the output of
            their embedding lookup, summed over the embedding dimension.
        outputs: the model's outputs by name.
        target: the explained index per item (into the explained output flattened per item; for sequence
            outputs, the class at `position`).
        relevance_at: the relevance of the tensors asked for with `relevance_at=`, by name.
        explained_output: the name of the explained output.
        position: for sequence outputs (rank >= 3, e.g. a causal LM's logits N x T x V), the explained position
            per item; None otherwise.
        explained_value: the explained tensor at the target per item: the logit (before a softmax).
        ledger: with `Explainer(ledger=True)`, the relevance entering and leaving every node
            (`{"entering": [K], "leaving": [K]}`, summed over the batch); None otherwise.
        forward: the explained forward's outputs (the same dict as `outputs` for a float model).
        deployed_gap: how far the deployed outputs are from the explained forward on the explained output
            (quantized and float16 models); None without a deployed run.
        batched: False when one item was given without its batch axis.
        inputs: the model's inputs as fed, by name, with the batch axis (what `heatmap()` draws).
        class_names: the classifier's class names (the Explainer's `labels`), indexed by class; None when the
            model names no classes. `heatmap()` captions and `arrays()` name the classes with them.
        notes: lines on what the arrays alone do not say: with a decoder's past given, the part of the relevance
            the past holds.

    `heatmap()` draws it (a PIL image; a notebook shows the Explanation as that picture).
    """

    relevance: object
    outputs: dict
    target: np.ndarray
    relevance_at: dict = field(default_factory=dict)
    explained_output: str = ""
    position: object = None
    explained_value: object = None  # the explained tensor at the target per item: the logit (before a softmax)
    ledger: dict | None = None  # with Explainer(ledger=True): {"entering": [K], "leaving": [K]}, summed over the batch
    forward: dict | None = None  # the explained forward's outputs (is ``outputs`` when there is no deployed run)
    deployed_gap: object = None  # onnx_lrp.run.deployed_gap.Gap of the explained output, or None
    batched: bool = True  # False: one item given without its batch axis; no per-item field has one then
    inputs: dict | None = None  # the model's inputs as fed, by name, with the batch axis (what heatmap() draws)
    class_names: list | None = None  # the class names (the Explainer's labels), indexed by class; None: unnamed
    notes: list = field(default_factory=list)  # what the arrays do not say (a given past's part of the relevance)

    def __repr__(self) -> str:
        shown = ["relevance", "target", "position", "explained_output", "explained_value", "outputs"]
        if self.forward is not None and self.forward is not self.outputs:
            shown.append("forward")
        shown += ["relevance_at", "ledger", "deployed_gap"]
        text = brief_repr(self, shown)
        return text if self.batched else text[:-1] + ", batched=False)"

    # ------------------------------------------------------------------------------------------ many runs, one file
    @classmethod
    def concat(cls, parts: list, first_items: list | None = None) -> "Explanation":
        """The explanations of consecutive chunks of one batch (each with its batch axis) as one, concatenated along
        the batch axis in order. ``first_items``: each part's first item counted over the whole run (default: the
        items before it), where ``deployed_gap`` (the worst of the parts') names its item."""
        from .deployed_gap import worst

        first = parts[0]
        if first_items is None:
            first_items = np.cumsum([0] + [len(np.asarray(p.target).reshape(-1)) for p in parts[:-1]]).tolist()
        rel = [p.relevance for p in parts]
        relevance = {k: _cat(r[k] for r in rel) for k in rel[0]} if isinstance(first.relevance, dict) else _cat(rel)
        outputs = {k: _cat(p.outputs[k] for p in parts) for k in first.outputs}
        forward = outputs
        if any(p.forward is not None and p.forward is not p.outputs for p in parts):
            forward = {k: _cat(p.outputs[k] if p.forward is None else p.forward[k] for p in parts)
                       for k in first.outputs}

        def flat(name, dtype=None):
            if getattr(first, name) is None:
                return None
            out = _cat(np.asarray(getattr(p, name)).reshape(-1) for p in parts)
            return out if dtype is None else out.astype(dtype)
        ledgers = [p.ledger for p in parts]
        ledger = None if any(b is None for b in ledgers) else {k: sum(b[k] for b in ledgers) for k in ledgers[0]}
        inputs = None  # the feeds as fed (numpy on the host): what heatmap() draws
        if all(p.inputs is not None and all(isinstance(v, np.ndarray) for v in p.inputs.values()) for p in parts):
            inputs = {k: _cat(p.inputs[k] for p in parts) if first.inputs[k].ndim else v
                      for k, v in first.inputs.items()}
        return cls(relevance=relevance, outputs=outputs, forward=forward,
                   target=_cat(np.asarray(p.target, np.int64) for p in parts),
                   relevance_at={k: _cat(p.relevance_at[k] for p in parts) for k in first.relevance_at},
                   explained_output=first.explained_output, position=flat("position", np.int64),
                   explained_value=flat("explained_value"), ledger=ledger, inputs=inputs, class_names=first.class_names,
                   notes=[n for p in parts for n in p.notes],
                   deployed_gap=worst([p.deployed_gap.shifted(i) for p, i in zip(parts, first_items)
                                       if p.deployed_gap is not None]))

    def arrays(self, items=None) -> dict:
        """What ``onnx-lrp explain -o OUT.npz`` writes, by name: ``relevance`` (``relevance/<input>`` for several
        inputs), ``outputs`` (the explained output), ``targets``, ``positions`` (sequence outputs), ``outputs/<name>``
        (every output, when the model has several), ``relevance_at/<tensor>``, ``items`` (the items' names, when
        given), and, when the classes have names (``class_names``), ``target_labels`` and ``predicted_labels``
        (fixed-width unicode arrays, one name per item: ``np.load`` reads them without pickle)."""
        out = {}
        if isinstance(self.relevance, dict):
            out.update({f"relevance/{k}": v for k, v in self.relevance.items()})
        else:
            out["relevance"] = self.relevance
        out["outputs"] = self.outputs[self.explained_output]
        out["targets"] = self.target
        if self.position is not None:
            out["positions"] = self.position
        if len(self.outputs) > 1:
            out.update({f"outputs/{k}": v for k, v in self.outputs.items()})
        out.update({f"relevance_at/{k}": v for k, v in self.relevance_at.items()})
        if items is not None:
            out["items"] = np.array(items, dtype=str)
        if self.class_names:
            out["target_labels"], out["predicted_labels"] = self.named_classes()
        return out

    def predicted(self) -> np.ndarray | None:
        """The predicted class per item (the arg-max of the explained output, at `position` for sequence outputs),
        or None without the explained output."""
        y = (self.outputs or {}).get(self.explained_output)
        if y is None or not viewable(y):
            return None
        y = np.asarray(y)
        y = y if self.batched else y[None]
        n = len(np.asarray(self.target).reshape(-1))
        if y.ndim < 1 or len(y) != n:
            return None
        pos = None if self.position is None else np.asarray(self.position).reshape(-1)
        rows = [y[i][int(pos[i])] if pos is not None and y[i].ndim >= 2 else y[i] for i in range(n)]
        return np.array([int(np.argmax(r)) for r in rows], np.int64)

    def named_classes(self) -> tuple[np.ndarray, np.ndarray]:
        """(target names, predicted names) per item as fixed-width unicode arrays ("" for a class without a name)."""
        from ..io.labels import label_of

        target = np.asarray(self.target).reshape(-1)
        pred = self.predicted()
        pred = np.full(len(target), -1) if pred is None else pred
        names = [label_of(t, self.class_names) or "" for t in target], \
            [label_of(p, self.class_names) or "" for p in pred]
        return np.array(names[0], dtype=str).astype("U"), np.array(names[1], dtype=str).astype("U")

    # ------------------------------------------------------------------------------------------ the batch axis
    def without_batch_axis(self, whole: bool = False) -> "Explanation":
        """The same result for one item given without its batch axis (see the class): per-item fields lose it.
        ``whole``: the explained output has no batch axis (the batch is one item): the model's tensors keep theirs."""
        def item(a):
            return a if a is None else np.asarray(a).reshape(-1)[0]

        def lead(tensors):
            if whole or tensors is None:
                return tensors
            return {k: (v[0] if viewable(v) and np.ndim(v) and np.shape(v)[0] == 1 else v) for k, v in tensors.items()}

        rel = self.relevance
        def first(a):
            return a[0] if viewable(a) else a

        rel = {k: first(v) for k, v in rel.items()} if isinstance(rel, dict) else first(rel)
        outputs = lead(self.outputs)
        forward = outputs if self.forward is self.outputs else lead(self.forward)
        return dataclasses.replace(self, relevance=rel, outputs=outputs, forward=forward, target=item(self.target),
                                   position=item(self.position), explained_value=item(self.explained_value),
                                   relevance_at=lead(self.relevance_at), batched=False)

    # ------------------------------------------------------------------------------------------ pictures
    def heatmap(self, path=None, *, input: str | None = None, style: str = "beside", cmap: str = "bwr",
                channel_axis: int | None = None, labels: bool = True, cols: int | None = None,
                scale: int | None = None, format: str | None = None):
        """The picture ``onnx-lrp explain --heatmap`` draws, as a PIL image; with ``path``, also written there (the
        format from the suffix, or ``format``).

        One tile per item: the relevance of ``input`` (default: the first relevance input) summed over its channels
        (``channel_axis``: None takes 1 unless the shape looks channels-last), symmetric around zero, each tile
        scaled to its own largest |relevance|; ``style`` ``beside`` draws the input beside it where it is a picture
        (1 or 3 channels), ``overlay`` the heatmap over it, ``heatmap`` the heatmap alone. ``labels``: captions
        under each tile (item, predicted class, target, the explained value and the relevance's sum), and a colour
        bar. `onnx_lrp.plot.heatmap` draws arrays the same way.
        """
        from ..io import heatmap as hm

        name, rel = self._drawn(input)
        x = (self.inputs or {}).get(name)
        if x is not None and (np.shape(x) != rel.shape or np.asarray(x).dtype.kind != "f"
                              or hm.display_images(x, _axis(rel, channel_axis)) is None):
            x = None  # token ids, or not a picture: the heatmap alone
        look = hm.Look(channel_axis=channel_axis, cmap=cmap, style=style, cols=cols, scale=scale,
                       labels=self._labels(rel) if labels else None,
                       colorbar="colours scaled per tile to its largest |relevance|" if labels else None)
        image = hm.picture(rel, x, look)
        if path is not None:
            hm.save_picture(image, path, format)
        return image

    def _repr_png_(self) -> bytes | None:
        """The heatmap as PNG bytes for notebooks (None, and the text ``repr`` shows, when it cannot be drawn or
        holds more than NOTEBOOK_ITEMS items: call ``heatmap()`` for those)."""
        from ..core.errors import LrpError

        try:
            name, rel = self._drawn(None)
            if len(rel) > NOTEBOOK_ITEMS:
                return None
            buf = io.BytesIO()
            self.heatmap(input=name).save(buf, format="PNG")
            return buf.getvalue()
        except LrpError:
            return None

    def _drawn(self, input: str | None) -> tuple[str | None, np.ndarray]:
        """(input name, relevance with its batch axis) of the input to draw."""
        from ..core.errors import InputError

        rel = self.relevance
        name = None
        if isinstance(rel, dict):
            name = input if input is not None else next(iter(rel), None)
            if name not in rel:
                raise InputError(f"no relevance of input {name!r}; inputs with relevance: {', '.join(rel)}")
            rel = rel[name]
        rel = np.asarray(rel)
        rel = rel if self.batched else rel[None]
        if not isinstance(self.relevance, dict) and self.inputs:  # the float input of the relevance's shape
            name = next((k for k, v in self.inputs.items() if np.shape(v) == rel.shape
                         and np.asarray(v).dtype.kind == "f"), None)
            if input is not None and input != name:
                raise InputError(f"no relevance of input {input!r}; the relevance is of {name!r}")
        return name, rel

    def _labels(self, rel: np.ndarray) -> list[list[str]]:
        """Caption lines per item: the item, the predicted class, the target (and position), the explained value
        and the sum of the drawn relevance; with class names, a fourth line: the target's name (and the
        prediction's, when it differs), as the CLI's captions."""
        n = len(rel)
        target = np.asarray(self.target).reshape(-1)
        pos = None if self.position is None else np.asarray(self.position).reshape(-1)
        value = None if self.explained_value is None else np.asarray(self.explained_value).reshape(-1)
        y = self.outputs.get(self.explained_output) if self.outputs else None
        lines = []
        for i in range(n):
            pred = ""
            if y is not None:
                yi = np.asarray(y)[i] if self.batched and np.ndim(y) and np.shape(y)[0] == n else np.asarray(y)
                yi = yi[int(pos[i])] if pos is not None and yi.ndim >= 2 else yi
                pred = f"pred {int(np.argmax(yi))}  "
            at = f" @{int(pos[i])}" if pos is not None else ""
            first, second = f"item {i}", f"{pred}target {int(target[i % len(target)])}{at}"
            third = (f"logit {float(value[i % len(value)]):.4g}  " if value is not None else "") + \
                f"sum R {float(np.sum(rel[i], dtype=np.float64)):.4g}"
            lines.append([first, second, third])
        if self.class_names:
            targets, preds = self.named_classes()
            for i, line in enumerate(lines):
                t, p = str(targets[i % len(targets)]), str(preds[i % len(preds)])
                line.append((t or f"class {int(target[i % len(target)])}") + (f" (pred {p})" if p and p != t else ""))
        return lines


def _cat(parts) -> np.ndarray:
    return np.concatenate(list(parts))


def _axis(rel: np.ndarray, channel_axis: int | None) -> int:
    from ..io.inputs import channels_last

    return channel_axis if channel_axis is not None else (-1 if channels_last(rel.shape) else 1)


def viewable(a) -> bool:
    """Whether an array returned can be indexed to a view of its first item: numpy, torch and cupy arrays; not an
    onnxruntime ``OrtValue`` (which keeps its batch axis of one)."""
    return hasattr(a, "__getitem__")


def given_without_batch_axis(x, specs) -> bool:
    """Whether ``x`` (an array, or a dict by input name) is one item without its batch axis: every input the model
    gives a batch axis is one axis short of the model's rank (inputs without dims, e.g. scalars, do not count)."""
    given = x if isinstance(x, dict) else ({specs[0].name: x} if len(specs) == 1 else {})
    ranks = [(np.ndim(given[s.name]), len(s.dims)) for s in specs if s.dims and s.name in given]
    return bool(ranks) and all(got == want - 1 for got, want in ranks)


__all__ = ["Explanation", "given_without_batch_axis"]
