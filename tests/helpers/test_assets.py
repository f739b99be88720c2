"""Real chat templates and tokenizers for tests, from llama.cpp's test assets.

The llama-cpp-python sdist on the package index carries llama.cpp's `models/templates/*.jinja`
(the published chat templates of many models) and `models/ggml-vocab-*.gguf` (vocab-only
GGUF files). It is fetched once with pip, checked by sha256, and only those files are kept,
under <radixflow cache>/test-assets/ (see radixflow.runtime.model_loader.default_cache_dir).

    template("Qwen-Qwen3-0.6B")          # the template's text ("*.jinja" names, no suffix)
    template_path("Qwen3-Coder")         # its file, for --chat-template
    load_tokenizer("qwen3")              # a real tokenizer (TOKENIZERS lists the names)
    tokenizer_dir("llama3")              # its folder (tokenizer.json, tokenizer_config.json)
    tiny_model_dir("qwen3", "qwen3", "Qwen3-Coder")  # a tiny random model on both, cached

A tokenizer is converted from a vocab GGUF once (transformers; 10-20 s) and cached as a
Hugging Face tokenizer folder. The vocab files date from each family's first release, so a
preset renames or adds the special tokens its later models use, at their real ids where the
vocab has room (Qwen2's padding slots, Llama 3's reserved tokens). Pair one with a tiny
random-weight model (tiny_models.make_tiny_model(..., tokenizer=load_tokenizer(name))) to run
a real template and tokenizer through the server in seconds; tiny_model_dir does that once
and caches the folder.

When the package index cannot be reached, every function here skips the calling test with
the reason (pytest.skip); a file whose hash differs is an error, never used.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from radixflow.runtime.model_loader.cache import build_once, default_cache_dir

SDIST_REQUIREMENT = "llama-cpp-python==0.3.36"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
_MODELS = "llama_cpp_python-0.3.36/vendor/llama.cpp/models/"
_PRESETS_VERSION = 1  # bump when a preset changes: its cached folder is rebuilt


@dataclass(frozen=True)
class TokenizerPreset:
    """A tokenizer built from `vocab` (ggml-vocab-<vocab>.gguf): `rename` gives tokens at
    existing ids new contents ({id: (content, special)}), `add` appends special tokens,
    `drop_from` removes added tokens from that id on; bos/eos name the ends."""

    vocab: str
    description: str
    bos: str | None = None
    eos: str | None = None
    rename: dict[int, tuple[str, bool]] = field(default_factory=dict)
    add: tuple[str, ...] = ()
    drop_from: int | None = None


_QWEN_TOKENS = [  # Qwen2.5 / Qwen3's added tokens from id 151646 on, (content, special)
    ("<|object_ref_start|>", True), ("<|object_ref_end|>", True), ("<|box_start|>", True),
    ("<|box_end|>", True), ("<|quad_start|>", True), ("<|quad_end|>", True),
    ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
    ("<|image_pad|>", True), ("<|video_pad|>", True), ("<tool_call>", False),
    ("</tool_call>", False), ("<|fim_prefix|>", False), ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False), ("<|fim_pad|>", False), ("<|repo_name|>", False),
    ("<|file_sep|>", False), ("<tool_response>", False), ("</tool_response>", False),
    ("<think>", False), ("</think>", False)]

TOKENIZERS: dict[str, TokenizerPreset] = {
    "llama3": TokenizerPreset(
        "llama-bpe", "Llama 3.1/3.2 Instruct: Llama 3's BPE with <|eom_id|> (128008) and "
        "<|python_tag|> (128010) named, eos <|eot_id|>",
        bos="<|begin_of_text|>", eos="<|eot_id|>",
        rename={128004: ("<|finetune_right_pad_id|>", True), 128008: ("<|eom_id|>", True),
                128010: ("<|python_tag|>", True)}),
    "qwen3": TokenizerPreset(
        "qwen2", "Qwen2.5 / Qwen3 (and Qwen3-Coder): Qwen2's BPE with the padding slots from "
        "151646 named as in Qwen3 (<tool_call>, <think>, ...), eos <|im_end|>",
        eos="<|im_end|>", rename={151646 + i: t for i, t in enumerate(_QWEN_TOKENS)},
        drop_from=151646 + len(_QWEN_TOKENS)),
    "mistral": TokenizerPreset(
        "llama-spm", "Mistral 7B v0.3 style: the Llama/Mistral 32k SentencePiece vocab with "
        "v0.3's control tokens appended as special tokens (ids 32000-32006, not v0.3's 3-9)",
        bos="<s>", eos="</s>",
        add=("[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
             "[TOOL_RESULTS]", "[/TOOL_RESULTS]")),
}


# ---- the sdist's files ----

def assets_dir() -> Path:
    """The folder holding templates/*.jinja and vocab/ggml-vocab-*.gguf (fetched once)."""
    folder = default_cache_dir() / "test-assets" / SDIST_REQUIREMENT.replace("==", "-")
    return build_once(folder, _fetch_assets)


def template_names() -> list[str]:
    return sorted(p.stem for p in (assets_dir() / "templates").glob("*.jinja"))


def template_path(name: str) -> Path:
    """The file of chat template `name` (e.g. "meta-llama-Llama-3.1-8B-Instruct")."""
    path = assets_dir() / "templates" / f"{name.removesuffix('.jinja')}.jinja"
    if not path.is_file():
        raise KeyError(f"no template {name!r}; there are {', '.join(template_names())}")
    return path


def template(name: str) -> str:
    """The text of chat template `name`."""
    return template_path(name).read_text(encoding="utf-8")


def vocab_gguf(name: str) -> Path:
    """ggml-vocab-<name>.gguf (e.g. "llama-bpe", "qwen2", "llama-spm", "gemma-4")."""
    path = assets_dir() / "vocab" / f"ggml-vocab-{name}.gguf"
    if not path.is_file():
        have = sorted(p.name for p in (assets_dir() / "vocab").glob("*.gguf"))
        raise KeyError(f"no vocab {name!r}; there are {', '.join(have)}")
    return path


def _fetch_assets(tmp: Path) -> dict:
    download = tmp / ".download"
    download.mkdir()
    sdist = _download(download)
    digest = _sha256(sdist)
    if digest != SDIST_SHA256:
        raise RuntimeError(f"{sdist.name} from the package index has sha256 {digest}, "
                           f"expected {SDIST_SHA256}; not used")
    kept = _extract(sdist, tmp)
    shutil.rmtree(download)
    return {"source": SDIST_REQUIREMENT, "sha256": SDIST_SHA256, "files": kept}


def _download(dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
           "--no-input", "--disable-pip-version-check", "--progress-bar", "off",
           "-d", str(dest), SDIST_REQUIREMENT]
    proc = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          timeout=600)
    found = sorted(dest.glob("*.tar.gz"))
    if proc.returncode != 0 or len(found) != 1:
        lines = [ln for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip()]
        pytest.skip(f"test assets unavailable: `pip download {SDIST_REQUIREMENT}` failed "
                    f"({lines[-1] if lines else 'no output'}); the package index is needed "
                    "once, then the files are cached")
    return found[0]


def _extract(sdist: Path, dest: Path) -> int:
    """Copy templates/*.jinja and ggml-vocab-*.gguf out of the sdist; return how many."""
    (dest / "templates").mkdir()
    (dest / "vocab").mkdir()
    kept = 0
    with tarfile.open(sdist, "r:gz") as tar:
        for member in tar:
            name = member.name
            if not member.isfile() or not name.startswith(_MODELS):
                continue
            rest = name[len(_MODELS):]
            if rest.startswith("templates/") and rest.endswith(".jinja"):
                target = dest / "templates" / Path(rest).name
            elif rest.startswith("ggml-vocab-") and rest.endswith(".gguf"):
                target = dest / "vocab" / rest
            else:
                continue
            with tar.extractfile(member) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst, length=1 << 20)
            kept += 1
    return kept


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# ---- tokenizers ----

def tokenizer_dir(name: str) -> Path:
    """A Hugging Face tokenizer folder for preset `name` (see TOKENIZERS), built once."""
    if name not in TOKENIZERS:
        raise KeyError(f"no tokenizer preset {name!r}; there are {', '.join(TOKENIZERS)}")
    preset = TOKENIZERS[name]
    gguf = vocab_gguf(preset.vocab)
    folder = default_cache_dir() / "test-assets" / "tokenizers" / f"{name}-v{_PRESETS_VERSION}"
    return build_once(folder, lambda tmp: _build_tokenizer(preset, gguf, tmp))


def load_tokenizer(name: str, chat_template: str | None = None):
    """A fresh fast tokenizer for preset `name`, with `chat_template` (a template name from
    template_names(), or Jinja text) set if given."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir(name)), local_files_only=True)
    if chat_template is not None:
        is_text = "{%" in chat_template or "{{" in chat_template
        tokenizer.chat_template = chat_template if is_text else template(chat_template)
    return tokenizer


def _build_tokenizer(preset: TokenizerPreset, gguf: Path, tmp: Path) -> dict:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tokenizer.save_pretrained(tmp)
    _edit_tokenizer_json(tmp / "tokenizer.json", preset)
    config_path = tmp / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config.pop("added_tokens_decoder", None)  # tokenizer.json's added_tokens say it
    config.pop("chat_template", None)
    for key, value in (("bos_token", preset.bos), ("eos_token", preset.eos)):
        if value is not None:
            config[key] = value
    config_path.write_text(json.dumps(config, indent=2) + "\n")
    (tmp / "chat_template.jinja").unlink(missing_ok=True)
    return {"preset": preset.description, "vocab": gguf.name}


def _edit_tokenizer_json(path: Path, preset: TokenizerPreset) -> None:
    doc = json.loads(path.read_text())
    vocab: dict[str, int] = doc["model"]["vocab"]
    by_id = {v: k for k, v in vocab.items()} if isinstance(vocab, dict) else {}
    added = []
    for entry in doc["added_tokens"]:
        token_id = entry["id"]
        if preset.drop_from is not None and token_id >= preset.drop_from:
            vocab.pop(by_id.get(token_id), None)
            continue
        if token_id in preset.rename:
            content, special = preset.rename[token_id]
            vocab.pop(entry["content"], None)
            if token_id in by_id:
                vocab[content] = token_id
            entry = {**entry, "content": content, "special": special}
        added.append(entry)
    next_id = max([*vocab.values(), *(e["id"] for e in added)]) + 1
    for content in preset.add:
        added.append({"id": next_id, "content": content, "single_word": False,
                      "lstrip": False, "rstrip": False, "normalized": False, "special": True})
        next_id += 1
    doc["added_tokens"] = added
    path.write_text(json.dumps(doc, ensure_ascii=False))


# ---- tiny random models on a real tokenizer ----

def tiny_model_dir(arch: str, tokenizer: str, chat_template: str | None = None,
                   **config_overrides) -> Path:
    """A tiny random-weight model folder (tiny_models.make_tiny_model) of `arch` with preset
    `tokenizer` and chat template `chat_template` (a template name), built once and cached:
    a vocabulary of 100k+ tokens takes seconds to write. Embeddings are tied unless
    `config_overrides` say otherwise."""
    from helpers.tiny_models import make_tiny_model

    overrides = {"tie_word_embeddings": True, **config_overrides}
    key = json.dumps([arch, tokenizer, chat_template, overrides, _PRESETS_VERSION],
                     sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    folder = default_cache_dir() / "test-assets" / "tiny-models" / f"{arch}-{tokenizer}-{digest}"

    def build(tmp: Path) -> dict:
        make_tiny_model(tmp, arch, tokenizer=load_tokenizer(tokenizer, chat_template),
                        **overrides)
        return {"key": key}

    return build_once(folder, build)
