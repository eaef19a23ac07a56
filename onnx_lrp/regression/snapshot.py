"""The snapshot file of ``onnx-lrp snapshot``: its format, writing its arrays and reading them back validated.

A **snapshot** (``onnx-lrp snapshot``) is a plain ``.npz`` (written with ``np.savez_compressed``, read with
``allow_pickle=False``) holding everything a later check needs, so that the check is reproducible from the file
alone:

==========================  ==========================================================================
``meta``                    a JSON string: format and version, onnx-lrp version, the model's SHA-256 and
                            file name, the composite (its TOML text and name), rule-parameter overrides,
                            ``start``, the explained output, the target request, item names, date
``inputs/<name>``           the model inputs, as fed to the model
``targets``                 int64 [N]: the explained index per item (arg-max resolved at snapshot time)
``outputs/<name>``          every model output (quantized and float16 models: the deployed model's, as
                            onnxruntime computed them on the snapshot's machine)
``forward/<name>``          quantized and float16 models only: the explained output of the explained forward
                            (the float path the relevance is computed on)
``relevance/<name>``        the relevance of every float input
==========================  ==========================================================================

``meta`` also records the machine (``machine``: architecture, onnxruntime version, int8 CPU flags, whether
onnxruntime's int8 sums saturate there) and the gap between deployed outputs and explained forward
(``deployed_gap``), so that a check on another CPU can say when the deployed outputs differ between the two.
"""
from __future__ import annotations

import datetime
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..core.brief import brief_repr
from ..core.errors import InputError
from ..core.interface import FORWARD_PREFIX
from ..core.validate import check_npz, expect, expect_int, expect_list_of, loads_json
from ..core.version import VERSION
from ..rules.params import params_from_json, params_to_json
from .compare import Result
from .report import json_safe


FORMAT = "onnx-lrp-snapshot"
FORMAT_VERSION = 1


def composite_source(spec) -> tuple[str, str]:
    """(name, TOML text) of a built-in composite name or a composite file."""
    from ..rules.composite import BUILTIN_DIR, builtin_names

    text = str(spec)
    path = Path(text)
    if path.suffix == ".toml" or path.exists():
        try:
            return path.stem, path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"composite file {path} cannot be read ({exc})") from None
    key = text.replace("_", "-").lower()
    builtin = BUILTIN_DIR / f"{key}.toml"
    if not builtin.is_file():
        raise InputError(f"unknown composite {text!r}; built-in composites: {', '.join(builtin_names())}")
    return key, builtin.read_text(encoding="utf-8")


@dataclass
class Snapshot:
    meta: dict
    inputs: dict
    targets: np.ndarray
    outputs: dict
    relevance: dict
    forward: dict = field(default_factory=dict)

    @property
    def items(self) -> list:
        return list(self.meta.get("items") or [f"item[{i}]" for i in range(len(self.targets))])

    def __repr__(self) -> str:
        meta = {k: self.meta.get(k) for k in ("explained_output", "start", "onnx_lrp_version") if k in self.meta}
        return brief_repr(self, ["inputs", "targets", "outputs", "relevance", "forward"])[:-1] + \
            f", composite={self.meta.get('composite', {}).get('name')!r}, meta={meta})"

    def composite(self):
        """The stored composite with its parameter overrides."""
        from ..rules.composite import parse_composite

        c = self.meta["composite"]
        try:
            return parse_composite(c["toml"], source=c["name"]).with_params(**params_from_json(c.get("params")))
        except (ValueError, TypeError, KeyError) as exc:
            raise InputError(f"the snapshot's composite cannot be used: {exc}") from None

    def result(self) -> Result:
        name = self.meta["explained_output"]
        return Result(self.relevance, self.outputs[name], self.targets, self.items, self.outputs,
                      self.forward.get(name))


@dataclass(frozen=True)
class Recorded:
    """What a snapshot stores of the explained batch: the inputs by name, the targets used, the outputs (the
    explained forward's under FORWARD_PREFIX), the relevance by input, and the items' names."""
    inputs: dict
    targets: object
    outputs: dict
    relevance: dict
    items: list


