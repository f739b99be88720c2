"""bench.quality_files: what a GGUF's quantization costs against its bf16 file, scored as
llama-perplexity --kl-divergence scores it (chunks, second halves), and llama.cpp's own
figures read from its log."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.append(str(Path(__file__).resolve().parents[2]))  # the root holds bench/

from bench.quality_files import chunks_of, parse_kld_log, radixflow_costs  # noqa: E402

# the tail of `llama-perplexity --kl-divergence` (llama.cpp 0c1e570's format)
LOG = """
kl_divergence: computing over 4 chunks, n_ctx=512, batch_size=512, n_seq=1
====== Perplexity statistics ======
Mean PPL(Q)                   : 49230.122043 ±  12.407335
Mean PPL(base)                : 49155.315718 ±  12.383544
Cor(ln(PPL(Q)), ln(PPL(base))):  99.94%
Mean ln(PPL(Q)/PPL(base))     :   0.001521 ±   0.000310

====== KL divergence statistics ======
Mean    KLD:   0.004182 ±   0.000040
Maximum KLD:   0.014823

====== Token probability statistics ======
Same top p: 87.451 ± 1.038 %
"""


def test_llama_perplexity_log_is_read():
    cost = parse_kld_log(LOG)
    assert (cost.kld, cost.top1, cost.ln_ppl_ratio) == pytest.approx((0.004182, 0.87451, 0.001521))
    assert cost.tokens == 4 * 255  # the second half of each 512-token chunk, less its last


def test_a_log_without_figures_is_an_error():
    with pytest.raises(RuntimeError, match="no 'kld' figure"):
        parse_kld_log("error: failed to load model")


def test_chunks_start_with_bos_and_need_a_whole_chunk():
    assert chunks_of(list(range(10)), 4, bos=99) == [[99, 1, 2, 3], [99, 5, 6, 7]]
    assert chunks_of(list(range(10)), 4, bos=None)[1] == [4, 5, 6, 7]
    with pytest.raises(SystemExit, match="needs at least"):
        chunks_of([1, 2], 4, bos=None)


def test_a_file_costs_nothing_against_itself_and_4bit_costs_something(tmp_path):
    import gguf
    from helpers.tiny_models import make_tiny_model, write_tiny_gguf

    from radixflow.kernels import cpu as cpu_kernels

    if not cpu_kernels.available():
        pytest.skip("no C kernels here")
    hf = make_tiny_model(tmp_path / "hf", "llama")

    def qtype(kind):
        return lambda name: None if "norm" in name else kind

    kinds = gguf.GGMLQuantizationType
    ref = write_tiny_gguf(hf, tmp_path / "bf16.gguf", qtype_of=qtype(kinds.BF16))
    q4 = write_tiny_gguf(hf, tmp_path / "q4.gguf", qtype_of=qtype(kinds.Q4_0))
    text = (Path(__file__).resolve().parents[2] / "docs" / "dsl.md").read_text()[:600]
    costs, n_tokens = radixflow_costs([str(ref), str(q4)], str(ref), text, 64, None)
    same, quantized = costs[str(ref)], costs[str(q4)]
    assert same.tokens == quantized.tokens == (n_tokens // 64) * 31
    assert same.kld == 0 and same.top1 == 1 and same.ln_ppl_ratio == 0
    assert quantized.kld > 1e-4 and quantized.top1 < 1


def test_scoring_the_chunks_as_one_batch(tmp_path):
    """--together: the chunks side by side in one decode batch (x as int8 from 3 rows at
    avx512): the bf16 file scores as it does alone, the 4-bit one within twice its cost alone."""
    import gguf
    from helpers.tiny_models import make_tiny_model, write_tiny_gguf

    from radixflow.kernels import cpu as cpu_kernels

    if not cpu_kernels.available():
        pytest.skip("no C kernels here")
    hf = make_tiny_model(tmp_path / "hf", "llama")
    kinds = gguf.GGMLQuantizationType
    ref = write_tiny_gguf(hf, tmp_path / "bf16.gguf",
                          qtype_of=lambda n: None if "norm" in n else kinds.BF16)
    q4 = write_tiny_gguf(hf, tmp_path / "q4.gguf",
                         qtype_of=lambda n: None if "norm" in n else kinds.Q4_0)
    text = (Path(__file__).resolve().parents[2] / "docs" / "dsl.md").read_text()[:600]
    alone, n_tokens = radixflow_costs([str(ref), str(q4)], str(ref), text, 32, None)
    together, _ = radixflow_costs([str(ref), str(q4)], str(ref), text, 32, None, together=True)
    assert n_tokens // 32 >= 3  # a batch the int8 split applies to
    assert together[str(ref)].kld < 1e-4 and together[str(ref)].tokens == alone[str(ref)].tokens
    assert 0 < together[str(q4)].kld < 2 * alone[str(q4)].kld + 1e-3
