"""Tiny random models of the families beyond Llama (Granite, SmolLM3, Phi-3, Gemma 2/3,
the mixture-of-experts families, windowed Mistral and Qwen2),
saved by transformers' own classes, and the check that radixflow.Engine serves them as
transformers computes them (fp32: greedy tokens identical, prompt logprobs within 1e-4)."""

from __future__ import annotations

import torch
import transformers
from helpers.tiny_models import _randomize_, _write_generation_config, make_tiny_tokenizer

from radixflow.runtime.engine import Engine

PROMPTS = ["The quick brown fox", "The cache keeps every prefix that two requests share, so the",
           "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20"]
NEW_TOKENS = 16
COMMON = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
              num_hidden_layers=2, max_position_embeddings=512, rms_norm_eps=1e-5,
              bos_token_id=1, eos_token_id=2, pad_token_id=2, tie_word_embeddings=False)

FAMILIES = {
    # Granite's four multipliers, not 1, and biases on every projection
    "granite": ("GraniteConfig", dict(head_dim=16, embedding_multiplier=3.0,
                                      residual_multiplier=0.5, attention_multiplier=0.1,
                                      logits_scaling=4.0, attention_bias=True, mlp_bias=True)),
    # layer 1 (of 0, 1) without RoPE
    "smollm3": ("SmolLM3Config", dict(no_rope_layer_interval=2, tie_word_embeddings=True)),
    # Phi-4-mini's 0.75: 12 of each head's 16 dims rotate; qkv and gate_up fused
    "phi3": ("Phi3Config", dict(partial_rotary_factor=0.75)),
    # a window of 8 on layer 0 (prompts run past it), soft-capping that bites, 16-dim heads
    "gemma2": ("Gemma2Config", dict(head_dim=16, sliding_window=8, query_pre_attn_scalar=24,
                                    attn_logit_softcapping=2.0, final_logit_softcapping=3.0)),
    # layers 0, 1 local (window 8, base 100), 2 global (base 1e6, linear x2); q/k norms
    "gemma3": ("Gemma3TextConfig", dict(
        head_dim=16, num_hidden_layers=3, sliding_window=8, sliding_window_pattern=3,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
                         "full_attention": {"rope_type": "linear", "factor": 2.0,
                                            "rope_theta": 1e6}})),
    # mixture of experts: 4 experts, top 2; Qwen3-MoE renormalised, layer 1 dense
    "qwen3_moe": ("Qwen3MoeConfig", dict(num_experts=4, num_experts_per_tok=2,
                                         moe_intermediate_size=32, norm_topk_prob=True,
                                         mlp_only_layers=[1], head_dim=16)),
    # layer 0 dense (decoder_sparse_step 2), a sigmoid-gated shared expert, not renormalised
    "qwen2_moe": ("Qwen2MoeConfig", dict(num_experts=4, num_experts_per_tok=2,
                                         moe_intermediate_size=32, decoder_sparse_step=2,
                                         shared_expert_intermediate_size=48)),
    "mixtral": ("MixtralConfig", dict(num_local_experts=4, num_experts_per_tok=2)),
    # q/k norms over the whole projection, clip_qkv that bites
    "olmoe": ("OlmoeConfig", dict(num_experts=4, num_experts_per_tok=2, clip_qkv=0.8)),
    # sliding windows of 8 (prompts and generations run past them): Mistral's on every layer,
    # Qwen2's on the layers from max_window_layers on (layer 1 of 0, 1)
    "mistral": ("MistralConfig", dict(sliding_window=8)),
    "qwen2": ("Qwen2Config", dict(use_sliding_window=True, sliding_window=8,
                                  max_window_layers=1)),
}


def make_family_model(dest, family: str, seed: int = 0, **overrides):
    config_cls, extra = FAMILIES[family]
    tokenizer = make_tiny_tokenizer()
    config = getattr(transformers, config_cls)(
        **{**COMMON, "vocab_size": len(tokenizer), **extra, **overrides})
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    _randomize_(model, seed=seed, std=0.15)
    if config.tie_word_embeddings:
        model.tie_weights()
    model.save_pretrained(dest, safe_serialization=True)
    tokenizer.save_pretrained(dest)
    _write_generation_config(dest, config)
    return dest, model.eval(), tokenizer


def hf_greedy_ids(model, tok, prompts, max_new_tokens: int) -> list[list[int]]:
    """transformers' greedy continuation (token ids) of each prompt, EOS ignored."""
    outs = []
    for p in prompts:
        ids = tok(p, return_tensors="pt").input_ids
        with torch.no_grad():
            gen = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False,
                                 eos_token_id=None, pad_token_id=0,
                                 attention_mask=torch.ones_like(ids))
        outs.append(gen[0, ids.shape[1]:].tolist())
    return outs


