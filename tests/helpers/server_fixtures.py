"""One real `radixflow serve` (tiny random model) shared by the tests of the server, the router
and the benchmarks (a plugin of tests/conftest.py, so the whole session starts it once)."""

from __future__ import annotations

import pytest
from helpers.live_server import descendants, wait_gone
from helpers.tiny_models import make_tiny_model

from radixflow.runtime.server.process import ServerProcess

KV_POOL_TOKENS = 4096
# Long enough that a 4000-token request is still running when its client hangs up.
CONTEXT = 4096


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("server-tiny"), "llama",
                           max_position_embeddings=CONTEXT)


@pytest.fixture(scope="session")
def server(tiny_model_dir):
    rt = ServerProcess(str(tiny_model_dir), max_total_tokens=KV_POOL_TOKENS,
                       max_running_requests=16, served_model_name="tiny", log_level="warning",
                       start_timeout=300)
    children = descendants(rt.proc.pid)
    yield rt
    code = rt.shutdown()
    # SIGTERM is a clean shutdown: exit code 0 and every child process gone.
    assert code == 0, f"server exited with {code}"
    assert not wait_gone(children), "child processes outlived the server"


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir):
    from radixflow.runtime.model_loader import load_tokenizer

    return load_tokenizer(tiny_model_dir)


@pytest.fixture(scope="session")
def client(server):
    import openai

    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0,
                         timeout=120)
