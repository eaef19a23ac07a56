"""A generation explained: greedy decoding through the deployed model, then every generated token explained over
everything before it.

* :class:`Decoder`: greedy decoding of the model file as deployed, in plain onnxruntime, with its KV cache where the
  model has one (``past_key_values.*`` / ``past.*`` inputs fed back from its ``present.*`` outputs, empty at the
  first step; the genai folder's ``genai_config.json`` gives the names and cache sizes), else one full forward per
  step. Greedy: the arg-max logit at the last position, the first on a tie (onnxruntime-genai's ``do_sample=False``).
  Where the deployed file cannot run a cached step, or cannot run here at all (bfloat16 on a CPU), it decodes
  otherwise and says how (``Decoder.note``, ``GenerationExplanation.decoded``).
* :func:`explain_generation`: the prompt and the N generated tokens as one causal sequence (prompt + generated[:-1],
  P + N - 1 tokens) explained in one batch of N rows (2 N with a contrast): row k explains the logit at position
  P + k - 1 of generated[k]. A causal model's logit there reads no later token, so row k equals explaining step k
  alone on its own P + k tokens (tests/io/test_generation.py checks it); the entries after each row's position are
  set to 0. ``contrast``: each row explains logit(generated[k]) - logit(foil), inseq's contrastive step (relevance
  is linear in the start relevance: the foil's rows are subtracted).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..core.errors import InputError, LrpError, ModelError
from ..core.files import atomic_write
from ..io import genai, tokens as tk
from ..io.text import token_target
from ..io.text_inputs import Encoded, encode, load_tokenizer, model_feeds, vocab_size
from . import deployed_gap, runtime

PAST = re.compile(r"^(past_key_values|past_key_value|past)[._]")
LAYER_KIND = re.compile(r"(\d+)\D*?(key|value)?$")


@dataclass(frozen=True)
class GenerationRequest:
    """What to generate and explain: the ``prompt``, ``n`` new tokens at most (fewer when an end-of-sequence token
    comes: it ends the generation and is explained as its last token), a ``contrast`` token (a foil: id or one
    token's text), the ``start`` relevance ("logit" or "one-hot"), the end-of-sequence ids (``eos``; None: the genai
    folder's, else the ``eos_token_id`` of the generation_config.json / config.json beside the model, else none)."""
    prompt: str
    n: int
    contrast: object = None
    start: str | None = None
    eos: tuple | None = None


class Decoder:
    """Greedy decoding of ``model`` (an .onnx file, or an onnxruntime-genai folder) as deployed, in plain
    onnxruntime (``threads``: its intra-op threads).

    Where the deployed file cannot do that, :meth:`greedy` decodes otherwise and says how in :attr:`note`:

    * a cached step that fails in onnxruntime's buffer planner (onnxruntime-genai's CPU float16 folders declare the
      repeated keys / values with the new tokens' length: from the second step the planner reuses a buffer of the
      wrong size) runs again with onnxruntime's memory reuse off: the same kernels, the same ids;
    * a cached step that fails otherwise: from there without the cache, each step the whole sequence as a prompt
      (the past empty): the ids of the deployed model's prompt runs;
    * a deployed file onnxruntime cannot run at all on this CPU (a kernel missing for bfloat16, ...): the float32
      upcast (the explained forward, ``upcast``) decodes, and the ids are the upcast's.
    """

    def __init__(self, model, threads: int | None = None):
        path = Path(str(model))
        self.folder = genai.read_folder(path, tokenizer=False) if genai.is_genai_folder(path) else \
            genai.config_beside(path)
        self.path = self.folder.model if self.folder is not None else path
        if not self.path.is_file():
            raise InputError(f"{self.path} is not a model file; give the .onnx file (or its onnxruntime-genai folder)")
        self.threads = threads
        self.eos = self.folder.eos if self.folder is not None else genai.eos_beside(self.path)
        self.note = None  # how decoding departed from the deployed model's cached run (one line), or None
        self.cannot_run = None  # why onnxruntime cannot run the deployed file here (one line), or None
        try:
            self.session = runtime.Session(str(self.path), deployed=True, threads=threads)
        except ModelError as exc:
            self.session, self.past, self.cannot_run = None, [], deployed_gap.cannot_run(str(exc), str(self.path))
            return
        self._interface()

    def _interface(self) -> None:
        """The names of the ids, mask, positions, past and present tensors, and the empty past, from the session."""
        args = {i.name: i for i in self.session.inputs()}
        self.types = self.session.input_types
        names = self.folder.inputs if self.folder is not None else {}
        self.ids = names.get("input_ids") or next((n for n in ("input_ids", "ids", "tokens") if n in args), None)
        self.mask = names.get("attention_mask", "attention_mask")
        self.positions = names.get("position_ids", "position_ids")
        self.past = [n for n in args if PAST.match(n)]
        unknown = [n for n in args if n not in (self.ids, self.mask, self.positions) and n not in self.past]
        if self.ids is None or unknown:
            raise InputError(f"{self.path.name}: generation feeds input_ids, attention_mask, position_ids and the "
                             f"past key/value state; the model also takes {', '.join(map(repr, unknown)) or 'no ids'}")
        self.logits = (self.folder.outputs.get("logits") if self.folder else None) or self.session.output_names[0]
        self.present = _present_names(self.past, [o for o in self.session.output_names if o != self.logits])
        self.empty = {n: self._empty(args[n]) for n in self.past}

    def _empty(self, arg) -> np.ndarray:
        """The past state of one input at length 0: batch 1, the sequence axis (-2) 0, the other sizes declared or
        from genai_config.json (num_key_value_heads, head_size)."""
        dims = list(arg.shape)
        if len(dims) != 4:
            raise InputError(f"{self.path.name}: past input {arg.name!r} has {len(dims)} axes; generation knows the "
                             "batch x heads x sequence x head-size layout of the KV cache")
        known = {1: self.folder.kv_heads if self.folder else None, 3: self.folder.head_size if self.folder else None}
        shape = [1, dims[1], 0, dims[3]]
        for axis in (1, 3):
            if not isinstance(shape[axis], int):
                shape[axis] = known[axis]
            if shape[axis] is None:
                raise InputError(f"{self.path.name}: the size of axis {axis} of {arg.name!r} is not declared "
                                 f"({dims[axis]!r}); use the model's onnxruntime-genai folder (its genai_config.json "
                                 "says it) or an export with fixed head sizes")
        return np.zeros(shape, self.types.get(arg.name) or np.float32)

    def greedy(self, ids: list, n: int, eos=(), upcast=None) -> list:
        """Up to ``n`` new token ids after ``ids`` (stops after an id in ``eos``). ``upcast``: the float32 upcast's
        logits at the last position of a sequence (a function of the ids), for a deployed file that cannot run
        here (:attr:`note` says so)."""
        if self.session is None:
            if upcast is None:
                raise ModelError(f"{self.cannot_run.split(';')[0]}; generation needs a model it can run")
            self.note = f"{self.cannot_run.split(';')[0]}; the generated ids are its float32 upcast's (the " \
                        "explained forward, each step the whole sequence)"
        total, out = list(ids), []
        self._new, self._past = list(ids), dict(self.empty) if self.session is not None else {}
        mode = "upcast" if self.session is None else "cached" if self.past else "full"
        for step in range(n):
            t, mode = self._next(total, step, mode, upcast)
            out.append(t)
            if t in eos:
                break
            total.append(t)
        return out

    def _next(self, total: list, step: int, mode: str, upcast) -> tuple:
        """(the next id, the mode of the next step): one step of ``mode`` ("cached", "full", "upcast")."""
        if mode == "upcast":
            return int(np.argmax(np.asarray(upcast(total)))), mode
        if mode == "full":
            res = self._run(self._feeds(total, len(total), dict(self.empty)), step, [self.logits])
            return _last_argmax(res[self.logits]), mode
        feeds = self._feeds(self._new, len(total), self._past)
        try:
            res = self._run(feeds, step, [self.logits] + [self.present[p] for p in self.past])
        except LrpError as exc:
            if step == 0 and upcast is None:
                raise
            if step == 0:  # the deployed file fails on the prompt itself
                self.note = f"{str(exc)[:300]}; the generated ids are its float32 upcast's (the explained forward)"
                return self._next(total, step, "upcast", upcast)
            res = self._recover(feeds, step, exc)
            if res is None:
                return self._next(total, step, "full", upcast)
        self._past = {p: res[self.present[p]] for p in self.past}
        t = _last_argmax(res[self.logits])
        self._new = [t]
        return t, mode

    def _recover(self, feeds: dict, step: int, exc: LrpError) -> "dict | None":
        """A cached step that failed: again with onnxruntime's memory reuse off (the session kept for the next
        steps), else None (decode without the cache from here); :attr:`note` says which."""
        outputs = [self.logits] + [self.present[p] for p in self.past]
        try:
            session = runtime.Session(str(self.path), deployed=True, threads=self.threads,
                                      config={runtime.NO_MEMORY_REUSE: "1"})
            res = session.run(feeds, outputs)
        except LrpError:
            why = str(exc).split(": ", 1)[-1][:200]
            self.note = (f"the deployed model fails on its cached step {step + 1} ({why}); decoded without the cache "
                         "from there: each step the whole sequence as a prompt (the past empty)")
            return None
        self.session = session
        self.note = (f"onnxruntime's buffer planner fails on the deployed model's cached step {step + 1} (the shapes "
                     "its graph declares do not hold there); decoded with onnxruntime's memory reuse off: the same "
                     "kernels, through the KV cache")
        return res

    def _run(self, feeds: dict, step: int, outputs: list) -> dict:
        try:
            return self.session.run(feeds, outputs)
        except LrpError as exc:
            raise type(exc)(f"generation step {step + 1} of {self.path.name}: {exc}") from None

    def prompt_feeds(self, ids: list) -> dict:
        """The first step's inputs: the prompt, its mask and positions, the past at length 0."""
        return self._feeds(list(ids), len(ids), dict(self.empty))

    def _feeds(self, new: list, total: int, past: dict) -> dict:
        feeds = {self.ids: np.asarray([new], self.types.get(self.ids) or np.int64)}
        names = set(self.session.input_names)
        if self.mask in names:
            feeds[self.mask] = np.ones((1, total), self.types.get(self.mask) or np.int64)
        if self.positions in names:
            feeds[self.positions] = np.arange(total - len(new), total, dtype=self.types.get(self.positions)
                                              or np.int64)[None]
        feeds.update(past)
        return feeds


def _last_argmax(logits) -> int:
    """The greedy id: the arg-max at the last position (the first on a tie)."""
    return int(np.argmax(np.asarray(logits)[0, -1]))


def _present_names(past: list, outputs: list) -> dict:
    """Each past input's present output: the same layer number and key / value, else in the same order."""
    def key(name):
        m = LAYER_KIND.search(name.replace("present", ""))
        return (int(m.group(1)), m.group(2)) if m else None

    by_key = {key(o): o for o in outputs if key(o) is not None}
    found = {p: by_key.get(key(p)) for p in past}
    if all(found.values()) and len(set(found.values())) == len(past):
        return found
    if len(outputs) != len(past):
        raise InputError(f"the model has {len(past)} past inputs and {len(outputs)} other outputs; generation cannot "
                         "pair each past input with its present output")
    return dict(zip(past, outputs))


@dataclass
class GenerationExplanation:
    """``generated`` (N ids), ``tokens`` (the prompt's and the generated tokens as they read: P + N),
    ``relevance`` (N x (P + N - 1): row k, the relevance of each token before generated[k] for its logit; zeros
    after its position), ``logits`` (each explained logit, or logit difference with a contrast), ``predicted``
    (the explained forward's arg-max at each step: the generated token unless the deployed arithmetic differs,
    e.g. int4 kernels), ``contrast`` (the foil's id or None), ``n_prompt`` (P), ``decoded`` (how the ids were decoded
    where not by the deployed file through its KV cache, one line; None otherwise)."""
    prompt: str
    prompt_ids: list
    generated: list
    tokens: list
    relevance: np.ndarray
    logits: list
    predicted: list
    n_prompt: int
    contrast: int | None = None
    contrast_token: str | None = None
    decoded: str | None = None  # how the ids were decoded where not by the deployed model's cached run, or None

    @property
    def continuation(self) -> str:
        return "".join(self.tokens[self.n_prompt:])

    def top(self, k: int = 3) -> list:
        """Per generated token, its ``k`` most relevant earlier tokens as (index, token, relevance)."""
        out = []
        for row in self.relevance:
            order = np.argsort(-row, kind="stable")[:k]
            out.append([(int(i), self.tokens[i], float(row[i])) for i in order])
        return out

    def arrays(self) -> dict:
        """What ``-o`` writes (.npz): relevance, generated, prompt_ids, tokens, logits, predicted (and contrast)."""
        a = dict(relevance=self.relevance.astype(np.float32), generated=np.asarray(self.generated, np.int64),
                 prompt_ids=np.asarray(self.prompt_ids, np.int64), tokens=np.asarray(self.tokens),
                 logits=np.asarray(self.logits, np.float64), predicted=np.asarray(self.predicted, np.int64))
        if self.contrast is not None:
            a["contrast"] = np.int64(self.contrast)
        return a

    def lines(self, k: int = 3) -> list:
        """The continuation, then one line per step: the token, its logit and its top-``k`` earlier tokens."""
        foil = f" vs {self.contrast_token!r}" if self.contrast is not None else ""
        head = [f"{self.prompt!r} -> {self.continuation!r} ({len(self.generated)} token(s), greedy)"]
        head += [f"  decoded: {self.decoded}"] if self.decoded else []
        for i, (top, value) in enumerate(zip(self.top(k), self.logits)):
            tok = self.tokens[self.n_prompt + i]
            said = ", ".join(f"{t.strip() or t!r} {r:+.3g}" for _, t, r in top)
            note = "" if self.predicted[i] == self.generated[i] else \
                f" (the explained forward predicts {self.predicted[i]})"
            head.append(f"  step {i + 1}: {tok!r}{foil} logit{' diff' if foil else ''} {value:.4g}{note}; top: {said}")
        return head

    def html(self, path=None, percentile: float = 100.0):
        """A page: the prompt and the continuation, then one row per generated token: the relevance of the tokens
        before it (the token itself outlined; later tokens white). Written to ``path`` if given, else returned."""
        import html as h

        foil = f" vs {self.contrast_token!r}" if self.contrast is not None else ""
        title = f"{self.prompt} -> {self.continuation}"
        rows = []
        for k, value in enumerate(self.logits):
            r = np.append(self.relevance[k], 0.0)  # the last generated token: never read by an explained logit
            label = (f"step {k + 1}: {self.tokens[self.n_prompt + k]!r}{foil} (logit{' diff' if foil else ''} "
                     f"{value:.4g}; max |relevance| {np.abs(r).max():.3g})")
            spans = tk.token_spans(self.tokens, r, percentile, (self.n_prompt + k,), "")
            rows.append(f"<h4>{h.escape(label)}</h4>\n<p>{spans}</p>\n")
        page = ("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>" + h.escape(title) + "</title>\n<style>"
                "body{font-family:sans-serif}" + tk.STYLE + "</style></head>\n<body><h3>" + h.escape(title) + "</h3>\n"
                f"<p>{h.escape(self.prompt)}<b>{h.escape(self.continuation)}</b></p>\n" + "<hr>\n".join(rows)
                + "<p>each row on its own scale; red positive, blue negative</p>\n</body></html>\n")
        if path is None:
            return page
        atomic_write(path, page.encode("utf-8"))
        return None


def explain_generation(ex, tokenizer, request: GenerationRequest, decoder: Decoder) -> GenerationExplanation:
    """Decode greedily with ``decoder``, then explain every generated token with ``ex`` in one batched run (see the
    module docstring). ``tokenizer``: a tokenizer.json path (or folder) or a loaded tokenizer."""
    tok = load_tokenizer(tokenizer)
    n = _count(request.n)
    enc = encode(tok, request.prompt)
    prompt = list(enc.ids)
    check_context(decoder.folder, len(prompt), n)
    eos = request.eos if request.eos is not None else decoder.eos
    generated = decoder.greedy(prompt, n, tuple(eos), upcast=_upcast_logits(ex))
    foil = None if request.contrast is None else token_target(request.contrast, tok, vocab_size(tok))
    if request.contrast is not None and foil is None:
        raise InputError(f"contrast {request.contrast!r}: give the foil token (an id or one token's text)")
    seq = prompt + generated[:-1]
    rows, values, predicted = _relevance_rows(ex, seq, len(prompt), generated, foil, request.start)
    shown = list(enc.shown) + [tok.decode([t], skip_special_tokens=False) for t in generated]
    return GenerationExplanation(
        prompt=request.prompt, prompt_ids=prompt, generated=generated, tokens=shown, relevance=rows, logits=values,
        predicted=predicted, n_prompt=len(prompt), contrast=foil, decoded=decoder.note,
        contrast_token=None if foil is None else tok.decode([foil], skip_special_tokens=False))


def _upcast_logits(ex):
    """The explained forward's (the float32 upcast's) logits at the last position of a sequence of ids: the
    decoder of a deployed file that cannot run here (one relevance run per step)."""
    def logits(seq: list) -> np.ndarray:
        feeds, _ = sequence_feeds(ex, seq, 1)
        res = ex.explain(feeds, position=np.asarray([len(seq) - 1], np.int64))
        return np.asarray(res.forward[ex.explained_output])[0, len(seq) - 1]
    return logits


def check_context(folder, n_prompt: int, n: int) -> None:
    """Refuse (one line) a prompt of ``n_prompt`` tokens and ``n`` new ones beyond a genai folder's context_length."""
    if folder is not None:
        what = f"the prompt ({n_prompt} tokens)" + (f" and {n} new token(s)" if n_prompt <= (folder.context_length
                                                                                          or n_prompt) else "")
        folder.check_length(n_prompt + (n if n_prompt <= (folder.context_length or n_prompt) else 0), what)


def _count(n) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise InputError(f"the number of tokens to generate must be an integer >= 1, not {n!r}")
    return int(n)


def sequence_feeds(ex, seq: list, batch: int) -> tuple[dict, str]:
    """The explainer's inputs for ``seq`` repeated ``batch`` times, and the input whose relevance is the tokens'."""
    enc = Encoded(ids=list(seq), attention_mask=[1] * len(seq), type_ids=[0] * len(seq), special=[False] * len(seq),
                  shown=[""] * len(seq), n_prompt=len(seq))
    feeds, rel_name = model_feeds(ex.inputs, enc, len(seq))
    return {k: np.repeat(v, batch, axis=0) for k, v in feeds.items()}, rel_name


def _relevance_rows(ex, seq: list, p: int, generated: list, foil, start) -> tuple:
    """(N x len(seq) relevance, the explained logits (or differences), the explained forward's arg-max per step):
    one batched run of N rows (2 N with a foil)."""
    n, t = len(generated), len(seq)
    positions = [p - 1 + k for k in range(n)]
    targets = list(generated) + ([foil] * n if foil is not None else [])
    feeds, rel_name = sequence_feeds(ex, seq, len(targets))
    res = ex.explain(feeds, target=np.asarray(targets, np.int64), start=start,
                     position=np.asarray(positions * (2 if foil is not None else 1), np.int64))
    rel = res.relevance[rel_name] if isinstance(res.relevance, dict) else res.relevance
    rel = np.asarray(rel, np.float64)
    per = np.stack([tk.per_token(rel[i], t) for i in range(len(targets))])
    logits = np.asarray(res.outputs[ex.explained_output])
    at = logits[np.arange(n), positions]  # N x V: the logits at each row's position
    values = at[np.arange(n), generated].astype(np.float64)
    if foil is not None:
        per = per[:n] - per[n:]
        values = values - at[:, foil]
    for k, pos in enumerate(positions):
        per[k, pos + 1:] = 0.0
    return per, [float(v) for v in values], [int(i) for i in at.argmax(-1)]


__all__ = ["Decoder", "GenerationExplanation", "GenerationRequest", "check_context", "explain_generation",
           "sequence_feeds"]
