"""Checks of what the tool reads (files' fields, environment variables, file names, declared array sizes): each
refuses in one line (:class:`InputError`, exit 2) naming where the value came from and what to give instead."""
from __future__ import annotations

import functools
import json
import math
import os
import re
from pathlib import Path

from .errors import InputError


_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "a string", list: "a list",
          dict: "a mapping", type(None): "null"}
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _kind(value) -> str:
    return _NAMES.get(type(value), type(value).__name__)


def expect(value, kind, where: str, hint: str = ""):
    """``value`` if it is of ``kind`` (a type or a tuple of types; ``int`` and ``float`` never accept a bool,
    ``float`` accepts an int), else one InputError: "WHERE is a list; give a mapping"."""
    kinds = kind if isinstance(kind, tuple) else (kind,)
    ok = any(isinstance(value, k) and not (isinstance(value, bool) and k in (int, float)) for k in kinds) \
        or (float in kinds and isinstance(value, int) and not isinstance(value, bool))
    if not ok:
        want = " or ".join(_NAMES.get(k, k.__name__) for k in kinds)
        raise InputError(f"{where} is {_kind(value)} ({_short(value)}); give {want}"
                         + (f"; {hint}" if hint else ""))
    return value


def expect_int(value, where: str, lo: int | None = None, hi: int | None = None, hint: str = "") -> int:
    """An integer (not a bool) within [lo, hi]."""
    v = expect(value, int, where, hint)
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        bounds = f">= {lo}" if hi is None else f"<= {hi}" if lo is None else f"in [{lo}, {hi}]"
        raise InputError(f"{where} is {v}; give an integer {bounds}" + (f"; {hint}" if hint else ""))
    return v


def expect_list_of(value, kind, where: str, hint: str = "") -> list:
    """A list whose every entry is of ``kind``."""
    expect(value, list, where, hint)
    for i, v in enumerate(value):
        expect(v, kind, f"{where}[{i}]", hint)
    return value


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def loads_json(text, where: str, hint: str = ""):
    """JSON text (str or UTF-8 bytes) -> value; invalid JSON, invalid UTF-8 or nesting too deep for Python: one
    InputError naming ``where``."""
    try:
        if isinstance(text, (bytes, bytearray)):
            text = bytes(text).decode("utf-8")
        return json.loads(text)
    except UnicodeDecodeError as exc:
        raise InputError(f"{where} is not UTF-8 text (byte {exc.start}); give a UTF-8 JSON file"
                         + (f"; {hint}" if hint else "")) from None
    except RecursionError:
        raise InputError(f"{where} is nested too deeply to read; give a flat JSON file"
                         + (f"; {hint}" if hint else "")) from None
    except ValueError as exc:
        raise InputError(f"{where} is not valid JSON ({' '.join(str(exc).split())})"
                         + (f"; {hint}" if hint else "")) from None


