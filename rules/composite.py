"""Composites: first-match-wins maps from nodes to rules, kept as TOML data files.

A composite file::

    name = "epsilon-plus-flat"
    description = "..."

    [[rules]]
    match = { first_linear = true }        # the linear layers nearest the input
    rule = "flat"

    [[rules]]
    match = { kind = "convolution" }       # or op_type = [...], name = "features.1*" (glob)
    rule = "zplus"

Every key of ``match`` must hold for a node (op types and kinds given as lists match any of them). Entries
without ``match`` match everything. Extra keys of an entry are the rule's parameters.
"""
from __future__ import annotations

import dataclasses
import math
import numbers
import fnmatch
import tomllib
from dataclasses import dataclass
from pathlib import Path

from onnx_lrp.lrp.vocabulary import Kind, NodeInfo
from .base import RULE_ALIASES, RULES, Rule, make_rule
from .elementwise import Pass
from .linear import Epsilon, LinearRule, Norm

BUILTIN_DIR = Path(__file__).resolve().parent / "composites"
BASE_DIR = BUILTIN_DIR / "base"  # shared blocks that composites can `extends`
MATCH_KEYS = {"op_type", "kind", "name", "first_linear"}
AUTO = "auto"  # the default: chosen per network once it is loaded (onnx_lrp/building/auto_composite.py)
AUTO_DESCRIPTION = ("epsilon-plus-flat for networks with ReLU-like activations (or none), attnlrp for any other "
                    "non-linearity (SiLU, GELU, hard-swish, Mish, sigmoid gates, attention)")


@dataclass(frozen=True)
class Entry:
    match: dict
    rule: Rule

    def matches(self, info: NodeInfo) -> bool:
        for key, want in self.match.items():
            if key == "first_linear":
                if bool(want) != info.first_linear:
                    return False
                continue
            have = {"op_type": info.op_type, "kind": info.kind, "name": info.name}[key]
            options = want if isinstance(want, list) else [want]
            if key == "name":
                if not any(fnmatch.fnmatchcase(have, str(o)) for o in options):
                    return False
            elif have not in options:
                return False
        return True


@dataclass(frozen=True)
class Composite:
    """A named, ordered list of (match, rule) entries; the first entry that matches a node wins."""

    name: str
    entries: tuple[Entry, ...]
    description: str = ""
    source: str = ""
    pending: tuple = ()  # "auto" only: the rule parameters to apply to the composite chosen for the network

    def rule_for(self, info: NodeInfo) -> Rule | None:
        for entry in self.entries:
            if entry.matches(info):
                return entry.rule
        return None

    @staticmethod
    def pass_rule() -> Rule:
        """The identity rule the planner gives the nodes that hand relevance on unchanged whatever the composite says
        (an Add whose bias the layer before it absorbed, a node held inside a recognised pattern)."""
        return Pass()

    def with_params(self, **params) -> "Composite":
        """Override rule parameters (``epsilon``, ``gamma``, ``low``, ...) in every rule that has them.

        ``epsilon=0`` is LRP-0: it also sets the ``norm`` rule's stabiliser to 0 (sums, average pools), unless
        ``stabilizer`` is given too or the composite sets a non-default one, and BatchNorms that could not be
        folded get LRP-0 instead of ``pass`` (see :func:`lrp0_batchnorm`)."""
        params = {k: v for k, v in params.items() if v is not None}
        if not params:
            return self
        if self.source == AUTO and not self.entries:  # applied once the network's composite is chosen
            check_params(AUTO, params)
            return dataclasses.replace(self, pending=tuple({**dict(self.pending), **params}.items()))
        # epsilon = 0 means LRP-0 on every linear, sum and pooling node: the Norm rule's stabiliser (sums, average
        # pools) goes to 0 with it unless a stabiliser is given here or set in the composite to another value than
        # the default (exact zeros of a denominator stay guarded)
        eps = params.get("epsilon")
        lrp0 = isinstance(eps, numbers.Real) and not isinstance(eps, bool) and eps == 0 and "stabilizer" not in params
        used: set[str] = set()
        entries = []
        for entry in self.entries:
            fields = {f.name for f in dataclasses.fields(entry.rule)}  # type: ignore[arg-type]
            mine = check_params(entry.rule.name, {k: v for k, v in params.items() if k in fields})
            if lrp0 and isinstance(entry.rule, Norm) and entry.rule.stabilizer == Norm.stabilizer:
                mine["stabilizer"] = 0.0
            used |= set(mine)
            entries.append(Entry(entry.match, dataclasses.replace(entry.rule, **mine)) if mine else entry)
        if isinstance(eps, numbers.Real) and not isinstance(eps, bool) and eps == 0 and not params.get("stabilizer"):
            entries = lrp0_batchnorm(entries)
        unused = set(params) - used
        if unused:
            known = sorted({f.name for e in self.entries for f in dataclasses.fields(e.rule)})  # type: ignore
            raise ValueError(f"composite {self.name!r} has no rule with parameter {', '.join(sorted(unused))}"
                             f" (its rules take: {', '.join(known) or 'no parameters'})")
        return dataclasses.replace(self, entries=tuple(entries))

    def describe(self) -> list[str]:
        lines = []
        for e in self.entries:
            what = ", ".join(f"{k}={v}" for k, v in e.match.items()) or "everything else"
            params = ", ".join(f"{k}={'required' if v is None and k in ('low', 'high') else v}"
                               for k, v in e.rule.params().items())
            lines.append(f"{what} -> {e.rule.name}" + (f"({params})" if params else ""))
        return lines


