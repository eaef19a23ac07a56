"""Suite-wide pytest hooks. Which folder a test goes to: tests/STAGES.md (one folder per stage of onnx_lrp/); the
shared helpers are tests/util.py and its neighbours, importable from every folder (pyproject.toml's pythonpath).
A few tests reuse another stage's model makers (the parity twins, the zennit parity scripts, the UX attention model):
every stage folder is importable too, so that a test file run alone finds them (test file names are unique across
tests/)."""
import os
import sys
from pathlib import Path

import pytest

for _stage in sorted(p for p in Path(__file__).resolve().parent.iterdir() if p.is_dir() and any(p.glob("test_*.py"))):
    if str(_stage) not in sys.path:
        sys.path.append(str(_stage))


def pytest_collection_modifyitems(config, items):
    if os.environ.get("ONNX_LRP_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="slow (large torchvision models); set ONNX_LRP_SLOW=1 to run")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def run_cli(capsys, monkeypatch):
    """The command group in-process, with the CLI's own exit-code handling (no interpreter start-up):
    ``run_cli(*args, cwd=folder) -> (exit code, stdout, stderr)``."""
    from onnx_lrp.cli.main import main

    def run(*args, cwd):
        monkeypatch.chdir(cwd)
        capsys.readouterr()
        with pytest.raises(SystemExit) as exc:
            main.main([str(a) for a in args], prog_name="onnx-lrp")
        got = capsys.readouterr()
        return exc.value.code, got.out, got.err
    return run
