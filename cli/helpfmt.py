"""Help that fits a screen: a command's options in titled sections, related options on one row, examples first.

``@click.command("explain", cls=Command, examples=[...], sections=[...], docs=[...])``: ``sections`` is a list of
``(title, rows)``; a row is an option's name (the Python name of its parameter), or a :class:`Row` that puts several
options on one line with a help of its own. Options a section does not list are shown under "Other options", so
none is ever hidden. ``docs``: the titles of the documentation pages the help points to (last, with its address).
Every subcommand's ``--help`` stays within 60 lines at 80 columns (tests/cli/test_cli_door.py).
"""
from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass

import click

DOCS_URL = "https://github.com/onnx-lrp/onnx-lrp/tree/main/docs"  # pyproject.toml's Documentation; `mkdocs serve`
RANGE_NOTE = re.compile(r"\s*\[[-0-9.e]*<?=?x[<>]=?[-0-9.e]*\]$")
LEFT_MAX = 30  # width of the option column; longer option names put their help on the next line


@dataclass(frozen=True)
class Row:
    """Several options on one help row: ``names`` (parameter names), the ``help`` of the row, and the ``left`` text.
    The left column shows each option's syntax: ``left`` where it names a value after every option that takes one
    (``--mean/--std F[,F...]``), else the options with their metavars, those of one metavar side by side
    (``--constant NAME=VALUE, --input-shape NAME=DxD...``, ``--epsilon/--gamma/--stabilizer FLOAT``)."""

    names: tuple
    help: str
    left: str | None = None


def _names(row) -> tuple:
    return row.names if isinstance(row, Row) else (row,)


def _flags(param) -> str:
    return max(param.opts, key=len)


def _metavar(param, ctx) -> str:
    try:
        return param.make_metavar(ctx)
    except TypeError:  # click < 8.2
        return param.make_metavar()


CHOICE_MAX = 16  # a longer list of choices shows as NAME on a row of several options (the option's help lists them)


def _value(param, ctx) -> str:
    """What follows the option on the command line ("" for a flag): its metavar, shortened for a row."""
    if getattr(param, "is_flag", False) or getattr(param, "count", False):
        return ""
    meta = _metavar(param, ctx)
    if isinstance(param.type, click.Choice) and len(meta) > CHOICE_MAX:
        return "NAME"
    return "N" if isinstance(param.type, click.IntRange) else meta


def _syntax(present: list, ctx) -> str:
    """``--a/--b META, --flag``: each option with its value, options of one value side by side."""
    groups: list[tuple[list, str]] = []
    for p in present:
        value = _value(p, ctx)
        if groups and value and groups[-1][1] == value:
            groups[-1][0].append(_flags(p))
        else:
            groups.append(([_flags(p)], value))
    return ", ".join("/".join(flags) + (f" {value}" if value else "") for flags, value in groups)


def _shows_syntax(left: str, present: list, ctx) -> bool:
    """Whether ``left`` names a value after each option that takes one (through ``--a/--b VALUE``)."""
    for p in present:
        if _value(p, ctx) and not re.search(re.escape(_flags(p)) + r"(?:/--[\w-]+)*[ =][^-\s,]", left):
            return False
    return True


def _left(row: Row, params: dict, ctx) -> str:
    present = [params[n] for n in row.names if n in params]
    if row.left is not None and _shows_syntax(row.left, present, ctx):
        return row.left
    return _syntax(present, ctx) if present else ""


