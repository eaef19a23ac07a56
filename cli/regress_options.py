"""The option groups of ``onnx-lrp snapshot``, ``check`` and ``diff`` (cli/regress.py), each one frozen object: click
hands a command each option as a keyword; :func:`packed` hands it a group of them as one object."""
from __future__ import annotations

import functools
from dataclasses import dataclass


@dataclass(frozen=True)
class Reports:
    """The report options of check and diff (REPORT_ROWS)."""
    report_json: str | None
    junit_xml: str | None
    report_html: str | None
    heatmap_dir: str | None
    max_rows: int | None


@dataclass(frozen=True)
class Asked:
    """What snapshot and diff explain: the target as given, the output, the start and the batch size."""
    target: str
    output_name: str | None
    start: str
    batch_size: int


@dataclass(frozen=True)
class Engine:
    """Where check recomputes: ``local`` or ``ray`` (with its workers and cluster address)."""
    engine: str
    workers: int | None
    ray_address: str | None


@dataclass(frozen=True)
class Faith:
    """snapshot's --metrics and the region-perturbation settings stored with them (faith_options)."""
    metrics: str | None
    metric_patch: int
    metric_steps: int
    metric_baseline: str
    metric_seed: int


def packed(name: str, kind):
    """Below a command's click options: the options named as ``kind``'s fields reach the command as one ``kind``
    object, the parameter ``name`` (the options, their help and their order stay as declared)."""
    keys = list(kind.__dataclass_fields__)

    def wrap(f):
        @functools.wraps(f)
        def command(**given):
            given[name] = kind(**{k: given.pop(k) for k in keys})
            return f(**given)
        return command
    return wrap


__all__ = ["Asked", "Engine", "Faith", "Reports", "packed"]
