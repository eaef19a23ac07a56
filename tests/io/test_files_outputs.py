"""Outputs never destroy inputs (issue 37, items 2, 3 and 6): every command refuses, in one line naming both paths
and with exit 2, an output that is one of its inputs (by resolved path: the model, its external data files,
baselines, input arrays, images of an input folder); report files need their suffix; temporary files have
unpredictable names that no planted symlink redirects, and a killed run's are removed by the next run in the folder;
``--out-dir`` is locked and refused inside the source; control characters in names are escaped (terminal, JUnit
XML, HTML, image captions).

Each refusal test hashes every file of the working folder before and after: the input's bytes are unchanged and no
file (output or temporary) appeared."""
from __future__ import annotations

import codecs
import hashlib
import os
import shutil
import subprocess
import sys
import time
import unicodedata
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from onnx_lrp.core.errors import OutputError
from onnx_lrp.core import files as cf

from util import ROOT  # noqa: E402
DIGITS = ROOT / "models" / "digits_cnn.onnx"
SAMPLES = ROOT / "models" / "samples"
LAYER = "/features/features.6/Conv_output_0"


@pytest.fixture
def run(run_cli):
    """The command group in-process (the CLI's own exit-code handling): (code, stdout, stderr)."""
    return run_cli


def snapshot_tree(folder: Path) -> dict:
    """Every file under ``folder`` (hidden ones too) -> SHA-256 of its bytes."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def work_src(tmp_path_factory):
    """M.onnx, A.onnx (a copy), x.npy, batch.npy, in.npz, png/ and a baseline of M on x.npy, made once."""
    d = tmp_path_factory.mktemp("src")
    shutil.copy(DIGITS, d / "M.onnx")
    shutil.copy(DIGITS, d / "A.onnx")
    shutil.copy(SAMPLES / "npy" / "digit_0.npy", d / "x.npy")
    shutil.copy(SAMPLES / "batch.npy", d / "batch.npy")
    np.savez(d / "in.npz", np.load(SAMPLES / "batch.npy")[:2])
    shutil.copytree(SAMPLES / "png", d / "png")
    from onnx_lrp.cli.main import main
    cwd = os.getcwd()
    os.chdir(d)
    try:
        with pytest.raises(SystemExit) as exc:
            main.main(["snapshot", "M.onnx", "x.npy", "-o", "base.npz"], prog_name="onnx-lrp")
    finally:
        os.chdir(cwd)
    assert exc.value.code == 0
    return d


@pytest.fixture
def work(work_src, tmp_path):
    d = tmp_path / "w"
    shutil.copytree(work_src, d)
    return d


def external_model(folder: Path, data_name: str) -> Path:
    """The digits CNN saved as m.onnx with every initializer in one external file ``data_name``."""
    import onnx

    proto = onnx.load(str(DIGITS))
    onnx.save_model(proto, str(folder / "m.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=data_name, size_threshold=0)
    assert (folder / data_name).stat().st_size > 1000
    return folder / "m.onnx"


def assert_refused(code, out, err, before, folder, *names):
    """Exit 2, one line on stderr naming every one of ``names``, no file of ``folder`` changed or added."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, (code, out, err)
    assert len(lines) == 1 and lines[0].startswith("onnx-lrp: error: "), err
    for n in names:
        assert n in lines[0], (n, lines[0])
    assert snapshot_tree(folder) == before, "a file was written or changed"