class HelpMixin:
    """The help layout shared by :class:`Command` and :class:`Group`."""

    def _init_help(self, examples, sections, docs=()):
        self.examples = list(examples or ())
        self.sections = list(sections or ())
        self.docs = tuple(docs or ())

    def format_epilog(self, ctx, formatter):
        """``docs``: the titles of the documentation pages that say more, with where the documentation is."""
        super().format_epilog(ctx, formatter)
        if self.docs:
            formatter.write_paragraph()
            formatter.write(f"Docs: {', '.join(repr(t) for t in self.docs)}\n  at {DOCS_URL}\n")

    def format_help(self, ctx, formatter):
        self.format_usage(ctx, formatter)
        self.format_help_text(ctx, formatter)
        if self.examples:
            with formatter.section("Examples"):
                for line in self.examples:  # as written: a command line is not re-wrapped
                    formatter.write(f"{'':>{formatter.current_indent}}{line}\n")
        self.format_options(ctx, formatter)
        self.format_epilog(ctx, formatter)

    def format_options(self, ctx, formatter):
        help_option = self.get_help_option(ctx)
        params = {("help" if p is help_option else p.name): p for p in self.get_params(ctx)
                  if not getattr(p, "hidden", False) and isinstance(p, click.Option)}
        shown = set()
        rest = [n for n in params if n != "help" and not any(n in _names(r) for _, rows in self.sections
                                                                for r in rows)]
        for k, (title, rows) in enumerate(self.sections):
            lines = []
            for row in rows:
                if isinstance(row, Row):
                    names = [n for n in row.names if n in params]
                    if names:
                        lines.append((_left(row, params, ctx), row.help))
                        shown.update(names)
                elif row in params:
                    rec = params[row].get_help_record(ctx)
                    if rec is not None:
                        lines.append(rec)
                        shown.add(row)
            if k == len(self.sections) - 1 and not rest and "help" in params:  # -h last, without a section
                lines.append(params["help"].get_help_record(ctx))
                shown.add("help")
            if lines:
                with formatter.section(title):
                    _write_rows(formatter, lines)
        records = [r for r in (params[n].get_help_record(ctx) for n in params if n not in shown) if r is not None]
        if records:
            with formatter.section("Other options" if self.sections else "Options"):
                _write_rows(formatter, records)
        if isinstance(self, click.Group):
            self.format_commands(ctx, formatter)


def _write_rows(formatter, rows) -> None:
    """Two columns: the option (at most LEFT_MAX wide, else its help starts on the next line) and its help, wrapped
    to the formatter's width."""
    width = min(LEFT_MAX, max(len(left) for left, _ in rows))
    indent = formatter.current_indent
    text_width = max(formatter.width - indent - width - 2, 20)
    for left, text in rows:
        text = RANGE_NOTE.sub("", text or "")  # click's "[x>=1]": the help says what the values are
        wrapped = click.formatting.wrap_text(text, text_width).splitlines() or [""]
        if len(left) <= width:
            formatter.write(f"{'':>{indent}}{left:<{width}}  {wrapped[0]}".rstrip() + "\n")
            rest = wrapped[1:]
        else:  # the options on lines of their own (wrapped at spaces, never inside a flag), the help below or
            # beside the last of them when that one is short enough
            lines = textwrap.wrap(left, formatter.width - indent, break_on_hyphens=False, break_long_words=False)
            for line in lines[:-1]:
                formatter.write(f"{'':>{indent}}{line}\n")
            beside = len(lines[-1]) <= width
            formatter.write(f"{'':>{indent}}{lines[-1]:<{width if beside else 0}}"
                            + (f"  {wrapped[0]}".rstrip() if beside else "") + "\n")
            rest = wrapped[1:] if beside else wrapped
        for line in rest:
            formatter.write(f"{'':>{indent + width + 2}}{line}\n")


class Command(HelpMixin, click.Command):
    """A click command with :class:`HelpMixin`'s layout: ``examples=[...]``, ``sections=[...]``."""

    def __init__(self, *args, examples=(), sections=(), docs=(), **kw):
        super().__init__(*args, **kw)
        self._init_help(examples, sections, docs)


class Group(HelpMixin, click.Group):
    """A click group with :class:`HelpMixin`'s layout; its subcommands default to :class:`Command`."""

    command_class = Command

    def __init__(self, *args, examples=(), sections=(), docs=(), **kw):
        super().__init__(*args, **kw)
        self._init_help(examples, sections, docs)


__all__ = ["Command", "Group", "Row"]
