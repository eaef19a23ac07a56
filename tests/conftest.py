"""Suite-wide pytest hooks. Which folder a test goes to: tests/STAGES.md (one folder per stage of onnx_lrp/); the
shared helpers are tests/util.py and its neighbours, importable from every folder (pyproject.toml's pythonpath)."""
import os

import pytest


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
