"""The model's sampling defaults: read from generation_config.json and a GGUF's
general.sampling.* metadata, applied by SamplingParams.from_dict, chosen by --sampling-defaults
(vLLM's --generation-config), and in force through an Engine."""

from __future__ import annotations

import json
import logging

import pytest
from helpers.tiny_models import make_tiny_model

from radixflow.runtime.model_loader.cache import MARKER
from radixflow.runtime.model_loader.generation_defaults import (
    MODEL_INFO_KEY,
    constant_defaults,
    read_gguf_metadata,
    sampling_defaults,
)
from radixflow.runtime.sampling_params import SamplingParams
from radixflow.runtime.server_args import ServerArgs
from radixflow.runtime.server_flags import MODELS_EPILOG

CONSTANTS = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0,
             "repetition_penalty": 1.0}
QWEN3 = {"do_sample": True, "temperature": 0.6, "top_p": 0.95, "top_k": 20,
         "eos_token_id": [151645, 151643], "transformers_version": "4.51.0"}


def folder_with(tmp_path, gen_config):
    (tmp_path / "generation_config.json").write_text(json.dumps(gen_config))
    return tmp_path


def test_constants_are_sampling_params_own_defaults():
    assert constant_defaults() == CONSTANTS
    params = SamplingParams()
    assert all(getattr(params, k) == v for k, v in CONSTANTS.items())


def test_generation_config_sets_what_it_names(tmp_path):
    folder = folder_with(tmp_path, QWEN3)
    assert sampling_defaults(folder, "model") == {**CONSTANTS, "temperature": 0.6,
                                                  "top_p": 0.95, "top_k": 20}
    assert sampling_defaults(folder, "openai") == CONSTANTS
    assert sampling_defaults(None, "model") == CONSTANTS
    assert sampling_defaults(tmp_path / "nowhere", "model") == CONSTANTS
    with pytest.raises(ValueError, match="sampling-defaults"):
        sampling_defaults(folder, "vllm")


def test_hf_spellings_nulls_and_bad_values(tmp_path, caplog):
    folder = folder_with(tmp_path, {"top_k": 0, "temperature": None, "top_p": 0.0,
                                    "min_p": 0.1, "repetition_penalty": 1.05})
    with caplog.at_level(logging.WARNING):
        defaults = sampling_defaults(folder)
    # top_k 0 is HF's "off"; a null is unset; top_p 0 is out of range: dropped with a warning
    assert defaults == {**CONSTANTS, "top_k": -1, "min_p": 0.1, "repetition_penalty": 1.05}
    assert "top_p" in caplog.text and "ignoring" in caplog.text


def write_gguf(path, **sampling):
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny")
    writer.add_token_list(["<s>", "</s>", "hello", "world"])  # arrays are skipped over
    writer.add_token_scores([0.0, 0.0, -1.0, -2.0])
    writer.add_context_length(128)
    for key, value in sampling.items():
        name = f"general.sampling.{key}"
        if isinstance(value, int):
            writer.add_int32(name, value)
        else:
            writer.add_float32(name, value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_gguf_sampling_metadata_of_a_converted_folder(tmp_path):
    gguf_path = write_gguf(tmp_path / "tiny.gguf", temp=0.7, top_k=40, top_p=0.9, min_p=0.05,
                           penalty_repeat=1.1)
    assert read_gguf_metadata(gguf_path, {"general.sampling.temp", "llama.context_length"}) \
        == {"general.sampling.temp": 0.7, "llama.context_length": 128}
    folder = tmp_path / "converted"
    folder.mkdir()
    (folder / "generation_config.json").write_text(json.dumps({"temperature": 0.3,
                                                               "top_k": 5}))
    (folder / MARKER).write_text(json.dumps({"source": str(gguf_path)}))
    # the GGUF's metadata wins over the converted folder's generation_config.json
    assert sampling_defaults(folder) == {"temperature": 0.7, "top_p": 0.9, "top_k": 40,
                                         "min_p": 0.05, "repetition_penalty": 1.1}
    gguf_path.unlink()  # gone since the conversion: the folder's file alone
    assert sampling_defaults(folder) == {**CONSTANTS, "temperature": 0.3, "top_k": 5}


def test_a_file_that_is_not_gguf_reads_as_no_metadata(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGML" + bytes(20))
    assert read_gguf_metadata(bad, {"general.sampling.temp"}) == {}


def test_from_dict_defaults_fill_only_what_is_unset():
    model = {"temperature": 0.6, "top_p": 0.95, "top_k": 20}
    params = SamplingParams.from_dict({"temperature": 0.0, "top_k": None}, model)
    assert (params.temperature, params.top_p, params.top_k) == (0.0, 0.95, 20)
    assert params.is_greedy  # the request's temperature 0 wins: greedy
    assert SamplingParams.from_dict(None, model).top_k == 20
    assert SamplingParams.from_dict({}, None).temperature == 1.0


def parse(*argv):
    import argparse

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    return parser, ServerArgs.from_cli_args(parser.parse_args(list(argv)))


def test_flags_and_vllms_alias():
    assert parse()[1].sampling_defaults == "model"
    assert parse("--sampling-defaults", "openai")[1].sampling_defaults == "openai"
    assert parse("--generation-config", "vllm")[1].sampling_defaults == "openai"
    assert parse("--generation-config", "auto")[1].sampling_defaults == "model"
    with pytest.raises(ValueError, match="contradicts"):
        parse("--generation-config", "auto", "--sampling-defaults", "openai")
    with pytest.raises(ValueError, match="sampling-defaults"):
        ServerArgs(sampling_defaults="greedy")
    parser = parse()[0]
    assert parser.epilog == MODELS_EPILOG and "docs/models.md" in parser.format_help()


def test_engine_takes_the_models_defaults(tmp_path):
    import radixflow

    folder = make_tiny_model(tmp_path / "m", "llama")
    gen = json.loads((folder / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(json.dumps({**gen, "temperature": 0.0,
                                                               "top_k": 1}))
    body = {"max_new_tokens": 12, "ignore_eos": True}
    with radixflow.Engine(str(folder), dtype="float32", max_total_tokens=512,
                          max_running_requests=4) as engine:
        assert engine.model_info[MODEL_INFO_KEY] == {**CONSTANTS, "temperature": 0.0,
                                                     "top_k": 1}
        # greedy by the model's defaults: every seed writes the same text
        texts = {engine.generate("Once upon", {**body, "seed": s})["text"] for s in (1, 2, 3)}
        greedy = engine.generate("Once upon", {**body, "temperature": 0})["text"]
        assert texts == {greedy}
        # a request's own values win: sampling at temperature 1 differs between seeds
        own = {**body, "temperature": 1.0, "top_k": -1}
        sampled = {engine.generate("Once upon", {**own, "seed": s})["text"] for s in (1, 2, 3)}
        assert len(sampled) > 1
