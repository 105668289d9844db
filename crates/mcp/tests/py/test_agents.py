"""Agents built with real frameworks, connected to `tidegate-mcp` as to any MCP server, with no
Tidegate code in the agent: Pydantic AI (its scripted FunctionModel) and the OpenAI Agents SDK
(a scripted Model). No network: the models are scripts; the tools, the gateway and the upstream
(server-memory from npm) are real. Ground truth: server-memory's own file."""

import json

import pytest

from conftest import MEMORY_RULES, HttpGateway, memory_upstream, read_memory, write_policy

pytestmark = pytest.mark.anyio

CREATE = {"entities": [{"name": "Ann", "entityType": "person", "observations": ["met at the fair"]}]}
OBSERVE = {"observations": [{"entityName": "Ann", "contents": ["likes tea"]}]}


def script(finish_with):
    """The calls the scripted model makes, one per model turn, then its final answer."""
    return [("create_entities", CREATE), ("add_observations", OBSERVE), (finish_with, {})]


@pytest.fixture
def memory_gateway(workdir):
    mem = workdir / "memory.jsonl"
    gw = HttpGateway(write_policy(workdir, memory_upstream(mem) + MEMORY_RULES))
    try:
        yield gw, mem
    finally:
        gw.stop()


@pytest.mark.parametrize("finish", ["tidegate_commit", "tidegate_abort"])
async def test_a_pydantic_ai_agent(memory_gateway, finish):
    from pydantic_ai import Agent
    from pydantic_ai.mcp import MCPToolset
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    gw, mem = memory_gateway
    steps = script(finish)
    seen = []

    def model(messages, info: AgentInfo) -> ModelResponse:
        for m in messages:
            for p in getattr(m, "parts", []):
                if isinstance(p, ToolReturnPart) and p not in seen:
                    seen.append(p)
        names = {t.name for t in info.function_tools}
        assert {"create_entities", "add_observations", "tidegate_commit"} <= names
        n = len(seen)
        if n < len(steps):
            tool, args = steps[n]
            return ModelResponse(parts=[ToolCallPart(tool, args)])
        return ModelResponse(parts=[TextPart("done")])

    agent = Agent(FunctionModel(model), toolsets=[MCPToolset(gw.url)])
    async with agent:
        result = await agent.run("Remember that Ann likes tea.")
    assert result.output == "done"
    replies = [str(p.content) for p in seen]
    assert "queued" in replies[1], replies
    if finish == "tidegate_commit":
        assert read_memory(mem) == {"Ann": ["met at the fair", "likes tea"]}
    else:
        assert read_memory(mem) == {}, "the abort undid the create and dropped the held call"


class ScriptedModel:
    """An OpenAI Agents SDK model that makes the scripted calls, one per model turn."""

    def __new__(cls, steps, seen):
        from agents.items import ModelResponse
        from agents.models.interface import Model
        from agents.usage import Usage
        from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

        class _Model(Model):
            async def get_response(self, system_instructions, input, model_settings, tools, output_schema,
                                   handoffs, tracing, **kwargs):
                outputs = [i for i in (input if isinstance(input, list) else [])
                           if isinstance(i, dict) and i.get("type") == "function_call_output"]
                seen[:] = outputs
                names = {t.name for t in tools}
                assert {"create_entities", "add_observations", "tidegate_commit"} <= names
                n = len(outputs)
                if n < len(steps):
                    tool, args = steps[n]
                    item = ResponseFunctionToolCall(type="function_call", call_id=f"call-{n}", name=tool,
                                                    arguments=json.dumps(args), id=f"fc-{n}", status="completed")
                else:
                    item = ResponseOutputMessage(id="msg", type="message", role="assistant", status="completed",
                                                 content=[ResponseOutputText(type="output_text", text="done",
                                                                             annotations=[])])
                return ModelResponse(output=[item], usage=Usage(), response_id=None)

            def stream_response(self, *a, **k):
                raise NotImplementedError

        return _Model()


@pytest.mark.parametrize("finish", ["tidegate_commit", "tidegate_abort"])
async def test_an_openai_agents_sdk_agent(memory_gateway, finish):
    from agents import Agent, Runner, set_tracing_disabled
    from agents.mcp import MCPServerStreamableHttp

    set_tracing_disabled(True)
    gw, mem = memory_gateway
    seen = []
    async with MCPServerStreamableHttp(params={"url": gw.url}, cache_tools_list=True) as server:
        agent = Agent(name="assistant", instructions="Use the tools.", model=ScriptedModel(script(finish), seen),
                      mcp_servers=[server])
        result = await Runner.run(agent, "Remember that Ann likes tea.")
    assert result.final_output == "done"
    assert "queued" in str(seen[1]["output"]), seen
    if finish == "tidegate_commit":
        assert read_memory(mem) == {"Ann": ["met at the fair", "likes tea"]}
    else:
        assert read_memory(mem) == {}
