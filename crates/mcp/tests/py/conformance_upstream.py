"""An upstream that implements what the MCP conformance suite's server scenarios ask for
(`@modelcontextprotocol/conformance`), so that the suite can be run against the gateway in
front of it (scripts/mcp-conformance.sh): every scenario then exercises the gateway's
pass-through, not this server alone. Built on the official Python SDK, over stdio."""

import asyncio
import base64

import mcp_types as t
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.prompts.base import UserMessage

server = MCPServer("conformance-upstream")

# A 1x1 PNG and a tiny WAV.
PNG = base64.b64encode(
    bytes.fromhex(
        "89504e470d0a1a0a0000000d4948445200000001000000010802000000907753de"
        "0000000c4944415408d763f8cfc000000301010018dd8db00000000049454e44ae426082"
    )
).decode()
WAV = base64.b64encode(b"RIFF$\x00\x00\x00WAVEfmt \x10\x00\x00\x00\x01\x00\x01\x00D\xac\x00\x00\x88X\x01\x00\x02\x00\x10\x00data\x00\x00\x00\x00").decode()


@server.tool()
def test_simple_text() -> t.CallToolResult:
    """Returns simple text."""
    return t.CallToolResult(content=[t.TextContent(type="text", text="This is a simple text response for testing.")])


@server.tool()
def test_image_content() -> t.CallToolResult:
    """Returns an image."""
    return t.CallToolResult(content=[t.ImageContent(type="image", data=PNG, mime_type="image/png")])


@server.tool()
def test_audio_content() -> t.CallToolResult:
    """Returns audio."""
    return t.CallToolResult(content=[t.AudioContent(type="audio", data=WAV, mime_type="audio/wav")])


@server.tool()
def test_embedded_resource() -> t.CallToolResult:
    """Returns an embedded resource."""
    res = t.TextResourceContents(uri="test://embedded-resource", mime_type="text/plain",
                                 text="This is an embedded resource content.")
    return t.CallToolResult(content=[t.EmbeddedResource(type="resource", resource=res)])


@server.tool()
def test_multiple_content_types() -> t.CallToolResult:
    """Returns text, an image and a resource."""
    res = t.TextResourceContents(uri="test://mixed-content-resource", mime_type="application/json",
                                 text='{"test":"data","value":123}')
    return t.CallToolResult(content=[
        t.TextContent(type="text", text="Multiple content types test:"),
        t.ImageContent(type="image", data=PNG, mime_type="image/png"),
        t.EmbeddedResource(type="resource", resource=res),
    ])


@server.tool()
def test_error_handling() -> str:
    """Always fails."""
    raise ToolError("This tool intentionally returns an error for testing")


@server.tool()
async def test_tool_with_logging(ctx: Context) -> str:
    """Logs three messages."""
    await ctx.info("Tool execution started")
    await asyncio.sleep(0.05)
    await ctx.info("Tool processing data")
    await asyncio.sleep(0.05)
    await ctx.info("Tool execution completed")
    return "Tool with logging executed successfully"


@server.tool()
async def test_tool_with_progress(ctx: Context) -> str:
    """Reports progress 0, 50, 100."""
    for p in (0, 50, 100):
        await ctx.report_progress(p, 100)
        await asyncio.sleep(0.05)
    return "Tool with progress executed successfully"


@server.tool()
async def test_sampling(prompt: str, ctx: Context) -> str:
    """Asks the client's model (sampling/createMessage) and returns what it said."""
    answer = await ctx.session.create_message(
        [t.SamplingMessage(role="user", content=t.TextContent(type="text", text=prompt))], max_tokens=100
    )
    content = answer.content
    said = getattr(content, "text", None) or str(content)
    return f"LLM response: {said}"


@server.tool()
async def test_elicitation(message: str, ctx: Context) -> str:
    """Asks the user (elicitation/create) for a username and an email."""
    schema = {
        "type": "object",
        "properties": {
            "username": {"type": "string", "description": "User's response"},
            "email": {"type": "string", "description": "User's email address"},
        },
        "required": ["username", "email"],
    }
    r = await ctx.session.elicit_form(message, schema)
    return f"User response: action={r.action}, content={r.content}"