# ---------------------------------------------------------------------------------------------- outputs over inputs
CASES = {  # the cases of issue 37, item 2: args, the names the refusal line must hold (the output and the input)
    "check --junit-xml baseline": (["check", "M.onnx", "base.npz", "--junit-xml", "base.npz"], ["base.npz", "baseline"]),
    "check --report-html baseline": (["check", "M.onnx", "base.npz", "--report-html", "base.npz"],
                                     ["base.npz", "baseline"]),
    "check --report-json model": (["check", "M.onnx", "base.npz", "--report-json", "M.onnx"], ["M.onnx", "model"]),
    "diff --report-json MODEL_B": (["diff", "A.onnx", "M.onnx", "x.npy", "--report-json", "M.onnx"],
                                   ["M.onnx", "MODEL_B"]),
    "diff --report-json MODEL_A": (["diff", "A.onnx", "M.onnx", "x.npy", "--report-json", "A.onnx"],
                                   ["A.onnx", "MODEL_A"]),
    "snapshot -o input": (["snapshot", "M.onnx", "in.npz", "-o", "in.npz"], ["in.npz", "input"]),
    "diff --report-json inputs": (["diff", "A.onnx", "M.onnx", "batch.npy", "--report-json", "batch.npy"],
                                  ["batch.npy", "input"]),
    "explain --heatmap image of the input folder": (["explain", "M.onnx", "png", "--heatmap", "png/digit_0.png"],
                                                    ["png/digit_0.png", "input"]),
    "explain -o input": (["explain", "M.onnx", "x.npy", "-o", "x.npy"], ["x.npy", "input"]),
    "explain --heatmap over -o": (["explain", "M.onnx", "x.npy", "-o", "r.npz", "--heatmap", "./r.npz"], ["r.npz"]),
    "evaluate --plot input image": (["evaluate", "M.onnx", "png/digit_3.png", "--plot", "png/digit_3.png"],
                                    ["png/digit_3.png", "input"]),
    "concepts --heatmap input image": (["concepts", "M.onnx", "png/digit_3.png", "--layer", LAYER, "--heatmap",
                                        "png/digit_3.png"], ["png/digit_3.png", "input"]),
    "concepts -o input": (["concepts", "M.onnx", "in.npz", "--layer", LAYER, "-o", "in.npz"], ["in.npz", "input"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_an_output_over_an_input_is_refused_and_nothing_is_written(run, work, case):
    args, names = CASES[case]
    before = snapshot_tree(work)
    assert_refused(*run(*args, cwd=work), before, work, *names)


def test_an_output_through_a_symlink_to_the_input_is_refused(run, work):
    (work / "link.npz").symlink_to(work / "in.npz")
    before = snapshot_tree(work)
    assert_refused(*run("snapshot", "M.onnx", "in.npz", "-o", "link.npz", cwd=work), before, work, "link.npz",
                   "in.npz")
    hard = work / "hard.npz"
    os.link(work / "in.npz", hard)  # a hard link: the same file under another name
    before = snapshot_tree(work)
    assert_refused(*run("snapshot", "M.onnx", "in.npz", "-o", "hard.npz", cwd=work), before, work, "hard.npz",
                   "in.npz")


def test_rewrite_refuses_when_the_default_data_file_is_the_models(run, tmp_path):
    """`rewrite m.onnx` writes ./m.lrp.onnx + m.lrp.onnx.data: a model whose data file has that name keeps it (the
    issue: it was replaced and the model then predicted another class)."""
    model = external_model(tmp_path, "m.lrp.onnx.data")
    before = snapshot_tree(tmp_path)
    assert_refused(*run("rewrite", model.name, cwd=tmp_path), before, tmp_path, "m.lrp.onnx.data", "model")
    code, out, err = run("rewrite", model.name, "-o", "other.onnx", cwd=tmp_path)  # another name: written
    assert code == 0, err
    assert (tmp_path / "other.onnx").is_file()
    assert {k: v for k, v in snapshot_tree(tmp_path).items() if k in before} == before


def test_explain_refuses_to_write_over_the_models_data_file(run, tmp_path):
    model = external_model(tmp_path, "weights.npz")
    shutil.copy(SAMPLES / "npy" / "digit_0.npy", tmp_path / "x.npy")
    before = snapshot_tree(tmp_path)
    assert_refused(*run("explain", model.name, "x.npy", "-o", "weights.npz", cwd=tmp_path), before, tmp_path,
                   "weights.npz", "data file")


def test_two_outputs_naming_one_file_are_refused(run, work):
    before = snapshot_tree(work)
    assert_refused(*run("check", "M.onnx", "base.npz", "--report-json", "r.json", "--report-html", "sub/../r.json",
                        cwd=work), before, work, "r.json")


# ---------------------------------------------------------------------------------------------- suffixes
@pytest.mark.parametrize("option,name", [("--report-json", "r.txt"), ("--junit-xml", "r.json"),
                                         ("--report-html", "r.xml"), ("--report-json", "r")])
def test_report_files_need_their_suffix(run, work, option, name):
    before = snapshot_tree(work)
    assert_refused(*run("check", "M.onnx", "base.npz", option, name, cwd=work), before, work, option, name)


def test_concepts_heatmap_needs_png(run, work):
    before = snapshot_tree(work)
    assert_refused(*run("concepts", "M.onnx", "x.npy", "--layer", LAYER, "--heatmap", "c.jpg", cwd=work), before,
                   work, "--heatmap", "c.jpg")


def test_reports_with_the_right_suffix_are_written(run, work):
    code, out, err = run("check", "M.onnx", "base.npz", "--report-json", "r.json", "--junit-xml", "r.xml",
                         "--report-html", "r.HTML", cwd=work)
    assert code == 0, err
    assert all((work / n).stat().st_size > 0 for n in ("r.json", "r.xml", "r.HTML"))
    assert not cf.temporaries(work)


# ---------------------------------------------------------------------------------------------- temporary files
def test_temporary_names_are_unpredictable_and_carry_the_pid(tmp_path):
    names = set()
    for _ in range(20):
        fd, p = cf.temporary_beside(tmp_path / "out.npz")
        os.close(fd)
        assert p.parent == tmp_path and p.name.startswith(f"{cf.TMP_PREFIX}{os.getpid()}-")
        assert p.name.endswith("-out.npz") and not p.is_symlink()
        names.add(p.name)
    assert len(names) == 20  # random parts: no two alike


def test_atomic_write_replaces_a_symlink_and_never_writes_through_it(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"precious")
    (tmp_path / "out.bin").symlink_to(victim)
    cf.atomic_write(tmp_path / "out.bin", b"new")
    assert victim.read_bytes() == b"precious"
    assert not (tmp_path / "out.bin").is_symlink() and (tmp_path / "out.bin").read_bytes() == b"new"


def test_rewrite_of_external_data_ignores_a_symlink_at_the_old_predictable_name(run, tmp_path):
    """Issue 37 item 3: `.NAME.data.tmp<pid>` was opened by name and followed a planted symlink."""
    model = external_model(tmp_path, "w.data")
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"another user's file")
    out = tmp_path / "out"
    out.mkdir()
    for name in (f".o.onnx.data.tmp{os.getpid()}", f".o.onnx.tmp{os.getpid()}"):
        (out / name).symlink_to(victim)
    code, _, err = run("rewrite", model, "-o", out / "o.onnx", cwd=tmp_path)
    assert code == 0, err
    assert victim.read_bytes() == b"another user's file"
    assert (out / "o.onnx.data").stat().st_size > 1000 and not cf.temporaries(out)


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def plant(folder: Path, pid: int, age_s: float, tag: str = "abcd1234") -> Path:
    p = folder / f"{cf.TMP_PREFIX}{pid}-{tag}-r.npz"
    p.write_bytes(b"x" * 100)
    t = time.time() - age_s
    os.utime(p, (t, t))
    return p


def test_a_run_removes_stale_temporaries_of_dead_processes_only(run, work):
    out = work / "out"
    out.mkdir()
    dead = dead_pid()
    stale = plant(out, dead, 2 * cf.STALE_AFTER_S)
    fresh = plant(out, dead, 0, "efgh5678")  # recent: perhaps a run on another machine sharing the folder
    alive = plant(out, os.getpid(), 2 * cf.STALE_AFTER_S)  # its process still runs
    other = out / ".r.npz.tmp"  # not ours: never touched
    other.write_bytes(b"y")
    cf._SWEPT.discard(str(out))
    code, _, err = run("explain", "M.onnx", "x.npy", "-o", out / "r.npz", cwd=work)
    assert code == 0, err
    assert not stale.exists() and fresh.exists() and alive.exists() and other.exists()
    assert (out / "r.npz").is_file()


KILLED = """
import sys, time
from onnx_lrp.cli.io import AtomicOutputs
def writer(f):
    f.write(b"x" * 4096); f.flush()
    print("writing", flush=True)
    time.sleep(60)
with AtomicOutputs() as w:
    w.write(sys.argv[1], writer)
"""


def test_sigkill_during_a_write_leaves_one_temporary_that_the_next_run_removes(tmp_path):
    import signal

    p = subprocess.Popen([sys.executable, "-c", KILLED, str(tmp_path / "r.npz")], stdout=subprocess.PIPE)
    try:
        assert p.stdout.readline().strip() == b"writing"
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    left = cf.temporaries(tmp_path)
    assert [q.name.split("-")[3] for q in left] == [str(p.pid)] and not (tmp_path / "r.npz").exists()
    assert cf.remove_stale(tmp_path) == []  # younger than STALE_AFTER_S: kept (a clock skew is not a death)
    t = time.time() - 2 * cf.STALE_AFTER_S
    os.utime(left[0], (t, t))
    assert cf.remove_stale(tmp_path) == left and not cf.temporaries(tmp_path)


# ---------------------------------------------------------------------------------------------- --out-dir
HOLD = """
import sys, time
from onnx_lrp.core.files import FolderLock
lock = FolderLock(sys.argv[1])
print("locked", flush=True)
time.sleep(60)
"""


def test_a_second_run_on_a_locked_out_dir_exits_2_naming_the_holder(run, work):
    out = work / "ds"
    out.mkdir()
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdout=subprocess.PIPE)
    try:
        assert p.stdout.readline().strip() == b"locked"
        t0 = time.perf_counter()
        code, _, err = run("explain", "M.onnx", "png", "--out-dir", out, cwd=work)
        assert time.perf_counter() - t0 < 30  # at once: no wait for the holder
        assert code == 2 and len(err.strip().splitlines()) == 1 and f"process {p.pid}" in err, err
        assert not (out / "manifest.json").exists()
    finally:
        p.kill()
        p.wait()
    code, out_text, err = run("explain", "M.onnx", "png", "--out-dir", out, cwd=work)  # the holder is gone
    assert code == 0, err
    assert (out / "manifest.json").is_file()


def test_lock_file_planted_as_a_symlink_is_refused(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    (tmp_path / cf.LOCK_NAME).symlink_to(victim)
    with pytest.raises(OutputError, match="symbolic link"):
        cf.FolderLock(tmp_path)
    assert victim.read_bytes() == b"keep"


def test_out_dir_inside_the_source_is_refused(run, work):
    before = snapshot_tree(work)
    assert_refused(*run("explain", "M.onnx", "png", "--out-dir", "png/out", cwd=work), before, work, "png/out",
                   "inside the source")
    assert not (work / "png" / "out").exists()
    assert_refused(*run("explain", "M.onnx", "png", "--out-dir", "png", cwd=work), before, work, "png")


# ---------------------------------------------------------------------------------------------- control characters
def test_printable_escapes_exactly_the_control_characters():
    """Against unicodedata (category Cc, the separators, bidirectional controls, surrogates) and, for Latin-1 text,
    Python's own unicode_escape decoder as the inverse."""
    extra = {0x2028, 0x2029, *range(0x202A, 0x202F), *range(0x2066, 0x206A), *range(0xD800, 0xE000)}
    for c in range(0x3000):
        ch = chr(c)
        controlled = unicodedata.category(ch) == "Cc" or c in extra
        got = cf.printable(ch)
        assert (got != ch) == controlled, hex(c)
        if controlled:
            assert got.startswith("\\") and all(32 <= ord(x) < 127 for x in got), (hex(c), got)
    for c in range(0xD800, 0xE000, 97):
        assert cf.printable(chr(c)) == f"\\u{c:04x}"
    text = "".join(chr(c) for c in range(256) if c != ord("\\"))
    assert codecs.decode(cf.printable(text).encode("latin-1"), "unicode_escape") == text
    assert cf.printable("\x1b]0;owned\x07") == "\\x1b]0;owned\\x07"


def test_control_characters_in_item_names_are_escaped_in_terminal_junit_html_and_captions(run, tmp_path):
    d = tmp_path / "items"
    d.mkdir()
    evil = "d\x1b]0;owned\x07\nx.npy"
    np.save(d / evil, np.load(SAMPLES / "npy" / "digit_0.npy"))
    shutil.copy(SAMPLES / "npy" / "digit_1.npy", d / "plain.npy")
    code, out, err = run("explain", DIGITS, d, "--heatmap", tmp_path / "h.png", "-o", tmp_path / "r.npz",
                         cwd=tmp_path)
    assert code == 0, err
    assert "\x1b" not in out + err and "\\x1b]0;owned\\x07\\x0ax.npy" in out
    code, out, err = run("snapshot", DIGITS, d, "-o", tmp_path / "b.npz", cwd=tmp_path)
    assert code == 0, err
    code, out, err = run("check", DIGITS, tmp_path / "b.npz", "--junit-xml", tmp_path / "j.xml", "--report-html",
                         tmp_path / "r.html", cwd=tmp_path)
    assert code == 0, err
    assert "\x1b" not in out + err and "\\x1b" in out
    root = ET.parse(tmp_path / "j.xml").getroot()  # parses: no raw control character in the XML
    names = [tc.get("name") for tc in root.iter("testcase")]
    assert any("\\x1b]0;owned\\x07" in n for n in names), names
    page = (tmp_path / "r.html").read_text(encoding="utf-8")
    assert "\x1b" not in page and "\\x1b]0;owned" in page


def test_heatmap_caption_with_a_newline_draws_one_line():
    from onnx_lrp.io import heatmap as hm

    maps = np.random.default_rng(0).normal(size=(2, 8, 8)).astype(np.float32)
    image = hm.render(maps, None, labels=[["a\nb\x1b[2J"], ["c"]])
    same = hm.render(maps, None, labels=[["a\\x0ab\\x1b[2J"], ["c"]])
    assert np.array_equal(np.asarray(image), np.asarray(same))


def test_folder_lock_records_the_pid_and_is_taken_over_within_one_process(tmp_path):
    first = cf.FolderLock(tmp_path)
    assert (tmp_path / cf.LOCK_NAME).read_text().strip() == str(os.getpid())
    second = cf.FolderLock(tmp_path)  # an earlier run's object still alive (a traceback holds it): no self-refusal
    first.release()  # the earlier object going away does not drop the lock the second now holds
    code = subprocess.run([sys.executable, "-c", HOLD.replace("time.sleep(60)", ""), str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert code.returncode != 0 and f"process {os.getpid()}" in code.stderr
    second.release()
    code = subprocess.run([sys.executable, "-c", HOLD.replace("time.sleep(60)", ""), str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert code.returncode == 0 and "locked" in code.stdout, code.stderr


def test_a_rerun_may_replace_its_own_report_inside_an_input_folder(tmp_path):
    """A folder input stands for the items its reader reads (arrays, images, not hidden): a report written into it
    is not an input, an image there is."""
    d = tmp_path / "png"
    shutil.copytree(SAMPLES / "png", d)
    (d / "r.json").write_text("{}")
    (d / ".h.png").write_bytes(b"old")
    cf.guard_outputs([("the input", d)], [("--report-json", d / "r.json"), ("--heatmap", d / ".h.png")],
                     folder_suffixes=(".png", ".npy"))
    with pytest.raises(OutputError, match="digit_1.png is the input"):
        cf.guard_outputs([("the input", d)], [("--heatmap", d / "digit_1.png")], folder_suffixes=(".png",))
    with pytest.raises(OutputError, match="r.json is the input"):  # without suffixes: every file of the folder
        cf.guard_outputs([("the input", d)], [("--report-json", d / "r.json")])
