"""What ``Explainer.explain_text`` (``onnx_lrp.io.text.explain_request``) returns: the tokens, one relevance per
token, what was explained, and the views of it (an HTML token heatmap, shown inline in a notebook, and a terminal
line)."""
from __future__ import annotations

import html
import os
import sys
from dataclasses import dataclass, field

import numpy as np

from ..core.files import atomic_write
from . import tokens as tk

ABSORBED_NOTE = 0.02  # a relevance sum this far from the start relevance (relative) is said to be absorbed


@dataclass(repr=False)
class TextExplanation:
    """The relevance of each token of a text for one explained output.

    ``tokens`` read as in the text (a leading space where the text has one; special tokens as their vocabulary
    entry), ``input_ids`` are the tokenizer's ids and ``relevance`` one value per token (float64: the relevance at
    the token's embedding, summed over the hidden axis). With a continuation every token of it is listed; its last
    token is only explained, never an input, so its relevance is 0. ``task`` is "text-classification",
    "token-classification" or "text-generation"; ``target`` the explained class (or token id; a list of ids for a
    continuation) and ``label`` its name, ``predicted`` / ``predicted_label`` the model's arg-max; ``position`` the
    explained token (token classifiers; language models: the position whose next token is explained); ``logit`` the
    explained logit (summed over a continuation's tokens); ``start`` what the relevance started from ("logit": the
    logit, "one-hot": 1 per explained token). ``predictions``: a token classifier's arg-max class name at every
    token. ``steps``: one record per explained logit; ``explanations``: the `onnx_lrp.Explanation` of each.

    The tokens' relevance does not sum to the logit in general: biases, normalisations (LayerNorm's held scale),
    the softmax of attention and the position and token-type embeddings take their share, which never reaches the
    tokens (often half of it or more). ``sums()`` says both numbers; ``onnx-lrp trace`` splits the rest node by
    node. Relevance far from the start (below 1 % or above 100 x, as for any input) is warned about when it is
    explained (``LrpWarning``; ``strict=True`` refuses it).
    """

    text: str
    tokens: list
    input_ids: list
    relevance: np.ndarray
    task: str
    target: object
    label: str | None
    predicted: int
    predicted_label: str | None
    logit: float
    position: int | None = None
    text_pair: str | None = None
    continuation: str | None = None
    special: list = field(default_factory=list)
    n_prompt: int = 0
    predictions: list | None = None
    steps: list = field(default_factory=list)
    explanations: list = field(default_factory=list)
    start: str = "logit"
    model: str | None = None  # the model's file (absolute), named in the HTML page
    absorbers: tuple = ()  # what in the model can keep relevance from the tokens ("biases", "normalisations", ...)

    # ----------------------------------------------------------------------------------------------- summary
    def headline(self) -> str:
        """One line: what was explained, its logit, and what the model predicts."""
        if self.task == "text-generation" and self.continuation is not None:
            n = len(self.steps)
            how = f"{n} tokens, each explained from the tokens before it" if n > 1 else "1 token"
            return f"continuation {self.continuation!r} ({how}): summed logit {self.logit:.4g}"
        if self.task == "text-generation":
            said = f"next token {self.label!r} (id {self.target}): logit {self.logit:.4g}"
            return said + (", the model's prediction" if self.predicted == self.target else
                           f"; the model predicts {self.predicted_label!r} (id {self.predicted})")
        name = f"class {self.target}" + (f" {self.label!r}" if self.label is not None else "")
        if self.task == "token-classification":
            name += f" at token {self.position} {self.tokens[self.position].strip()!r}"
        pred = f"class {self.predicted}" + (f" {self.predicted_label!r}" if self.predicted_label is not None else "")
        return f"{name}: logit {self.logit:.4g}" + (", the model's prediction" if self.predicted == self.target
                                                   else f"; the model predicts {pred}")

    @property
    def start_relevance(self) -> float:
        """What the relevance started from: the explained logit (summed over a continuation's tokens), or 1 per
        explained token (``start="one-hot"``)."""
        return float(self.logit) if self.start == "logit" else float(max(len(self.steps), 1))

    def sums(self) -> str:
        """One line: the tokens' relevance sum beside the value it started from, and where the rest went."""
        total, begun = float(self.relevance.sum()), self.start_relevance
        what = f"the logit {begun:.4g}" if self.start == "logit" else f"the start relevance {begun:.4g} (one-hot)"
        line = f"relevance sum {total:.4g} of {what}"
        if begun == 0:
            return line
        line += f" ({100 * total / begun:.3g} %)"
        if abs(total - begun) <= ABSORBED_NOTE * abs(begun):
            return line
        held = ", ".join(self.absorbers[:-1]) + " and " + self.absorbers[-1] if len(self.absorbers) > 1 else \
            (self.absorbers[0] if self.absorbers else "the layers between")
        return (line + f"; the rest ({begun - total:+.4g}) is kept from the tokens by the model's {held}: "
                "`onnx-lrp trace MODEL --text TEXT` splits it node by node")

    def top(self, k: int = 3) -> list:
        """The ``k`` tokens of largest relevance: (token, relevance) pairs, largest first."""
        order = np.argsort(-self.relevance, kind="stable")[:k]
        return [(self.tokens[i], float(self.relevance[i])) for i in order]

    def __repr__(self) -> str:
        top = ", ".join(f"{t!r} {v:+.3g}" for t, v in self.top())
        return (f"TextExplanation({self.task}: {self.headline()}; {len(self.tokens)} tokens, relevance sum "
                f"{float(self.relevance.sum()):.4g}; most relevant: {top})")

    def arrays(self) -> dict:
        """What ``onnx-lrp explain --text ... -o OUT.npz`` writes, by name (as ``Explanation.arrays()``
        for other inputs): ``relevance`` (one float32 per token), ``input_ids``, ``tokens``, ``n_prompt`` (the
        prompt's tokens; the rest: the continuation), ``positions`` (-1: a whole-text class) and ``targets``, one
        per explained logit."""
        targets = self.target if isinstance(self.target, list) else [self.target]
        return dict(relevance=np.asarray(self.relevance, np.float32), input_ids=np.asarray(self.input_ids, np.int64),
                    tokens=np.asarray(self.tokens, dtype=str), n_prompt=np.int64(self.n_prompt),
                    positions=np.asarray([-1 if s["position"] is None else s["position"] for s in self.steps],
                                         np.int64),
                    targets=np.asarray(targets, np.int64))

    def to_dict(self) -> dict:
        """The explanation as JSON-ready data (``tokens`` and ``relevance`` as lists, one entry per token too)."""
        return dict(task=self.task, text=self.text, text_pair=self.text_pair, continuation=self.continuation,
                    tokens=list(self.tokens), input_ids=[int(i) for i in self.input_ids],
                    relevance=[float(v) for v in self.relevance],
                    token_relevance=[dict(token=t, id=int(i), relevance=float(v)) for t, i, v in
                                     zip(self.tokens, self.input_ids, self.relevance)],
                    target=self.target, label=self.label, predicted=self.predicted,
                    predicted_label=self.predicted_label, position=self.position, logit=self.logit,
                    predictions=self.predictions, explained=list(self.steps),
                    relevance_sum=float(self.relevance.sum()), start_relevance=self.start_relevance,
                    kept_by=list(self.absorbers))

    # ----------------------------------------------------------------------------------------------- views
    def _marks(self) -> list:
        if self.task == "token-classification" and self.position is not None:
            return [self.position]
        return list(range(self.n_prompt, len(self.tokens))) if self.continuation is not None else []

    def _lines(self) -> list:
        lines = [f"{self.task}: {self.headline()}", self.sums()]
        if self.predictions is not None:
            lines.append("predicted per token: " + " ".join(f"{t.strip() or t}/{p}" for t, p in
                                                            zip(self.tokens, self.predictions)))
        if self.continuation is not None:
            lines.append("the continuation's tokens are outlined: each is explained from the tokens before it (the "
                         "last one only explained, never an input: relevance 0)")
        elif self.task == "token-classification":
            lines.append("the explained token is outlined")
        return lines

    def html(self, path=None, percentile: float = 100.0):
        """The token heatmap as an HTML page (a str); with ``path``, written there (atomically) and the path
        returned. ``percentile``: full colour at this percentile of |relevance| (e.g. 95: one dominant [CLS] does
        not wash out the rest)."""
        page = tk.html_page(self.tokens, self.relevance, f"onnx-lrp: {self.text[:60]}", percentile,
                            marks=self._marks(), sep="", lines=self._lines(), model=self.model)
        if path is None:
            return page
        atomic_write(path, page.encode("utf-8"))
        return path

    def _repr_html_(self) -> str:
        lines = "".join(f"<div>{html.escape(line)}</div>" for line in self._lines())
        return (f"<div><style>{tk.STYLE}</style>{lines}<div>"
                + tk.token_spans(self.tokens, self.relevance, 100.0, self._marks(), "")
                + f"</div><div style=\"font-size:smaller\">{tk.scale_note(self.relevance)}</div></div>")

    def terminal(self, color: bool | None = None, percentile: float = 100.0) -> str:
        """The tokens coloured by relevance with 24-bit ANSI colours (default: when stdout is a terminal and
        NO_COLOR is unset), else as ``token[relevance]``."""
        if color is None:
            color = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
        return tk.terminal(self.tokens, self.relevance, color=color, percentile=percentile, sep="" if color else " ")


__all__ = ["TextExplanation"]
