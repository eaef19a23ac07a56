"""``onnx-lrp composites``: imports only the composite files and rules (no numpy, onnx or onnxruntime)."""
from __future__ import annotations

import click
from onnx_lrp.rules.composite import builtin_names, load_composite

from onnx_lrp.core.errors import InputError

from .helpfmt import Command


@click.command("composites", cls=Command, examples=["onnx-lrp composites",
                                                     "onnx-lrp composites epsilon-gamma-box my-composite.toml"])
@click.argument("names", nargs=-1, metavar="[NAME|FILE]...")
def composites(names):
    """List the built-in composites (or the given ones and composite files, checked) and the rule each maps every
    kind of layer to.

    Entries are matched top to bottom, the first match wins. first_linear marks the linear layers nearest the
    input. docs/composites.md explains them.
    """
    for i, name in enumerate(names or builtin_names()):
        try:
            comp = load_composite(name)
        except ValueError as exc:
            raise InputError(str(exc)) from None
        except OSError as exc:
            raise InputError(f"composite file {name}: {exc.strerror or exc}") from None
        if names:  # files given: their kinds and op types are checked (this loads the op handlers)
            from onnx_lrp.lrp.composite_check import check_composite
            check_composite(comp)
        if i:
            click.echo()
        click.echo(f"{comp.name}: {comp.description}" if comp.description else comp.name)
        for line in comp.describe():
            click.echo(f"  {line}")


__all__ = ["composites"]