def read_json(path, where: str | None = None, hint: str = ""):
    """A JSON file's value (one-line InputError when unreadable, not UTF-8, not JSON or too deep)."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise InputError(f"{where or p} cannot be read ({exc.strerror or exc})") from None
    return loads_json(data, where or str(p), hint)


def read_text(path, where: str | None = None) -> str:
    """A UTF-8 text file's text (one-line InputError when unreadable or not UTF-8)."""
    p = Path(path)
    try:
        return p.read_bytes().decode("utf-8")
    except OSError as exc:
        raise InputError(f"{where or p} cannot be read ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise InputError(f"{where or p} is not UTF-8 text (byte {exc.start}); give a UTF-8 file") from None


def inside(folder, name, where: str) -> Path:
    """``folder / name`` for a relative ``name`` that stays inside ``folder`` after resolving ``..`` and symbolic
    links; anything else (absolute, ``../..``, a link out) is refused."""
    expect(name, str, where)
    base = Path(folder).resolve()
    target = (base / name).resolve()
    if Path(name).is_absolute() or (target != base and base not in target.parents):
        raise InputError(f"{where} = {_short(name)} points outside {folder}; a listed file must stay inside its "
                         "folder")
    return target


def env_int(name: str, default: int, lo: int, hi: int) -> int:
    """An integer environment variable within [lo, hi] (unset: ``default``); anything else refused in one line."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    text = raw.strip()
    if not re.fullmatch(r"[+-]?\d{1,12}", text):
        raise InputError(f"environment variable {name}={raw!r} is not an integer; give one in [{lo}, {hi}] or unset "
                         "it")
    v = int(text)
    if not lo <= v <= hi:
        raise InputError(f"environment variable {name}={v} is out of range; give an integer in [{lo}, {hi}] or unset "
                         "it")
    return v


def max_threads() -> int:
    """The most threads a thread-count setting may ask for: 4 x the CPUs, at most 1024."""
    return min(1024, 4 * (os.cpu_count() or 1))


def check_name(path, option: str) -> None:
    """Refuse a file name with a control character (a newline, an escape sequence): it would break the one-line
    messages, the terminal and the text drawn into images."""
    text = os.fspath(path) if not isinstance(path, str) else path
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    m = _CONTROL.search(text)
    if m:
        raise InputError(f"{option} {text!r} contains the control character {m.group()!r}; give a file name "
                         "without control characters")


@functools.lru_cache(maxsize=1)
def available_memory() -> int | None:
    """Bytes of memory available (Linux: MemAvailable), else None; read once per process (a dataset checks every
    image against the cap)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


MEMORY_FRACTION = 0.5  # one array may take up to this share of the memory available
CAP_VARIABLE = "ONNX_LRP_MAX_ARRAY_BYTES"


def array_cap() -> int:
    """The most bytes one array read from a file (or decoded from an image) may take: ``ONNX_LRP_MAX_ARRAY_BYTES``
    when set (validated), else half the memory available now (16 GiB when that is unknown)."""
    given = env_int(CAP_VARIABLE, -1, 1, 2 ** 50)
    if given > 0:
        return given
    avail = available_memory()
    return int(avail * MEMORY_FRACTION) if avail else 16 * 2 ** 30


def check_size(nbytes, what: str) -> None:
    """Refuse reading ``nbytes`` (declared size, before reading) beyond :func:`array_cap`."""
    cap = array_cap()
    if not math.isfinite(float(nbytes)) or nbytes > cap:
        raise InputError(f"{what} would take {_bytes(nbytes)} in memory, more than the cap of {_bytes(cap)} (half the "
                         f"memory available, or {CAP_VARIABLE}); give a smaller file")


def npy_nbytes(stream) -> int | None:
    """The bytes the .npy array at ``stream``'s position declares (shape x itemsize, read from its header), or
    None when the header is not a readable .npy header (the reader then says what is wrong)."""
    import numpy as np

    try:
        version = np.lib.format.read_magic(stream)
        reader = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
        shape, _, dtype = reader[version](stream) if version in reader else \
            np.lib.format._read_array_header(stream, version)
    except Exception:  # noqa: BLE001 - any broken header: np.load names it
        return None
    count = 1
    for d in shape:
        count *= int(d)
    return count * dtype.itemsize


def check_npy(path, what: str) -> None:
    """Refuse a .npy whose declared array exceeds the cap, before reading it."""
    try:
        with open(path, "rb") as f:
            n = npy_nbytes(f)
    except OSError:
        return
    if n is not None:
        check_size(n, what)


def check_npz(path, what: str) -> None:
    """Refuse a .npz (a zip of .npy members) whose members inflate beyond the cap, before inflating any: the zip
    directory's sizes and each member's .npy header (shape x itemsize) are checked."""
    import zipfile

    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, ValueError):
        return  # not a zip: np.load says what it is
    with zf:
        infos = zf.infolist()
        check_size(sum(i.file_size for i in infos), what)
        total = 0
        for info in infos:
            try:
                with zf.open(info) as member:
                    n = npy_nbytes(member)
            except (zipfile.BadZipFile, OSError, ValueError, EOFError, NotImplementedError, RuntimeError):
                continue  # a broken member: np.load says what is wrong
            total += n or 0
            check_size(total, what)


def _bytes(n) -> str:
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


__all__ = ["CAP_VARIABLE", "array_cap", "available_memory", "check_name", "check_npy", "check_npz", "check_size",
           "env_int", "expect", "expect_int", "expect_list_of", "inside", "loads_json", "max_threads", "npy_nbytes",
           "read_json", "read_text"]