def lrp0_batchnorm(entries: list) -> list:
    """At epsilon = 0 (and no stabiliser), an unfolded BatchNorm that the composite passes (zennit's BatchNorm ->
    Pass) gets LRP-0 too. Passed, its relevance ``z g`` is no longer proportional to the layer below's output, and
    LRP-0 there divides it by that output where it is near zero (Keras DenseNet121, whose BatchNorms follow
    concatenations: relevance 1e30); with LRP-0 every affine layer stays in gradient form (``R = x g``, no division)
    and the whole is gradient x input. Only in composites whose linear rules are all epsilon/norm (LRP-0 now)."""
    if any(isinstance(e.rule, LinearRule) and not isinstance(e.rule, (Epsilon, Norm)) for e in entries):
        return entries  # z+, gamma, flat, ...: not gradient form below the BatchNorm, so LRP-0 there would divide
    passes = any(e.rule.passes_through and Kind.BATCHNORM in (e.match.get("kind") if isinstance(
        e.match.get("kind"), list) else [e.match.get("kind")]) for e in entries)
    if not passes:
        return entries
    # the kind's value, a str: dataset manifests hash repr(composite)
    return [Entry({"kind": Kind.BATCHNORM.value}, Epsilon(epsilon=0.0))] + entries


def _kind(value) -> str:
    return f"{type(value).__name__} {value!r}"[:80]


def _numbers(value) -> bool:
    """A real number (not a bool), or a (nested) list / array of them."""
    import numpy as np  # here, not at the top: `onnx-lrp composites` loads no numpy

    if isinstance(value, bool):
        return False
    if isinstance(value, (int, float, np.integer, np.floating)):
        return True
    if isinstance(value, (list, tuple)):
        return len(value) > 0 and all(_numbers(v) for v in value)
    if isinstance(value, np.ndarray):
        return value.size > 0 and value.dtype.kind in "iuf"
    return False


# stabilisers: each denominator z becomes z + s * sign(z); a negative s cancels it where |z| = |s| (and flips its
# sign below), so the relevance blows up or changes sign: only s >= 0 (0 is LRP-0, exact zeros stay guarded)
NON_NEGATIVE = ("epsilon", "stabilizer")


def check_params(rule: str, params: dict) -> dict:
    """Rule parameters must be numbers (``low``/``high``: a number or one per channel), finite, stabilisers >= 0:
    one-line errors."""
    for key, value in params.items():
        if value is None:
            continue
        if isinstance(value, (int, float)) and not isinstance(value, bool):  # the common case, without numpy
            if not math.isfinite(value):
                raise ValueError(f"rule {rule!r}: {key} must be finite, not {value}")
            _check_sign(rule, key, value)
            continue
        import numpy as np  # here, not at the top: `onnx-lrp composites` loads no numpy

        if key in ("low", "high"):
            if not _numbers(value):
                raise ValueError(f"rule {rule!r}: {key} must be a number or a list of numbers (one per channel), "
                                 f"not {_kind(value)}")
            try:
                arr = np.asarray(value, dtype=np.float64)
            except ValueError:
                raise ValueError(f"rule {rule!r}: {key} must be a number or a flat list of numbers") from None
        else:
            if isinstance(value, bool) or not isinstance(value, (np.integer, np.floating)) or (
                    isinstance(value, np.ndarray) and value.ndim):
                raise ValueError(f"rule {rule!r}: {key} must be a number, not {_kind(value)}")
            arr = np.asarray(float(value))
        if not np.all(np.isfinite(arr)):
            raise ValueError(f"rule {rule!r}: {key} must be finite, not {value}")
        if key in NON_NEGATIVE and np.any(arr < 0):
            _check_sign(rule, key, float(arr.min()))
    return params


def _check_sign(rule: str, key: str, value: float) -> None:
    if key in NON_NEGATIVE and value < 0:
        raise ValueError(f"rule {rule!r}: {key} must be >= 0, not {value:g} (it is added to each denominator with "
                         "the denominator's sign; a negative one cancels denominators of that size and blows the "
                         "relevance up; 0 is LRP-0)")


def builtin_names() -> list[str]:
    return sorted(p.stem for p in BUILTIN_DIR.glob("*.toml"))


