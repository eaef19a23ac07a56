"""A decoder's past key/value state given with the inputs (``past_key_values.*`` in the dict of arrays or the .npz
INPUT): the feeds of the relevance model that keeps its past inputs (``BuildOptions(past_inputs=True)``) completed as
onnxruntime-genai fills them, checked in one line each, and the part of the relevance the past holds.

For P past positions and S new tokens: ``attention_mask`` (B, P + S) of ones, ``position_ids`` (B, S) P..P+S-1,
``seqlens_k`` (B,) P + S - 1 and ``total_sequence_length`` () P + S when the model takes them and they are not
given; given, they must fit those lengths. Every past input of the model must be given, all at one length. A max-length
past buffer (onnxruntime-genai's shared past/present buffer) with a mask of T <= P positions is read as its first
T - S positions, as GroupQueryAttention reads it.
"""
from __future__ import annotations

import re
import zipfile
from pathlib import Path

import numpy as np

from ..core.errors import InputError
from ..load.passes.past_state import PAST

_LAYER = re.compile(r"\d+")


def past_names(arrays) -> list:
    """The names among ``arrays`` (a dict or names) that are a decoder's past key/value state."""
    return [n for n in arrays if isinstance(n, str) and PAST.match(n)]


def fillable(name: str) -> bool:
    """Whether a missing input of this name is filled from the lengths (attention mask, positions, seqlens)."""
    return name in ("attention_mask", "position_ids", "seqlens_k", "total_sequence_length")


def npz_names(path) -> list:
    """The names of the arrays in an .npz INPUT when they hold a decoder's past (else []): read from the archive's
    listing, nothing inflated (the reader checks the file itself)."""
    from ..io.kinds import Kind, is_kind

    p = Path(path)
    if not is_kind(p, Kind.NPZ) or not p.is_file():
        return []
    try:
        with np.load(p, allow_pickle=False) as z:  # the archive's listing only
            names = list(z.files)
    except (OSError, ValueError, zipfile.BadZipFile):
        return []
    return names if past_names(names) else []


def given_specs(specs, names: list) -> list:
    """The inputs a file holding ``names`` must give: all of ``specs`` but the lengths' inputs it leaves to be
    filled (all of them when ``names`` is empty: no past); a past for some layers only is refused."""
    _whole_past([s.name for s in specs], names)
    return list(specs) if not names else [s for s in specs if s.name in names or not fillable(s.name)]


def complete(specs, arrays: dict) -> tuple[dict, int]:
    """(the feeds with the lengths' inputs filled, P) for the inputs ``specs`` (InputSpec, the model's with its
    past inputs) and the given ``arrays``; refused in one line when a past is partial or the lengths disagree."""
    arrays = dict(arrays)
    wanted = _whole_past([s.name for s in specs], list(arrays))
    lengths = {n: np.shape(arrays[n])[-2] if np.ndim(arrays[n]) == 4 else None for n in wanted}
    bad = [n for n, p in lengths.items() if p is None]
    if bad:
        raise InputError(f"past {bad[0]!r} has shape {list(np.shape(arrays[bad[0]]))}; a past is (batch, kv heads, "
                         "past length, head size)")
    if len(set(lengths.values())) > 1:
        first, other = wanted[0], next(n for n in wanted if lengths[n] != lengths[wanted[0]])
        raise InputError(f"past {other!r} has {lengths[other]} positions and {first!r} {lengths[first]}: give every "
                         "layer's past at one length")
    p = lengths[wanted[0]] if wanted else 0
    ids = next((s.name for s in specs if s.name in arrays and not PAST.match(s.name) and np.ndim(arrays[s.name]) >= 2),
               None)
    if ids is None:
        raise InputError("a past is given but no input of the new tokens (input_ids: batch x new tokens)")
    b, s = np.shape(arrays[ids])[:2]
    p = _buffer(arrays, wanted, p, s)
    names = {spec.name for spec in specs}
    _fill(arrays, names, b, (p, s))
    _check(arrays, names, b, (p, s), ids)
    return arrays, p


