"""Help shows each option's syntax and an example per mode of explain; concepts --list-layers lists exactly the
tensors --layer accepts; a missed --layer names the closest tensors in one line; one channel is "channel".

Oracles: click's own metavar of every option (the help must show it after the option's flag), the API's
explain_concepts run on every tensor of the ONNX file (accepted or refused), and the model's node names."""
from __future__ import annotations

import re

import click
import numpy as np
import onnx
import pytest
from click.testing import CliRunner

from onnx_lrp.cli.helpfmt import CHOICE_MAX
from onnx_lrp.cli.main import COMMANDS, main
from util import ROOT

DIGITS = ROOT / "models" / "digits_cnn.onnx"
SAMPLE = ROOT / "models" / "samples" / "npy" / "digit_3.npy"


def _commands():
    for name in COMMANDS:
        cmd = main.get_command(None, name)
        yield [name], cmd
        for sub, c in getattr(cmd, "commands", {}).items():
            yield [name, sub], c


def _help(path) -> str:
    r = CliRunner().invoke(main, [*path, "--help"], terminal_width=80)
    assert r.exit_code == 0, r.output
    return r.stdout


def _value(param, ctx) -> str | None:
    if param.is_flag or param.hidden:
        return None
    try:
        meta = param.make_metavar(ctx)
    except TypeError:  # click < 8.2
        meta = param.make_metavar()
    if isinstance(param.type, click.Choice) and len(meta) > CHOICE_MAX:
        return "NAME"
    return "N" if isinstance(param.type, click.IntRange) else meta


@pytest.mark.parametrize("path,cmd", list(_commands()), ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_every_option_shows_its_syntax(path, cmd):
    """`--constant NAME=VALUE, --input-shape NAME=DxD...`, not `--constant, --input-shape`: after each flag that
    takes a value (directly or through `--a/--b VALUE`) comes a value, never a comma or the next flag."""
    text = " ".join(_help(path).split())
    ctx = click.Context(cmd, info_name=path[-1])
    for p in cmd.params:
        if not isinstance(p, click.Option) or _value(p, ctx) is None:
            continue
        flag = max(p.opts, key=len)
        shown = re.findall(re.escape(flag) + r"((?:/--[\w-]+)*)[ =]([^\s,]+)", text)
        assert shown and all(not v.startswith("-") for _, v in shown), (path, flag, text)


def test_explain_help_has_an_example_per_mode_and_names_docs_pages():
    text = _help(["explain"])
    examples = text.split("Examples:")[1].split("\n\n")[0]
    lines = [x.strip() for x in examples.splitlines()]
    commands = [x for x in lines if x.startswith("onnx-lrp explain ")]
    assert any("--text " in x for x in commands), examples
    assert any("--out-dir " in x for x in commands), examples
    assert any(re.search(r"\.(png|jpg|npy|npz)\b| models/samples/png", x) and "--text" not in x for x in commands)
    assert not re.search(r"\bdocs/[\w-]+\.md", text), "help points to repository paths instead of the docs' pages"
    assert "'Text and transformers'" in text and "https://" in text


@pytest.fixture(scope="module")
def listing():
    r = CliRunner().invoke(main, ["concepts", str(DIGITS), "--list-layers"])
    assert r.exit_code == 0, r.output
    return r.stdout


def test_list_layers_lists_every_tensor_accepted(listing):
    import onnx_lrp

    listed = [line.split()[0] for line in listing.splitlines() if line.startswith("  ")]
    assert listing.splitlines()[0].startswith("layers (Conv/Gemm/MatMul outputs): 5")
    ex = onnx_lrp.Explainer(str(DIGITS))
    x = np.load(SAMPLE)[None].astype(np.float32)
    accepted = []
    for n in onnx.load(str(DIGITS)).graph.node:  # the oracle: what the API accepts, tensor by tensor
        for name in n.output:
            try:
                ex.explain_concepts(x, None, name, concepts=[[0]])
            except onnx_lrp.InputError:
                continue
            accepted.append(name)
    assert sorted(listed) == sorted(accepted) and len(accepted) == 12  # Relu, MaxPool, Flatten too; not Softmax
    assert "/features/features.2/Relu_output_0" in listed and "probabilities" not in listed


def test_layer_miss_names_the_closest_in_one_line(run_cli, tmp_path):
    code, out, err = run_cli("concepts", DIGITS, SAMPLE, "--layer", "features.6", cwd=tmp_path)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "the closest: /features/features.6/Conv_output_0 " in err and "features.0" not in err
    code, out, err = run_cli("concepts", DIGITS, SAMPLE, "--layer", "Relu", cwd=tmp_path)
    assert code == 2 and len(err.strip().splitlines()) == 1
    names = re.findall(r"/[^\s,]+_output_0", err)
    assert len(names) == 4 and all("Relu" in n for n in names) and "contain" not in err  # the 4 Relus, no count


def test_one_channel_is_a_channel(run_cli, tmp_path):
    code, out, err = run_cli("concepts", DIGITS, SAMPLE, "--layer", "/features/features.6/Conv_output_0",
                             "--concepts", "3;5,6", cwd=tmp_path)
    assert code == 0, err
    rows = [x.split() for x in out.splitlines()[1:]]
    assert rows[0][:2] == ["channel", "3:"] and rows[1][:2] == ["channels", "5,6:"]