def parse_composite(text: str, source: str = "<string>") -> Composite:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"composite {source}: not valid TOML ({exc})") from None
    except RecursionError:
        raise ValueError(f"composite {source}: nested too deeply to read; give a plain composite file") from None
    entries = _entries(data, source)
    base = data.get("extends")
    if base is not None:
        entries += _base_entries(base, source)
    if not entries:
        raise ValueError(f"composite {source}: it has no [[rules]] entries")
    return Composite(name=str(data.get("name", Path(source).stem)), entries=tuple(entries),
                     description=str(data.get("description", "")), source=source)


def _base_entries(base, source: str) -> list:
    """The entries of a shared base block (``extends = "zennit"``: ``composites/base/zennit.toml``); they follow the
    composite's own entries."""
    names = sorted(p.stem for p in BASE_DIR.glob("*.toml"))
    if not isinstance(base, str) or base not in names:
        raise ValueError(f"composite {source}: `extends` must name a shared base block ({', '.join(names)}), "
                         f"not {base!r}")
    data = tomllib.loads((BASE_DIR / f"{base}.toml").read_text(encoding="utf-8"))
    if "extends" in data:
        raise ValueError(f"composite base {base}: a base block extends no other")
    return _entries(data, f"base/{base}")


def _entries(data: dict, source: str) -> list:
    entries = []
    rules = data.get("rules", [])
    if not isinstance(rules, list):
        raise ValueError(f"composite {source}: `rules` must be a list of [[rules]] tables, not {_kind(rules)}")
    for i, raw in enumerate(rules):
        if not isinstance(raw, dict):
            raise ValueError(f"composite {source}: entry {i + 1} must be a [[rules]] table, not {_kind(raw)}")
        raw = dict(raw)
        match = raw.pop("match", {}) or {}
        if not isinstance(match, dict):
            raise ValueError(f"composite {source}: entry {i + 1}: `match` must be a table such as "
                             f"{{ kind = \"convolution\" }}, not {_kind(match)}")
        bad = set(match) - MATCH_KEYS
        if bad:
            raise ValueError(f"composite {source}: entry {i + 1} matches on unknown key(s) {', '.join(sorted(bad))}"
                             f" (use {', '.join(sorted(MATCH_KEYS))})")
        for key, want in match.items():
            if key == "first_linear" and not isinstance(want, bool):
                raise ValueError(f"composite {source}: entry {i + 1}: match.first_linear must be true or false, "
                                 f"not {_kind(want)}")
            if key != "first_linear" and not (isinstance(want, str) or (
                    isinstance(want, list) and all(isinstance(w, str) for w in want))):
                raise ValueError(f"composite {source}: entry {i + 1}: match.{key} must be a string or a list of "
                                 f"strings, not {_kind(want)}")
        if "rule" not in raw:
            raise ValueError(f"composite {source}: entry {i + 1} names no rule")
        rule_name = raw.pop("rule")
        if not isinstance(rule_name, str):
            raise ValueError(f"composite {source}: entry {i + 1}: `rule` must be a rule name (a string such as "
                             f"\"epsilon\"), not {_kind(rule_name)}")
        try:
            rule = make_rule(rule_name, **check_params(rule_name, raw))
        except (ValueError, TypeError) as exc:
            raise ValueError(f"composite {source}: entry {i + 1}: {exc}") from None
        entries.append(Entry(match, rule))
    return entries


def load_composite(spec: "str | Path | Composite") -> Composite:
    """A built-in composite by name (``epsilon-plus-flat``), or a TOML file by path."""
    if isinstance(spec, Composite):
        return spec
    text = str(spec)
    path = Path(text)
    if path.suffix == ".toml" or path.exists():
        if not path.is_file():
            raise ValueError(f"composite file {text} not found; give a built-in name ({', '.join(builtin_names())})"
                             " or the path of a TOML file")
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"composite file {path} is not a UTF-8 TOML composite (byte {exc.start} is "
                             f"{exc.object[exc.start:exc.start + 1]!r}); give a TOML text file") from None
        except OSError as exc:
            raise ValueError(f"composite file {path} cannot be read ({exc.strerror or type(exc).__name__})") from None
        return parse_composite(text, source=str(path))
    key = text.replace("_", "-").lower()
    if key == AUTO:
        return Composite(name=AUTO, entries=(), source=AUTO, description=AUTO_DESCRIPTION)
    builtin = BUILTIN_DIR / f"{key}.toml"
    if not builtin.is_file():
        raise ValueError(f"unknown composite {text!r}; built-in composites: {AUTO}, {', '.join(builtin_names())}"
                         " (or give the path of a TOML file)")
    return parse_composite(builtin.read_text(encoding="utf-8"), source=key)


__all__ = ["Composite", "Entry", "NodeInfo", "load_composite", "parse_composite", "builtin_names", "RULES",
           "RULE_ALIASES"]
