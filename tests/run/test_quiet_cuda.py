"""onnxruntime's and the CUDA libraries' own lines never reach the terminal (issue 29, point 5), and a session that
fails still raises one line. Tested on the CPU: the logger severity around CUDA work, the file-descriptor capture
with a child process that writes to fd 2 (as the native libraries do), and a CUDA session start that fails and one
that succeeds, with onnxruntime's InferenceSession stood in for."""
from __future__ import annotations

import subprocess
import sys
import types

import pytest

from onnx_lrp.core.errors import DeviceError
from onnx_lrp.run import runtime

LINE = "[cudnn_frontend] Error: No execution plans support the graph."


def test_cuda_work_runs_with_onnxruntimes_log_at_fatal_and_restores_errors_after(monkeypatch):
    levels = []
    monkeypatch.setattr(runtime.ort, "set_default_logger_severity", levels.append)
    with runtime.quiet_while(True):
        assert levels == [4]
    assert levels == [4, 3]
    with pytest.raises(ValueError):
        with runtime.quiet_while(True):
            raise ValueError("a failure inside still restores the level")
    assert levels[-1] == 3
    with runtime.quiet_while(False):
        pass
    assert levels == [4, 3, 4, 3]


def test_what_a_child_writes_to_fd_2_is_captured_not_shown(capfd):
    code = f"import os; os.write(2, {LINE!r}.encode() + b'\\n'); os.write(2, b'second line\\n')"
    with runtime.captured_stderr() as said:
        subprocess.run([sys.executable, "-c", code], check=True)
        print("stdout is untouched")
    assert said == [LINE, "second line"]
    out, err = capfd.readouterr()
    assert err == "" and out == "stdout is untouched\n"
    with runtime.captured_stderr(False) as said:
        subprocess.run([sys.executable, "-c", code], check=True)
    assert said == [] and LINE in capfd.readouterr().err


class _FakeOrt(types.SimpleNamespace):
    """onnxruntime with a CUDA provider whose session start writes to fd 2 like the CUDA libraries, then fails or
    starts."""

    def __init__(self, real, fail: bool):
        super().__init__(SessionOptions=real.SessionOptions, GraphOptimizationLevel=real.GraphOptimizationLevel,
                         get_available_providers=lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"],
                         set_default_logger_severity=real.set_default_logger_severity, OrtValue=real.OrtValue,
                         preload_dlls=lambda **kw: None)
        self.fail = fail

    def InferenceSession(self, *a, **kw):  # noqa: N802 - onnxruntime's name
        import os

        os.write(2, (LINE + "\n").encode())
        if self.fail:
            raise RuntimeError("[ONNXRuntimeError] : 1 : FAIL : cudnn could not be loaded")
        return types.SimpleNamespace(get_providers=lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"],
                                     get_inputs=lambda: [], get_outputs=lambda: [])


@pytest.mark.parametrize("fail", [False, True])
def test_a_cuda_session_start_shows_nothing_and_a_failure_says_one_line(monkeypatch, capfd, fail):
    real = runtime.ort
    monkeypatch.setattr(runtime, "ort", _FakeOrt(real, fail))
    monkeypatch.setattr(runtime, "installed_runtimes", lambda: ["onnxruntime-gpu"])
    if fail:
        with pytest.raises(DeviceError) as err:
            runtime.Session(b"model", "cuda")
        msg = str(err.value)
        assert "\n" not in msg and "cudnn could not be loaded" in msg and LINE in msg
    else:
        assert runtime.Session(b"model", "cuda").device == "cuda"
    assert capfd.readouterr().err == ""
