"""The OpenAI Agents SDK's default model (OpenAIResponsesModel, /v1/responses) runs an agent
with one function tool to its end against the live tiny-model server, plain and streamed.

tool_choice "required" makes the tiny model call the tool first (the SDK resets it to auto
after a call); the tool must have been called with arguments its schema allows."""

from __future__ import annotations

import asyncio
from typing import Literal

import pytest

agents = pytest.importorskip("agents")


def _agent(server, calls: list[dict]):
    from openai import AsyncOpenAI

    agents.set_tracing_disabled(True)

    @agents.function_tool
    def get_weather(city: Literal["Paris", "Oslo"], unit: Literal["C", "F"]) -> str:
        """The weather in a city now."""
        calls.append({"city": city, "unit": unit})
        return f"9 degrees {unit} in {city}"

    client = AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0,
                         timeout=120)
    model = agents.OpenAIResponsesModel(model="tiny", openai_client=client)
    settings = agents.ModelSettings(tool_choice="required", max_tokens=128, temperature=0)
    return agents.Agent(name="weather", instructions="Answer with the weather tool.",
                        tools=[get_weather], model=model, model_settings=settings)


def _check(result, calls: list[dict]) -> None:
    assert calls, "the tool was never called"
    for call in calls:
        assert call["city"] in ("Paris", "Oslo") and call["unit"] in ("C", "F")
    kinds = [item.type for item in result.new_items]
    assert kinds[:2] == ["tool_call_item", "tool_call_output_item"]
    assert kinds[-1] == "message_output_item"  # it ended with an answer
    assert isinstance(result.final_output, str)


def test_agent_runs_a_tool_to_its_end(server):
    calls: list[dict] = []
    agent = _agent(server, calls)
    result = asyncio.run(agents.Runner.run(agent, "Weather in Paris?", max_turns=6))
    _check(result, calls)


def test_agent_streamed(server):
    calls: list[dict] = []
    agent = _agent(server, calls)

    async def run():
        result = agents.Runner.run_streamed(agent, "Weather in Oslo?", max_turns=6)
        kinds = [event.type async for event in result.stream_events()]
        return result, kinds

    result, kinds = asyncio.run(run())
    assert "raw_response_event" in kinds and "run_item_stream_event" in kinds
    _check(result, calls)
