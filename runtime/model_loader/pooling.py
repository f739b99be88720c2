"""How an embedding model pools its final hidden states, read from its folder once at start-up.

A sentence-transformers folder says it in `modules.json` (the module list) and its Pooling
module's `config.json` (`1_Pooling/config.json`): `pooling_mode_lasttoken`,
`pooling_mode_mean_tokens` or `pooling_mode_cls_token`; a `Normalize` module after it means
the vector is L2-normalised. A folder without `modules.json` is pooled as Qwen3-Embedding and
the e5-mistral family are: the last token's hidden state, normalised.

Modules radixflow cannot run (Dense projections, max or weighted pooling, a Pooling that
drops the prompt) are refused at start-up, naming the file, rather than served wrong.

`mismatch` says why a request cannot run on a server of the other kind (the HTTP side and the
scheduler refuse alike; nothing here loads torch).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

POOLING_MODES = {  # 1_Pooling/config.json key -> EmbedSpec.pooling
    "pooling_mode_lasttoken": "last",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
}
UNSUPPORTED_MODES = ("pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens",
                     "pooling_mode_weightedmean_tokens")
_ST = "sentence_transformers.models."
HARMLESS_MODULES = {_ST + "Transformer"}  # the model itself


@dataclass(frozen=True)
class PoolingConfig:
    pooling: str = "last"  # "last" | "mean" | "cls"
    normalize: bool = True
    source: str = "default (no modules.json): last token, normalised"

    def describe(self) -> str:
        return (f"{self.pooling} pooling, {'normalised' if self.normalize else 'not normalised'}"
                f" ({self.source})")


def read_pooling(folder: str | Path) -> PoolingConfig:
    """The folder's pooling; ValueError for a sentence-transformers pipeline radixflow cannot
    reproduce."""
    folder = Path(folder)
    modules_path = folder / "modules.json"
    if not modules_path.is_file():
        return PoolingConfig()
    modules = _read_json(modules_path)
    if not isinstance(modules, list):
        raise ValueError(f"{modules_path}: expected a list of modules")
    pooling, normalize = None, False
    for module in modules:
        kind = str(module.get("type", "")) if isinstance(module, dict) else ""
        if kind == _ST + "Pooling":
            if pooling is not None or normalize:
                raise ValueError(f"{modules_path}: a second Pooling module, or one after "
                                 "Normalize, is not supported")
            pooling = _pooling_mode(folder / str(module.get("path", "")) / "config.json")
        elif kind == _ST + "Normalize":
            normalize = True
        elif kind not in HARMLESS_MODULES:
            raise ValueError(f"{modules_path}: the module {kind or module!r} is not supported "
                             "(radixflow pools the model's last hidden states, then may "
                             "normalise; nothing else)")
    if pooling is None:
        raise ValueError(f"{modules_path}: no sentence_transformers Pooling module")
    return PoolingConfig(pooling, normalize, source=str(modules_path))


def _pooling_mode(config_path: Path) -> str:
    config = _read_json(config_path)
    if not isinstance(config, dict):
        raise ValueError(f"{config_path}: expected a JSON object")
    if config.get("include_prompt", True) is False:
        raise ValueError(f"{config_path}: include_prompt false is not supported")
    on = [key for key in (*POOLING_MODES, *UNSUPPORTED_MODES) if config.get(key)]
    if len(on) != 1 or on[0] not in POOLING_MODES:
        raise ValueError(f"{config_path}: exactly one of {', '.join(POOLING_MODES)} must be "
                         f"true (found {', '.join(on) or 'none'})")
    return POOLING_MODES[on[0]]


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from None


GENERATION_ON_EMBEDDING_SERVER = (
    "this server serves embeddings (--is-embedding): use /v1/embeddings or /encode; "
    "generation needs a server started without --is-embedding")
EMBEDDING_ON_GENERATION_SERVER = (
    "embeddings need a server started with --is-embedding (this one serves generations)")


def mismatch(is_embed_request: bool, embedding_server: bool) -> str | None:
    """Why a request cannot run on this kind of server, or None."""
    if is_embed_request == embedding_server:
        return None
    return EMBEDDING_ON_GENERATION_SERVER if is_embed_request else GENERATION_ON_EMBEDDING_SERVER