@dataclass(frozen=True)
class Provenance:
    """How a snapshot was made: the model file, the composite (name, TOML, parameter overrides), start, the output
    asked for and the one explained, the target as requested, the batch size, notes, the machine's facts and the
    worst deployed gap."""
    model_path: object
    composite_name: str
    composite_toml: str
    params: dict
    start: str
    output: str | None
    explained_output: str
    target_request: object
    batch_size: int = 32
    notes: list | None = None
    machine: dict | None = None
    deployed_gap: dict | None = None


def snapshot_arrays(recorded: Recorded, made: Provenance) -> dict:
    """The arrays of a snapshot file (``np.savez_compressed(path, **arrays)``), metadata as one JSON string."""
    from ..load import model_sha256  # the loader (onnx): only when a snapshot is written

    inputs, targets, outputs, relevance, items = (recorded.inputs, recorded.targets, recorded.outputs,
                                                  recorded.relevance, recorded.items)
    model_path, deployed_gap = made.model_path, made.deployed_gap

    meta = dict(format=FORMAT, format_version=FORMAT_VERSION, onnx_lrp_version=VERSION,
                created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                model=dict(file=Path(model_path).name, sha256=model_sha256(model_path)),
                composite=dict(name=made.composite_name, toml=made.composite_toml,
                               params=params_to_json(made.params)),
                start=made.start, output=made.output, explained_output=made.explained_output,
                target_request=made.target_request, items=[str(i) for i in items], batch_size=int(made.batch_size),
                inputs=sorted(inputs), relevance=sorted(relevance),
                outputs=sorted(k for k in outputs if not k.startswith(FORWARD_PREFIX)), notes=made.notes or [],
                machine=made.machine, deployed_gap=json_safe(deployed_gap) if deployed_gap else None)
    arrays = {"meta": np.array(json.dumps(meta))}
    arrays.update({f"inputs/{k}": np.asarray(v) for k, v in inputs.items()})
    arrays["targets"] = np.asarray(targets, np.int64)
    for k, v in outputs.items():
        forward = k.startswith(FORWARD_PREFIX)
        arrays[f"forward/{k[len(FORWARD_PREFIX):]}" if forward else f"outputs/{k}"] = np.asarray(v)
    arrays.update({f"relevance/{k}": np.asarray(v) for k, v in relevance.items()})
    return arrays


def read_snapshot(path) -> Snapshot:
    """Read and validate a snapshot (never unpickles); one-line InputError on anything wrong."""
    import zipfile

    path = Path(path)
    if not path.is_file():
        raise InputError(f"baseline {path} not found; create it with `onnx-lrp snapshot MODEL INPUTS -o {path}`")
    check_npz(path, f"baseline {path}")  # the members' declared sizes against the cap, before inflating
    try:
        loaded = np.load(path, allow_pickle=False)
        if not isinstance(loaded, np.lib.npyio.NpzFile):  # a plain .npy array
            raise InputError(f"baseline {path} is a single array, not an onnx-lrp snapshot (.npz); create one with "
                             "`onnx-lrp snapshot MODEL INPUTS -o baseline.npz`")
        with loaded as z:
            data = {k: z[k] for k in z.files}
    except InputError:
        raise
    except ValueError as exc:
        raise InputError(f"baseline {path} holds pickled objects or is not an .npz ({str(exc).splitlines()[0]}); "
                         "snapshots hold plain arrays only: recreate it with `onnx-lrp snapshot`") from None
    except (zipfile.BadZipFile, EOFError, OSError) as exc:
        raise InputError(f"baseline {path} is not a valid .npz file ({type(exc).__name__}); it may be truncated; "
                         "recreate it with `onnx-lrp snapshot`") from None
    if "meta" not in data:
        raise InputError(f"baseline {path} is an .npz but not an onnx-lrp snapshot (no 'meta'); create one with "
                         "`onnx-lrp snapshot`")
    meta = _check_meta(loads_json(str(data["meta"]), f"baseline {path}: its metadata"), path)

    def group(prefix):
        return {k[len(prefix):]: v for k, v in data.items() if k.startswith(prefix)}

    targets = np.asarray(data.get("targets", np.zeros(0, np.int64)))
    if targets.dtype.kind not in "iu" or targets.ndim != 1:
        raise InputError(f"baseline {path}: targets is {targets.dtype} of shape {'x'.join(map(str, targets.shape))}; "
                         "a snapshot holds one integer class per item: recreate it with `onnx-lrp snapshot`")
    snap = Snapshot(meta, group("inputs/"), targets.astype(np.int64),
                    group("outputs/"), group("relevance/"), group("forward/"))
    n = len(snap.targets)
    if not snap.inputs or not snap.relevance or meta["explained_output"] not in snap.outputs:
        raise InputError(f"baseline {path} lacks inputs, relevance or the explained output "
                         f"{meta['explained_output']!r}; recreate it with `onnx-lrp snapshot`")
    for kind, arrs in (("inputs", snap.inputs), ("outputs", snap.outputs), ("relevance", snap.relevance),
                       ("forward", snap.forward)):
        for k, a in arrs.items():
            if a.dtype.kind not in "biuf":
                raise InputError(f"baseline {path}: {kind}/{k} holds {a.dtype}, not numbers; the file is inconsistent")
            if a.ndim == 0 or a.shape[0] != n:
                raise InputError(f"baseline {path}: {kind}/{k} has {a.shape[0] if a.ndim else 0} items but "
                                 f"targets has {n}; the file is inconsistent")
    if len(meta["items"]) != n:
        raise InputError(f"baseline {path}: {len(meta['items'])} item names for {n} items")
    return snap


