"""Regression checks for explanations (``onnx-lrp snapshot / check / diff``); no onnx import.

The package: :mod:`.thresholds` (when a sample drifts: the thresholds and the metrics beyond them), :mod:`.figures`
(the per-sample metrics), :mod:`.compare` (two explanation sets compared sample by sample), :mod:`.snapshot` (the
snapshot file: format, writing, reading), :mod:`.report` (the table, JSON and JUnit XML) and :mod:`.html` (the
HTML page). Explaining the items in chunks is :func:`onnx_lrp.run.batches.explain_all`.
"""
from __future__ import annotations

from .compare import (
    Comparison,
    Result,
    Sample,
    compare,
    deployed_difference,
    deployed_difference_message,
)
from .figures import (
    cosine,
    output_diff,
    rel_l2,
    sample_metrics,
    spearman,
    topk_count,
    topk_iou,
)
from .html import report_html
from .report import drift_line, format_table, junit_xml, report_dict, report_json, sample_status
from .snapshot import (
    FORMAT,
    FORMAT_VERSION,
    Snapshot,
    composite_source,
    read_snapshot,
    Provenance,
    Recorded,
    snapshot_arrays,
)
from .thresholds import (
    CONFIG_NAME,
    DEFAULT_FAIL_ON,
    DEFAULT_THRESHOLDS,
    KIND_NAMES,
    KINDS,
    METRIC_HELP,
    METRICS,
    Thresholds,
    drift,
    failures,
    load_thresholds,
    parse_fail_on,
    parse_threshold,
)


__all__ = ["Thresholds", "DEFAULT_THRESHOLDS", "METRICS", "METRIC_HELP", "load_thresholds", "parse_threshold",
           "cosine", "rel_l2", "spearman", "topk_iou", "topk_count", "output_diff", "sample_metrics",
           "failures", "drift", "KINDS", "KIND_NAMES", "DEFAULT_FAIL_ON", "parse_fail_on",
           "Result", "Sample", "Comparison", "compare",
           "deployed_difference", "deployed_difference_message",
           "composite_source", "Snapshot", "Provenance", "Recorded", "snapshot_arrays", "read_snapshot",
           "format_table", "report_dict", "report_json", "junit_xml", "report_html", "drift_line", "sample_status",
           "FORMAT", "FORMAT_VERSION", "CONFIG_NAME"]
