"""The ``onnx-lrp`` command line: a click group; each command lives in its own module.

Exit codes (docs/exit-codes.md): 0 success; 1 a result that fails a check (``inspect`` found unsupported nodes,
``check`` found drift, ``--strict`` found relevance not conserved, relevance or output NaN/Inf: a
:class:`~onnx_lrp.core.errors.NumericError`); 2 bad usage or bad input (one line on stderr saying what is wrong and
what to do, no traceback); 3 an internal error (a bug: set ONNX_LRP_DEBUG=1 for the traceback), never for bad input.

Adding a command is one line: ``main.add_command(my_command)``. A command signals a failed check with
``sys.exit(1)`` (or raising ``NumericError``) and bad input by raising :class:`onnx_lrp.LrpError` (``InputError``
...).
"""
from __future__ import annotations

import os
import sys

import click

from onnx_lrp import __version__
from onnx_lrp.core.errors import InternalError, LrpError, LrpWarning, NumericError
from onnx_lrp.core.files import printable


EXIT_OK, EXIT_CHECK_FAILED, EXIT_BAD_INPUT, EXIT_INTERNAL = 0, 1, 2, 3


def _fail(message: str, code: int) -> None:
    text = printable(" ".join(str(message).split()))  # one line, always; no terminal control sequence
    click.echo(f"onnx-lrp: error: {text}", err=True)
    sys.exit(code)


def _show_warnings_in_one_line() -> None:
    """onnx-lrp's own warnings (LrpWarning) as one line on stderr, like its errors."""
    import warnings

    previous = warnings.showwarning
    if getattr(previous, "onnx_lrp", False):
        return

    def show(message, category, *a, **k):
        if issubclass(category, LrpWarning):
            click.echo(f"onnx-lrp: warning: {printable(' '.join(str(message).split()))}", err=True)
        else:
            previous(message, category, *a, **k)

    show.onnx_lrp = True
    warnings.showwarning = show


# options that name a file or folder to write: a control character there (a newline, an escape sequence) would reach
# the terminal, the file system and the captions drawn into images raw; refused before any work
FILE_OPTIONS = ("--heatmap", "--heatmap-dir", "--plot", "-o", "--out", "--out-dir", "--report-json", "--report-html",
                "--junit-xml", "--html")


def check_file_names(args: list) -> None:
    """Refuse a file name with a control character given to any of FILE_OPTIONS (``--opt VALUE`` or
    ``--opt=VALUE``), in one line (InputError: exit 2)."""
    from onnx_lrp.core.validate import check_name

    for i, arg in enumerate(args):
        if not isinstance(arg, str) or arg == "--":
            if arg == "--":
                return
            continue
        name, eq, value = arg.partition("=")
        if name in FILE_OPTIONS:
            given = value if eq else (args[i + 1] if i + 1 < len(args) else None)
            if isinstance(given, str):
                check_name(given, name)