def _check_meta(meta, path) -> dict:
    """The snapshot's metadata, every field a later check uses of the type it needs (one line otherwise)."""
    where = f"baseline {path}: its metadata"
    expect(meta, dict, where, "recreate the baseline with `onnx-lrp snapshot`")
    if meta.get("format") != FORMAT:
        raise InputError(f"baseline {path} is not an onnx-lrp snapshot (format {meta.get('format')!r})")
    version = expect_int(meta.get("format_version", 0), f"{where}: format_version", 0)
    if version > FORMAT_VERSION:
        raise InputError(f"baseline {path} has snapshot format {version}, newer than this onnx-lrp reads "
                         f"({FORMAT_VERSION}); upgrade onnx-lrp")
    for key in ("composite", "explained_output", "start", "items"):
        if key not in meta:
            raise InputError(f"baseline {path}: its metadata lacks {key!r}; recreate it with `onnx-lrp snapshot`")
    hint = "recreate the baseline with `onnx-lrp snapshot`"
    comp = expect(meta["composite"], dict, f"{where}: composite", hint)
    expect(comp.get("name"), str, f"{where}: composite.name", hint)
    expect(comp.get("toml"), str, f"{where}: composite.toml", hint)
    params = expect(comp.get("params") or {}, dict, f"{where}: composite.params", hint)
    for k, v in params.items():
        expect(v, (int, float, str, list, dict), f"{where}: composite.params.{k}", hint)
        if isinstance(v, dict):
            expect(v.get("array"), (int, float, list), f"{where}: composite.params.{k}.array", hint)
            expect(v.get("dtype", "float32"), str, f"{where}: composite.params.{k}.dtype", hint)
    expect(meta["explained_output"], str, f"{where}: explained_output", hint)
    expect(meta["start"], str, f"{where}: start", hint)
    expect(meta.get("output"), (str, type(None)), f"{where}: output", hint)
    expect_list_of(meta["items"], str, f"{where}: items", hint)
    if meta.get("batch_size") is not None:
        expect_int(meta["batch_size"], f"{where}: batch_size", 1, None, hint)
    model = expect(meta.get("model", {}), dict, f"{where}: model", hint)
    expect(model.get("sha256"), (str, type(None)), f"{where}: model.sha256", hint)
    for key in ("machine", "deployed_gap"):
        expect(meta.get(key), (dict, type(None)), f"{where}: {key}", hint)
    expect(meta.get("notes", []), list, f"{where}: notes", hint)
    expect(meta.get("onnx_lrp_version"), (str, type(None)), f"{where}: onnx_lrp_version", hint)
    return meta


__all__ = ["FORMAT", "FORMAT_VERSION", "Provenance", "Recorded", "Snapshot", "composite_source", "read_snapshot", "snapshot_arrays"]