@server.tool()
async def test_elicitation_sep1034_defaults(ctx: Context) -> str:
    """Asks the user with a form whose every field has a default (SEP-1034)."""
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "description": "User name", "default": "John Doe"},
            "age": {"type": "integer", "description": "User age", "default": 30},
            "score": {"type": "number", "description": "User score", "default": 95.5},
            "status": {"type": "string", "description": "User status", "enum": ["active", "inactive", "pending"],
                       "default": "active"},
            "verified": {"type": "boolean", "description": "Verification status", "default": True},
        },
        "required": [],
    }
    r = await ctx.session.elicit_form("Please review the defaults", schema)
    return f"Elicitation completed: action={r.action}, content={r.content}"


@server.tool()
async def test_elicitation_sep1330_enums(ctx: Context) -> str:
    """Asks the user with the five enum forms of SEP-1330."""
    schema = {
        "type": "object",
        "properties": {
            "untitledSingle": {"type": "string", "enum": ["option1", "option2", "option3"]},
            "titledSingle": {"type": "string", "oneOf": [
                {"const": "value1", "title": "First Option"},
                {"const": "value2", "title": "Second Option"},
                {"const": "value3", "title": "Third Option"},
            ]},
            "legacyEnum": {"type": "string", "enum": ["opt1", "opt2", "opt3"],
                           "enumNames": ["Option One", "Option Two", "Option Three"]},
            "untitledMulti": {"type": "array", "items": {"type": "string", "enum": ["option1", "option2", "option3"]}},
            "titledMulti": {"type": "array", "items": {"anyOf": [
                {"const": "value1", "title": "First Choice"},
                {"const": "value2", "title": "Second Choice"},
                {"const": "value3", "title": "Third Choice"},
            ]}},
        },
        "required": [],
    }
    r = await ctx.session.elicit_form("Please pick", schema)
    return f"Elicitation completed: action={r.action}, content={r.content}"


WATCHED = "test://watched-resource"
subscribers = set()


@server.tool()
async def test_touch_watched(ctx: Context) -> str:
    """Changes the watched resource and tells its subscribers (not a conformance scenario)."""
    if WATCHED in subscribers:
        await ctx.session.send_resource_updated(WATCHED)
    return f"touched ({len(subscribers)} subscription)"


@server.resource(WATCHED, mime_type="text/plain")
def watched() -> str:
    return "A resource that can be subscribed to."


async def on_subscribe(ctx, params):
    subscribers.add(str(params.uri))
    return t.EmptyResult()


async def on_unsubscribe(ctx, params):
    subscribers.discard(str(params.uri))
    return t.EmptyResult()


server._lowlevel_server.add_request_handler("resources/subscribe", t.SubscribeRequestParams, on_subscribe)
server._lowlevel_server.add_request_handler("resources/unsubscribe", t.UnsubscribeRequestParams, on_unsubscribe)


@server.resource("test://static-text", mime_type="text/plain")
def static_text() -> str:
    return "This is the content of the static text resource."


@server.resource("test://static-binary", mime_type="image/png")
def static_binary() -> bytes:
    return base64.b64decode(PNG)


@server.resource("test://template/{id}/data", mime_type="application/json")
def template(id: str) -> str:
    return '{"id":"%s","templateTest":true,"data":"Data for ID: %s"}' % (id, id)


@server.prompt()
def test_simple_prompt() -> str:
    """A simple prompt."""
    return "This is a simple prompt for testing."


@server.prompt()
def test_prompt_with_arguments(arg1: str, arg2: str) -> str:
    """A prompt with arguments."""
    return f"Prompt with arguments: arg1='{arg1}', arg2='{arg2}'"


@server.prompt()
def test_prompt_with_embedded_resource(resourceUri: str) -> list:
    """A prompt that embeds a resource."""
    res = t.TextResourceContents(uri=resourceUri, mime_type="text/plain", text="Embedded resource content for testing.")
    return [
        UserMessage(t.EmbeddedResource(type="resource", resource=res)),
        UserMessage("Please process the embedded resource above."),
    ]


@server.prompt()
def test_prompt_with_image() -> list:
    """A prompt with an image."""
    return [UserMessage(t.ImageContent(type="image", data=PNG, mime_type="image/png")), UserMessage("Please analyze the image above.")]


@server.completion()
async def complete(ref, argument, context):
    return t.Completion(values=[v for v in ("paris", "park", "party") if v.startswith(argument.value)], has_more=False)


if __name__ == "__main__":
    server.run("stdio")