class LrpGroup(click.Group):
    """Runs a command and turns every expected failure into one line on stderr and an exit code."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        _show_warnings_in_one_line()
        try:
            check_file_names(sys.argv[1:] if args is None else list(args))
            rv = super().main(args=args, prog_name=prog_name or "onnx-lrp", complete_var=complete_var,
                              standalone_mode=False, **extra)
        except click.exceptions.NoArgsIsHelpError as exc:  # bare `onnx-lrp` or `onnx-lrp explain`: the help
            click.echo(exc.ctx.get_help(), err=True)
            sys.exit(EXIT_BAD_INPUT)
        except click.UsageError as exc:
            hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
            _fail(exc.format_message() + hint, EXIT_BAD_INPUT)
        except click.Abort:
            _fail("aborted", EXIT_BAD_INPUT)
        except click.ClickException as exc:
            _fail(exc.format_message(), exc.exit_code or EXIT_BAD_INPUT)
        except InternalError as exc:  # a bug caught at the API boundary, named by node: still exit 3
            _fail(str(exc), EXIT_INTERNAL)
        except NumericError as exc:  # the run finished, its result failed a check (--strict, NaN/Inf): not bad input
            _fail(str(exc), EXIT_CHECK_FAILED)
        except LrpError as exc:
            _fail(str(exc), EXIT_BAD_INPUT)
        except MemoryError:
            _fail("out of memory; use a smaller --batch-size", EXIT_BAD_INPUT)
        except OSError as exc:
            where = f"{exc.filename}: " if getattr(exc, "filename", None) else ""
            _fail(f"{where}{exc.strerror or exc}", EXIT_BAD_INPUT)
        except Exception as exc:  # a bug: still one line unless asked for the traceback
            if os.environ.get("ONNX_LRP_DEBUG"):
                raise
            _fail(f"internal error {type(exc).__name__}: {exc}. This is a bug in onnx-lrp; rerun with "
                  "ONNX_LRP_DEBUG=1 for the traceback and report it", EXIT_INTERNAL)
        sys.exit(rv if isinstance(rv, int) else EXIT_OK)


# name -> (module, attribute, one-line help): commands are imported only when run (or asked for --help), so that
# `onnx-lrp --help` and `onnx-lrp composites` do not load numpy, onnx and onnxruntime
COMMANDS = {
    "explain": (".explain", "explain", "Explain MODEL's prediction for INPUT with LRP (heatmaps, .npy/.npz)."),
    "trace": (".trace", "trace", "The conservation ledger: where the relevance goes, node by node."),
    "inspect": (".commands", "inspect", "MODEL's inputs, outputs, the rule of every node; a command to explain it."),
    "rewrite": (".commands", "rewrite", "Write MODEL's relevance model for plain onnxruntime."),
    "composites": (".composites", "composites", "List the built-in composites and their rules."),
    "evaluate": (".evaluate", "evaluate", "Is the explanation faithful? Quantus metrics against a random floor."),
    "snapshot": (".regress", "snapshot", "Store MODEL's explanations of INPUTS as a regression baseline."),
    "check": (".regress", "check", "Recompute MODEL's explanations and compare them with a baseline."),
    "diff": (".regress", "diff", "Compare the explanations of two model versions on INPUTS."),
    "concepts": (".concepts", "concepts", "Concept relevance (CRP): which channels of a layer the prediction used."),
    "concept-graph": (".concepts", "concept_graph", "A concept's most relevant lower-level concepts (CRP)."),
    "relmax": (".concepts", "relmax", "Reference samples per channel over a dataset (RelMax): build, show."),
}


class LazyGroup(LrpGroup):
    def list_commands(self, ctx):
        return list(COMMANDS) + [n for n in super().list_commands(ctx) if n not in COMMANDS]

    def get_command(self, ctx, name):
        if name in COMMANDS:
            import importlib

            module, attr, _ = COMMANDS[name]
            return getattr(importlib.import_module(module, __package__), attr)
        return super().get_command(ctx, name)

    def format_commands(self, ctx, formatter):
        rows = [(name, short) for name, (_, _, short) in COMMANDS.items()]
        rows += [(n, self.commands[n].get_short_help_str(80)) for n in self.commands if n not in COMMANDS]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings=dict(help_option_names=["-h", "--help"], max_content_width=110))
@click.version_option(__version__, prog_name="onnx-lrp")
def main():
    """Layer-wise Relevance Propagation (LRP) for any model exported to ONNX.

    \b
    onnx-lrp explain MODEL INPUT --heatmap heat.png   explain a prediction
    onnx-lrp trace MODEL INPUT                        where the relevance goes, node by node
    onnx-lrp inspect MODEL                            inputs, outputs, the rule of every node, a command
    onnx-lrp rewrite MODEL -o MODEL.lrp.onnx          a relevance model for plain onnxruntime
    onnx-lrp composites                               the built-in composites
    onnx-lrp evaluate MODEL INPUT --plot curves.png   is the explanation faithful? (AOPC vs a random floor)
    onnx-lrp snapshot MODEL INPUTS -o base.npz        a regression baseline ...
    onnx-lrp check MODEL base.npz                     ... checked on every change (exit 1 on drift)
    onnx-lrp diff MODEL_A MODEL_B INPUTS              compare two model versions
    onnx-lrp concepts MODEL INPUT --layer T --top 6   concept relevance (CRP) at a layer

    Exit codes: 0 ok, 1 a check failed, 2 bad usage or input (one line on stderr), 3 internal error.
    Shell completion (bash): eval "$(_ONNX_LRP_COMPLETE=bash_source onnx-lrp)" (zsh_source, fish_source).
    """


if __name__ == "__main__":  # python -m onnx_lrp.cli.main
    main()
