"""The ``onnx-lrp`` command line: a click group; each command lives in its own module.

Exit codes: 0 success; 1 a check failed (e.g. ``inspect`` found unsupported nodes); 2 bad usage or bad input
(one line on stderr saying what is wrong and what to do, no traceback); 3 an internal error (a bug: set
ONNX_LRP_DEBUG=1 for the traceback).

Adding a command is one line: ``main.add_command(my_command)``. A command signals a failed check with
``sys.exit(1)`` (or ``ctx.exit(1)``) and bad input by raising :class:`onnx_lrp.LrpError` (``InputError`` ...).
"""
from __future__ import annotations

import os
import sys

import click

from onnx_lrp import __version__
from onnx_lrp.errors import InternalError, LrpError

EXIT_OK, EXIT_CHECK_FAILED, EXIT_BAD_INPUT, EXIT_INTERNAL = 0, 1, 2, 3


def _fail(message: str, code: int) -> None:
    text = " ".join(str(message).split())  # one line, always
    click.echo(f"onnx-lrp: error: {text}", err=True)
    sys.exit(code)


class LrpGroup(click.Group):
    """Runs a command and turns every expected failure into one line on stderr and an exit code."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        try:
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


@click.group(cls=LrpGroup, context_settings=dict(help_option_names=["-h", "--help"], max_content_width=110))
@click.version_option(__version__, prog_name="onnx-lrp")
def main():
    """Layer-wise Relevance Propagation (LRP) for any model exported to ONNX.

    \b
    onnx-lrp explain MODEL INPUT --heatmap heat.png   explain a prediction
    onnx-lrp inspect MODEL                            the rule for every node; exit 1 if unsupported
    onnx-lrp rewrite MODEL -o MODEL.lrp.onnx          a relevance model for plain onnxruntime
    onnx-lrp composites                               the built-in composites

    Exit codes: 0 ok, 1 a check failed, 2 bad usage or input (one line on stderr), 3 internal error.
    """


from .commands import composites, inspect, rewrite  # noqa: E402
from .explain import explain  # noqa: E402

main.add_command(explain)
main.add_command(rewrite)
main.add_command(inspect)
main.add_command(composites)
from .regress import check, diff, snapshot  # noqa: E402
main.add_command(snapshot)
main.add_command(check)
main.add_command(diff)

if __name__ == "__main__":  # python -m onnx_lrp.cli.main
    main()
