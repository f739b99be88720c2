"""A strict /generate: every top-level field is served or refused by name, none ignored
(native_fields.SERVED_FIELDS / REFUSED_FIELDS), and priority / cache_salt / routed_dp_rank
reach GenerateReq (native_placement.py). Without a model."""

from __future__ import annotations

import re

import pytest
from helpers.tiny_models import make_tiny_tokenizer

from radixflow.runtime.errors import InvalidRequest
from radixflow.runtime.native_api import parse_generate
from radixflow.runtime.native_fields import REFUSED_FIELDS, SERVED_FIELDS
from radixflow.runtime.native_placement import MAX_CACHE_SALT_CHARS

# SGLang's GenerateReqInput fields (python/sglang/srt/managers/io_struct.py at commit
# 001067f): each must be served or refused here, never ignored.
SGLANG_FIELDS = re.findall(r"\w+", """
rid session_id text input_ids input_embeds image_data video_data audio_data
mm_hashes mm_content_hashes use_audio_in_video video_config sampling_params return_logprob
logprob_start_len top_logprobs_num token_ids_logprob return_sampling_mask
return_text_in_logprobs return_flat_raw_top_logprobs return_flat_raw_top_logprobs_b64 stream
log_metrics return_hidden_states return_routed_experts routed_experts_start_len
return_indexer_topk modalities session_params lora_path lora_id custom_logit_processor
positional_embed_overrides bootstrap_host bootstrap_port bootstrap_room bootstrap_pair_key
decode_tp_size routed_dp_rank data_parallel_rank disagg_prefill_dp_rank kv_router_hint
routing_key conversation_id http_worker_ipc background require_reasoning max_thinking_tokens
priority extra_key no_logs custom_labels return_bytes return_entropy return_prompt_token_ids
external_trace_header received_time need_wait_for_mm_inputs num_items_assigned encoder_urls
max_dynamic_patch min_dynamic_patch image_max_dynamic_patch video_max_dynamic_patch
images_config multi_item_delimiter_indices cache_salt""")


@pytest.fixture(scope="module")
def tok():
    return make_tiny_tokenizer()


def parse(body, tok, **kw):
    return parse_generate({"text": "a", **body}, tok, 64, **kw)


def refused(body, tok, **kw) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as info:
        parse(body, tok, **kw)
    return info.value


def test_every_sglang_field_is_served_or_refused():
    assert set(SERVED_FIELDS).isdisjoint(REFUSED_FIELDS)
    missing = [f for f in SGLANG_FIELDS if f not in SERVED_FIELDS and f not in REFUSED_FIELDS]
    assert missing == []
    assert all(REFUSED_FIELDS.values())  # a reason for each


@pytest.mark.parametrize("field", sorted(REFUSED_FIELDS))
def test_each_refused_field_is_a_400_naming_it_with_its_reason(tok, field):
    err = refused({field: "x"}, tok)
    assert err.param == field and err.message == f"{field} is not supported: " \
        f"{REFUSED_FIELDS[field]}"
    for unset in (None, False, [], ""):  # SGLang's defaults: fine
        parse({field: unset}, tok)


def test_unknown_fields_are_400s_naming_them(tok):
    err = refused({"max_tokens": 5}, tok)  # an OpenAI name, not SGLang's
    assert err.param == "max_tokens" and "unknown field 'max_tokens'" in err.message
    assert refused({"Text": "b"}, tok).param == "Text"


def test_the_no_op_fields_change_nothing(tok):
    plain = parse({}, tok).reqs[0]
    noted = parse({"log_metrics": False, "no_logs": True, "conversation_id": "c1"}, tok).reqs[0]
    assert (noted.input_ids, noted.sampling) == (plain.input_ids, plain.sampling)


def test_priority_needs_the_flag_and_reaches_the_request(tok):
    err = refused({"priority": 3}, tok)
    assert err.param == "priority" and "--enable-priority-scheduling" in err.message
    assert parse({"priority": None}, tok).reqs[0].priority is None
    reqs = parse({"priority": -2, "sampling_params": {"n": 2}}, tok,
                 priority_scheduling=True).reqs
    assert [r.priority for r in reqs] == [-2, -2]
    for bad in ("1", 1.5, True, 1 << 63):
        assert refused({"priority": bad}, tok, priority_scheduling=True).param == "priority"


def test_cache_salt_is_a_bounded_string(tok):
    assert parse({"cache_salt": "tenant-a"}, tok).reqs[0].cache_salt == "tenant-a"
    assert parse({"cache_salt": ""}, tok).reqs[0].cache_salt is None  # SGLang: "" is unset
    assert parse({"cache_salt": "s" * MAX_CACHE_SALT_CHARS}, tok).reqs[0].cache_salt
    err = refused({"cache_salt": "secret" * 200}, tok)
    assert err.param == "cache_salt" and str(MAX_CACHE_SALT_CHARS) in err.message
    assert "secret" not in err.message  # never echoed
    assert refused({"cache_salt": ["a"]}, tok).param == "cache_salt"


def test_routed_dp_rank_and_its_deprecated_name(tok):
    assert parse({"routed_dp_rank": 1}, tok).reqs[0].routed_dp_rank == 1
    assert parse({"data_parallel_rank": 2}, tok).reqs[0].routed_dp_rank == 2
    assert refused({"routed_dp_rank": 1, "data_parallel_rank": 2}, tok).param \
        == "data_parallel_rank"
    for bad in (-1, "0", 0.5):
        assert refused({"routed_dp_rank": bad}, tok).param == "routed_dp_rank"


def test_max_thinking_tokens_is_checked_and_needs_a_reasoning_parser(tok):
    for bad in (-1, "8", True):
        assert refused({"max_thinking_tokens": bad}, tok).param == "max_thinking_tokens"
    err = refused({"max_thinking_tokens": 8, "sampling_params": {"thinking_budget": 9}}, tok)
    assert err.param == "max_thinking_tokens"
    # a budget on a server without --reasoning-parser is a 400, as sampling's own is
    assert "--reasoning-parser" in refused({"max_thinking_tokens": 8}, tok).message


def test_the_first_fault_is_the_field_check(tok):
    err = refused({"lora_path": "x", "sampling_params": {"bogus": 1}}, tok)
    assert err.param == "lora_path"
