"""`onnx-lrp check --report-html`: one self-contained page per check (issue 27, point 6).

* The page needs nothing beside it (no link or source but ``data:`` images and in-page anchors); per sample its
  baseline / current / difference heatmaps, checked tile by tile against a numpy oracle of the bwr colour map over
  the snapshot's relevance and an independent recomputation of the current relevance (onnx_lrp.Explainer);
* opened in a real headless browser (Debian's chromium) and screenshotted: the screenshot is not blank and shows
  the heatmaps' colours and the page's own. Without chromium the browser test skips, unless ONNX_LRP_BROWSER_TEST=1
  (CI sets it, after installing chromium): then it fails.
"""
from __future__ import annotations

import base64
import importlib.util
import io
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser

import numpy as np
import pytest
from PIL import Image

import onnx_lrp
from onnx_lrp import regression as rg
from onnx_lrp.io import heatmap as hm
from util import ROOT

DEMO = ROOT / "models" / "digits_cnn.onnx"
SAMPLES = ROOT / "models" / "samples" / "batch.npy"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars"]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """A check of the demo with one convolution perturbed (+-30 %) against its baseline: the page and the run."""
    from click.testing import CliRunner

    from onnx_lrp.cli.main import main

    d = tmp_path_factory.mktemp("html")
    spec = importlib.util.spec_from_file_location("bdv", ROOT / "models" / "build_deployed_variants.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    perturbed = mod.build_perturbed(DEMO, d / "perturbed.onnx")
    runner = CliRunner()
    r = runner.invoke(main, ["snapshot", str(DEMO), str(SAMPLES), "-o", str(d / "base.npz")])
    assert r.exit_code == 0, r.output
    r = runner.invoke(main, ["check", str(perturbed), str(d / "base.npz"), "--report-html", str(d / "report.html"),
                             "--report-json", str(d / "report.json")])
    assert r.exit_code == 1, r.output  # some samples' relevance drifted
    return dict(html=d / "report.html", baseline=d / "base.npz", model=perturbed, dir=d)


class _Page(HTMLParser):
    def __init__(self):
        super().__init__()
        self.images, self.refs = {}, []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        for key in ("src", "href"):
            if key in a:
                self.refs.append(a[key])
        if tag == "img":
            self.images[a["alt"].removeprefix("heatmaps of ")] = a["src"]


def _bwr(v):
    """zennit's bwr by its nodes: blue (0) -> white (0.5) -> red (1), linear between them."""
    v = np.clip(v, 0, 1)[..., None]
    lo = np.array([0, 0, 255]) + (np.array([255, 255, 255]) - np.array([0, 0, 255])) * (v / 0.5)
    hi = np.array([255, 255, 255]) + (np.array([255, 0, 0]) - np.array([255, 255, 255])) * ((v - 0.5) / 0.5)
    return np.round(np.where(v <= 0.5, lo, hi)).astype(np.uint8)


def _sym(m):
    peak = np.abs(m).max()
    return np.full(m.shape, 0.5) if peak == 0 else 0.5 + 0.5 * m / peak


def test_the_page_is_self_contained_with_every_samples_heatmaps(report):
    text = report["html"].read_text(encoding="utf-8")
    page = _Page()
    page.feed(text)
    assert all(ref.startswith(("data:image/png;base64,", "#")) for ref in page.refs), page.refs
    snap = rg.read_snapshot(report["baseline"])
    assert sorted(page.images) == sorted(snap.items)  # every sample drawn (10 <= MAX_PICTURES)
    cur = onnx_lrp.Explainer(str(report["model"]), composite=snap.composite()).explain(snap.inputs["image"],
                                                                                       target=snap.targets)
    for i, item in enumerate(snap.items):
        png = base64.b64decode(page.images[item].removeprefix("data:image/png;base64,"))
        tiles = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))
        b = snap.relevance["image"][i, 0].astype(np.float64)
        c = cur.relevance[i, 0].astype(np.float64)
        s = hm.tile_scale(16, 16, 160)
        # the difference: current brought to the baseline's sum of |r|, minus it, on the baseline's own scale
        diff = 0.5 + 0.5 * (c * np.abs(b).sum() / np.abs(c).sum() - b) / np.abs(b).max()
        for k, want in enumerate((_sym(b), _sym(c), diff)):
            left, top, right, bottom = hm.cell_box(k, 3, 16, 16, cols=3, scale=s, caption_lines=1)
            got = tiles[top:bottom:s, left:right:s].astype(int)
            assert np.abs(got - _bwr(want)).max() <= 1, (item, k)  # float32 vs float64 rounding at most
    # failing samples first, each row naming its kinds of drift
    rows = re.findall(r'<tr class="(failing|drift|)">', text)
    assert rows == sorted(rows, key=lambda r: {"failing": 0, "drift": 1, "": 2}[r]) and rows[0] == "failing"
    assert "FAIL relevance:" in text and "fail on relevance, predictions" in text


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    return None


def test_the_page_renders_in_a_headless_browser(report, tmp_path):
    browser = _chromium()
    if browser is None:
        if os.environ.get("ONNX_LRP_BROWSER_TEST") == "1":
            pytest.fail("ONNX_LRP_BROWSER_TEST=1 but no chromium on PATH (apt-get install -y chromium)")
        pytest.skip("no chromium (apt-get install -y chromium); CI runs this test")
    shot = tmp_path / "shot.png"
    profile = tmp_path / "profile"
    profile.mkdir()
    cmd = [browser, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--window-size=1280,1600",
           f"--screenshot={shot}", report["html"].resolve().as_uri()]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and shot.is_file(), p.stderr[-2000:]
    im = np.asarray(Image.open(shot).convert("RGB")).astype(int)
    assert im.shape == (1600, 1280, 3)
    assert im.std() > 20  # not blank
    r, g, b = im[..., 0], im[..., 1], im[..., 2]
    red = (r >= 250) & (np.abs(g - b) <= 3) & (g < 200)  # the heatmaps' positive side (bwr)
    blue = (b >= 250) & (np.abs(r - g) <= 3) & (r < 200)  # and their negative side
    badge = (np.abs(r - 0x8E) <= 3) & (np.abs(g - 0x24) <= 3) & (np.abs(b - 0x4D) <= 3)  # the FAIL verdict's colour
    assert red.sum() > 5000 and blue.sum() > 200 and badge.sum() > 300, (red.sum(), blue.sum(), badge.sum())
