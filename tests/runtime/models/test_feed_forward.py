"""The gated MLP (runtime/models/feed_forward.py): on a CPU a long prefill's rows go through it a
few hundred at a time, with the same result as all at once."""

from types import SimpleNamespace

import pytest
import torch

from radixflow.kernels import cpu as cpu_kernels
from radixflow.kernels.cpu.rows import RowKernels
from radixflow.runtime.models import feed_forward
from radixflow.runtime.models.feed_forward import FeedForward


@pytest.mark.skipif(not cpu_kernels.available(),
                    reason="radixflow's CPU kernels do not run at this level (generic)")
def test_a_long_prefill_goes_through_the_mlp_in_passes(monkeypatch):
    torch.manual_seed(0)
    ff = FeedForward(SimpleNamespace(hidden_size=64, intermediate_size=96, mlp_bias=False))
    ff.rows = RowKernels()
    calls = []
    product = ff.gate_up_proj.forward
    monkeypatch.setattr(ff.gate_up_proj, "forward", lambda x: calls.append(len(x)) or product(x))
    x = torch.randn(2 * feed_forward.ROWS_PER_PASS + 3, 64)
    with torch.no_grad():
        passes = ff(x)
        assert calls == [feed_forward.ROWS_PER_PASS] * 2 + [3]
        monkeypatch.setattr(feed_forward, "ROWS_PER_PASS", len(x))
        calls.clear()
        whole = ff(x)
    assert calls == [len(x)]
    torch.testing.assert_close(passes, whole)