def _whole_past(inputs: list, names: list) -> list:
    """The model's past inputs among ``inputs``; refused when ``names`` give some of them only."""
    wanted = past_names(inputs)
    missing = [n for n in wanted if n not in names]
    if missing and past_names(names):
        raise InputError(f"a past is given for {', '.join(past_names(names))} but not for {', '.join(missing)}: give "
                         f"the past of every layer ({len(wanted)} arrays) or none")
    return wanted


def _buffer(arrays: dict, wanted: list, p: int, s: int) -> int:
    """A max-length past buffer (onnxruntime-genai's shared past/present buffer) with an attention mask of T < P + S
    positions, S <= T <= P: its first T - S positions are the past (what GroupQueryAttention reads of it); the
    pasts cut to them. Returns the past's length."""
    mask = arrays.get("attention_mask")
    t = np.shape(mask)[-1] if np.ndim(mask) == 2 else None
    if t is None or t == p + s or not s <= t <= p:
        return p
    for n in wanted:
        arrays[n] = np.asarray(arrays[n])[..., :t - s, :]
    return t - s


def _fill(arrays: dict, names: set, b: int, lengths: tuple) -> None:
    """The lengths' inputs the model takes and the caller did not give, as onnxruntime-genai fills them."""
    p, s = lengths
    mask = arrays.get("attention_mask")
    if "attention_mask" in names and mask is None:
        arrays["attention_mask"] = mask = np.ones((b, p + s), np.int64)
    if "position_ids" in names and "position_ids" not in arrays:
        arrays["position_ids"] = np.broadcast_to(np.arange(p, p + s, dtype=np.int64), (b, s)).copy()
    if "seqlens_k" in names and "seqlens_k" not in arrays:
        total = np.full(b, p + s) if mask is None else np.asarray(mask).sum(1)
        arrays["seqlens_k"] = (total - 1).astype(np.int32)
    if "total_sequence_length" in names and "total_sequence_length" not in arrays:
        arrays["total_sequence_length"] = np.array(p + s, np.int32)


def _check(arrays: dict, names: set, b: int, lengths: tuple, ids: str) -> None:
    """Refuse the lengths' inputs that do not fit P past positions and S new tokens."""
    p, s = lengths
    said = f"a past of {p} positions and {s} new tokens in {ids!r}"
    mask = arrays.get("attention_mask")
    if "attention_mask" in names and np.shape(mask) != (b, p + s):
        raise InputError(f"input 'attention_mask' has shape {list(np.shape(mask))}; with {said} it is ({b}, {p + s}) "
                         f"(or ({b}, T), {s} <= T <= {p}, for a max-length past buffer of which T - {s} are read)")
    pos = arrays.get("position_ids")
    if "position_ids" in names and np.shape(pos)[-1:] != (s,):
        raise InputError(f"input 'position_ids' has shape {list(np.shape(pos))}; with {said} it is ({b}, {s})")
    total = arrays.get("total_sequence_length")
    if "total_sequence_length" in names and int(np.asarray(total).reshape(-1)[0]) != p + s:
        raise InputError(f"input 'total_sequence_length' is {int(np.asarray(total).reshape(-1)[0])}; with {said} it "
                         f"is {p + s}")
    seq = arrays.get("seqlens_k")
    if "seqlens_k" in names and (np.shape(seq) != (b,) or np.any(np.asarray(seq) > p + s - 1) or
                                 np.any(np.asarray(seq) < p)):
        raise InputError(f"input 'seqlens_k' is {np.asarray(seq).tolist()}; with {said} it holds the last valid key "
                         f"per item, {p}..{p + s - 1}")


def past_part(relevance: dict, names) -> np.ndarray:
    """The relevance the past holds per item: the sum over every past input's relevance."""
    parts = [np.asarray(relevance[n], np.float64).reshape(len(np.asarray(relevance[n])), -1).sum(1)
             for n in names if n in relevance]
    return np.sum(parts, axis=0) if parts else np.zeros(0)


def note(relevance: dict, names, p: int) -> str:
    """The past's part in one line: ``the past (P positions) holds X of the relevance``, per item."""
    part = past_part(relevance, names)
    values = ", ".join(f"{v:.6g}" for v in part)
    return (f"the past ({p} positions) holds {values} of the relevance (the new tokens' relevance + the past's part "
            "= the explained value)")


__all__ = ["past_names", "fillable", "npz_names", "given_specs", "complete", "past_part", "note"]
