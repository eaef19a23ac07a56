"""onnxruntime-genai folders as a MODEL: a directory holding ``genai_config.json`` (what onnxruntime-genai's model
builder writes, and the ``*-onnx`` repositories of the Hugging Face hub ship) -> the model file, its tokenizer and
what generation needs from the config (eos / bos / pad ids, the input and KV-cache names, ``context_length``).

Every problem is one line (:class:`onnx_lrp.core.errors.InputError`): a folder without ``genai_config.json`` or
without a ``tokenizer.json``, a config that is not JSON or lacks ``model.decoder.filename``, a config naming a
file that is not in the folder, a prompt longer than ``context_length`` (:meth:`GenaiFolder.check_length`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..core.errors import InputError
from ..core.validate import expect, expect_int, inside, read_json

CONFIG = "genai_config.json"
TOKENIZER = "tokenizer.json"


@dataclass(frozen=True)
class GenaiFolder:
    """What a genai folder says: the decoder's model file, the tokenizer.json beside it, the token ids that end
    (``eos``), start and pad a sequence, the decoder's input names (``inputs``: ``input_ids``, ``attention_mask``,
    ``position_ids``, ``past_key_names`` (a pattern with ``%d``), ...), its KV-cache sizes (``kv_heads``,
    ``head_size``, ``layers``; None where the config does not say) and ``context_length``."""

    folder: Path
    model: Path
    tokenizer: Path
    eos: tuple = ()
    bos: int | None = None
    pad: int | None = None
    inputs: dict = field(default_factory=dict)
    outputs: dict = field(default_factory=dict)
    kv_heads: int | None = None
    head_size: int | None = None
    layers: int | None = None
    context_length: int | None = None
    model_type: str = ""

    def check_length(self, n_tokens: int, what: str = "the prompt") -> None:
        """Refuse (one line) ``n_tokens`` beyond the folder's ``context_length``."""
        if self.context_length is not None and n_tokens > self.context_length:
            raise InputError(f"{what} needs {n_tokens} tokens, more than the model's context_length "
                             f"{self.context_length} ({self.folder / CONFIG}); shorten it by "
                             f"{n_tokens - self.context_length} token(s)")


def is_genai_folder(path) -> bool:
    """A directory holding genai_config.json."""
    try:
        return Path(path).is_dir() and (Path(path) / CONFIG).is_file()
    except (TypeError, OSError):
        return False


def config_beside(model_file) -> "GenaiFolder | None":
    """The genai folder a model file sits in (its genai_config.json names this file), or None."""
    try:
        p = Path(model_file)
    except TypeError:
        return None
    if not is_genai_folder(p.parent):
        return None
    folder = read_folder(p.parent, tokenizer=False)
    return folder if folder.model.resolve() == p.resolve() else None


def check_model_length(model_file, n_tokens: int, what: str = "the text") -> None:
    """Refuse ``n_tokens`` beyond the context_length of the genai folder ``model_file`` sits in (nothing to check
    for a model outside one)."""
    folder = config_beside(model_file)
    if folder is not None:
        folder.check_length(n_tokens, what)


def eos_beside(model_file) -> tuple:
    """The end-of-sequence ids a Hugging Face export folder gives beside ``model_file`` (``eos_token_id`` of its
    generation_config.json, else of its config.json; an id or a list), or ()."""
    folder = Path(model_file).parent
    for name in ("generation_config.json", "config.json"):
        p = folder / name
        if p.is_file():
            config = read_json(p, str(p), "fix it or move it away")
            if isinstance(config, dict) and config.get("eos_token_id") is not None:
                return tuple(expect_int(v, f"{p}: eos_token_id", lo=0) for v in _as_list(config["eos_token_id"]))
    return ()


def _as_list(value) -> list:
    return value if isinstance(value, list) else [value]


def model_file(folder) -> "Path | None":
    """The model file of an onnxruntime-genai folder (None for a folder without genai_config.json): a finder of
    export folders (``onnx_lrp.io.model_folder.FINDERS``). The tokenizer is not required here (``inspect`` needs
    none); a config naming a missing file or a file outside the folder is refused in one line."""
    return read_folder(folder, tokenizer=False).model if is_genai_folder(folder) else None


def read_folder(path, tokenizer: bool = True) -> GenaiFolder:
    """The folder's :class:`GenaiFolder`; one-line InputError for what is missing or wrong (``tokenizer``: a
    folder without tokenizer.json too)."""
    folder = Path(path)
    if not folder.is_dir():
        raise InputError(f"{folder} is not a folder; give an onnxruntime-genai model folder (with {CONFIG})")
    cfg_path = folder / CONFIG
    if not cfg_path.is_file():
        raise InputError(f"{folder} has no {CONFIG}; give an onnxruntime-genai model folder, or the .onnx file itself")
    where = str(cfg_path)
    config = expect(read_json(cfg_path, where, "fix it or rebuild the folder"), dict, where)
    model = expect(config.get("model"), dict, f"{where}: model", "the builder writes a 'model' section")
    decoder = expect(model.get("decoder"), dict, f"{where}: model.decoder", "the builder writes a decoder section")
    name = decoder.get("filename")
    if name is None:
        raise InputError(f"{where}: model.decoder.filename is missing; it names the model's .onnx file")
    model_file = inside(folder, name, f"{where}: model.decoder.filename")
    if not model_file.is_file():
        raise InputError(f"{where} names the model file {name!r}, which is not in {folder}; copy it there or fix "
                         "model.decoder.filename")
    tok_file = folder / TOKENIZER
    if tokenizer and not tok_file.is_file():
        raise InputError(f"{folder} has no {TOKENIZER}: generation and --text need the model's tokenizer; copy the "
                         f"tokenizer.json of the model the folder was built from into it")
    return GenaiFolder(
        folder=folder, model=model_file, tokenizer=tok_file, eos=_ids(model.get("eos_token_id"), where, "eos_token_id"),
        bos=_one_id(model.get("bos_token_id"), where, "bos_token_id"),
        pad=_one_id(model.get("pad_token_id"), where, "pad_token_id"),
        inputs=_names(decoder.get("inputs"), where, "model.decoder.inputs"),
        outputs=_names(decoder.get("outputs"), where, "model.decoder.outputs"),
        kv_heads=_opt_int(decoder.get("num_key_value_heads"), where, "num_key_value_heads"),
        head_size=_opt_int(decoder.get("head_size"), where, "head_size"),
        layers=_opt_int(decoder.get("num_hidden_layers"), where, "num_hidden_layers"),
        context_length=_opt_int(model.get("context_length"), where, "context_length"),
        model_type=str(model.get("type", "")))


def _ids(value, where: str, key: str) -> tuple:
    if value is None:
        return ()
    return tuple(expect_int(v, f"{where}: model.{key}", lo=0) for v in _as_list(value))


def _one_id(value, where: str, key: str) -> int | None:
    ids = _ids(value, where, key)
    return ids[0] if ids else None


def _opt_int(value, where: str, key: str) -> int | None:
    return None if value is None else expect_int(value, f"{where}: {key}", lo=1)


def _names(value, where: str, key: str) -> dict:
    if value is None:
        return {}
    names = expect(value, dict, f"{where}: {key}")
    for k, v in names.items():
        expect(v, str, f"{where}: {key}.{k}")
    return dict(names)


__all__ = ["CONFIG", "GenaiFolder", "config_beside", "check_model_length", "eos_beside", "is_genai_folder", "model_file", "read_folder"]