def hf_reference(model, tok, prompts, logprob_prompt=PROMPTS[1]):
    """transformers' greedy continuations of `prompts` and the logprob of each token of
    `logprob_prompt` given the ones before it."""
    outs = hf_greedy_ids(model, tok, prompts, NEW_TOKENS)
    ids = tok(logprob_prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        ref = torch.log_softmax(model(ids).logits[0, :-1].float(), -1)
    return outs, ref.gather(1, ids[0, 1:, None]).squeeze(1)


def check_engine_matches(folder, model, tok, prompts=PROMPTS, **engine_args):
    expected, ref_logprobs = hf_reference(model, tok, prompts, prompts[1])
    with Engine(str(folder), dtype="float32", max_total_tokens=2048, chunked_prefill_size=7,
                **engine_args) as engine:
        params = {"max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True}
        assert [r["output_ids"] for r in engine.generate(prompts, params)] == expected
        res = engine.generate(prompts[1], {"max_new_tokens": 0}, return_logprob=True,
                              logprob_start_len=0)
        ours = [e[0] for e in res["meta_info"]["input_token_logprobs"][1:]]
        engine.scheduler.check_slots()
    torch.testing.assert_close(torch.tensor(ours), ref_logprobs, atol=1e-4, rtol=1e-4)




def write_family_gguf(folder, model, dest, arch: str, extra=None, tensor=None, after=None):
    """`model` (saved in `folder`) as an F32 GGUF of llama.cpp's `arch`, with the tiny BPE
    tokenizer: the common metadata, then `extra(writer, config)`; `tensor(hf_name, t)` may
    change a tensor or drop it (None); `after(writer)` adds tensors of its own."""
    import gguf
    from helpers.tiny_models import _add_gguf_tokenizer

    c = model.config
    writer = gguf.GGUFWriter(str(dest), arch)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_context_length(c.max_position_embeddings)
    writer.add_embedding_length(c.hidden_size)
    writer.add_block_count(c.num_hidden_layers)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_head_count(c.num_attention_heads)
    writer.add_head_count_kv(c.num_key_value_heads)
    rope = c.rope_parameters
    # (Gemma 3: per layer type; the file holds the global layers' base)
    writer.add_rope_freq_base(rope.get("rope_theta") or rope["full_attention"]["rope_theta"])
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    writer.add_vocab_size(c.vocab_size)
    if extra is not None:
        extra(writer, c)
    _add_gguf_tokenizer(writer, folder)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], c.num_hidden_layers)
    for hf_name, t in model.state_dict().items():
        t = tensor(hf_name, t) if tensor is not None else t
        if t is not None:
            writer.add_tensor(names.get_name(hf_name, try_suffixes=(".weight", ".bias")),
                              t.numpy().copy())
    if after is not None:
        after(writer)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dest


def llamacpp_permute(t, n_head: int):
    """llama.cpp's converter's q/k row permutation (LlamaModel.permute): each head's rotary
    halves interleaved, as its RoPE takes them."""
    rows = t.shape[0]
    return (t.reshape(n_head, 2, rows // n_head // 2, *t.shape[1:])
            .swapaxes(1, 2).reshape(t.shape))


def write_llamacpp_gguf(folder, model, dest, family: str, experts_qtype=None):
    """`model` as llama.cpp's convert_hf_to_gguf.py writes its family: granite, smollm3 and
    Mixtral (a `llama` file) as LlamaModel does (q/k rows permuted, rope dimension count),
    olmoe as a TextModel (no permutation); Granite's four multipliers as its *_scale keys (and
    no head_dim); the experts stacked as blk.N.ffn_{gate,up,down}_exps with the router as
    ffn_gate_inp; the tied head left out. `experts_qtype` (a gguf.GGMLQuantizationType) stores
    the stacked experts quantized."""
    arch = {"mixtral": "llama"}.get(family, family)
    c = model.config
    head_dim = c.hidden_size // c.num_attention_heads
    experts = {}

    def extra(writer, config):
        if arch != "olmoe":
            writer.add_rope_dimension_count(getattr(config, "head_dim", None) or head_dim)
        if arch != "granite" and getattr(config, "head_dim", None):
            writer.add_key_length(config.head_dim)
            writer.add_value_length(config.head_dim)
        if arch == "granite":
            writer.add_attention_scale(config.attention_multiplier)
            writer.add_embedding_scale(config.embedding_multiplier)
            writer.add_residual_scale(config.residual_multiplier)
            writer.add_logit_scale(config.logits_scaling)
        if family in ("mixtral", "olmoe"):
            writer.add_expert_count(getattr(config, "num_local_experts", None)
                                    or config.num_experts)
            writer.add_expert_used_count(config.num_experts_per_tok)

    def tensor(hf_name, t):
        if hf_name == "lm_head.weight" and c.tie_word_embeddings:
            return None
        if ".mlp.experts." in hf_name:
            experts[hf_name] = t
            return None
        if arch != "olmoe" and ".self_attn.q_proj." in hf_name:
            return llamacpp_permute(t, c.num_attention_heads)
        if arch != "olmoe" and ".self_attn.k_proj." in hf_name:
            return llamacpp_permute(t, c.num_key_value_heads)
        return t

    def add(writer, name, t):
        t = t.numpy().copy()
        if experts_qtype is None:
            writer.add_tensor(name, t)
        else:
            import gguf

            writer.add_tensor(name, gguf.quants.quantize(t, experts_qtype),
                              raw_dtype=experts_qtype)

    def add_experts(writer):
        for name, t in experts.items():
            layer = name.split(".")[2]
            if name.endswith("gate_up_proj"):
                gate, up = t.chunk(2, dim=1)
                add(writer, f"blk.{layer}.ffn_gate_exps.weight", gate)
                add(writer, f"blk.{layer}.ffn_up_exps.weight", up)
            else:
                add(writer, f"blk.{layer}.ffn_down_exps.weight", t)

    return write_family_gguf(folder, model, dest, arch, extra, tensor, add_experts)
