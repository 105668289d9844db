"""The gateway in front of @modelcontextprotocol/server-filesystem (npm): writes undone from
a snapshot the policy takes before each call, moves undone by moving back."""

import pytest

from conftest import NPM, stdio_session, text, toml_str, write_policy

pytestmark = pytest.mark.anyio


def policy_for(workdir, root):
    return write_policy(
        workdir,
        f"""
[upstreams.fs]
command = {toml_str(NPM / "mcp-server-filesystem")}
args = [{toml_str(root)}]

[[tools]]
upstream = "fs"
match = "write_file"
class = "reversible"
scopes = ["fs:{{args.path}}"]
snapshot = {{ tool = "read_text_file", args = {{ path = "{{args.path}}" }} }}
compensate = {{ tool = "write_file", args = {{ path = "{{args.path}}", content = "{{snapshot.text}}" }}, if_snapshot_failed = "skip" }}

[[tools]]
upstream = "fs"
match = "move_file"
class = "reversible"
scopes = ["fs:{{args.source}}", "fs:{{args.destination}}"]
compensate = {{ tool = "move_file", args = {{ source = "{{args.destination}}", destination = "{{args.source}}" }} }}

[[tools]]
upstream = "fs"
match = "{{read_text_file,list_directory,list_allowed_directories}}"
class = "read"
scopes = ["fs:{toml_str(root)[1:-1]}"]
""",
    )


async def test_an_overwrite_is_restored_from_its_snapshot(workdir):
    root = (workdir / "files").resolve()
    root.mkdir()
    (root / "a.txt").write_text("old text\nline two\n")
    async with stdio_session(policy_for(workdir, root)) as s:
        r = await s.call_tool("write_file", {"path": str(root / "a.txt"), "content": "new"})
        assert not r.is_error, text(r)
        assert (root / "a.txt").read_text() == "new"
        r = await s.call_tool("tidegate_abort", {})
        assert not r.is_error, text(r)
        assert [e["tag"] for e in r.structured_content["effects"]] == ["clean"]
    assert (root / "a.txt").read_text() == "old text\nline two\n"


async def test_a_new_file_cannot_be_deleted_and_the_abort_says_so(workdir):
    root = (workdir / "files").resolve()
    root.mkdir()
    async with stdio_session(policy_for(workdir, root)) as s:
        r = await s.call_tool("write_file", {"path": str(root / "new.txt"), "content": "x"})
        assert not r.is_error, text(r)
        r = await s.call_tool("tidegate_abort", {})
        # server-filesystem has no delete tool: the gateway must not claim the file is gone.
        assert "needs attention" in text(r) and "nothing to restore" in text(r), text(r)
        assert [e["tag"] for e in r.structured_content["effects"]] == ["unresolved"]
    assert (root / "new.txt").exists()


async def test_a_move_is_moved_back_and_a_commit_keeps_it(workdir):
    root = (workdir / "files").resolve()
    root.mkdir()
    (root / "x").write_text("1")
    async with stdio_session(policy_for(workdir, root)) as s:
        await s.call_tool("move_file", {"source": str(root / "x"), "destination": str(root / "y")})
        assert (root / "y").exists() and not (root / "x").exists()
        await s.call_tool("tidegate_abort", {})
        assert (root / "x").exists() and not (root / "y").exists()
        await s.call_tool("move_file", {"source": str(root / "x"), "destination": str(root / "z")})
        r = await s.call_tool("tidegate_commit", {})
        assert not r.is_error, text(r)
    assert (root / "z").read_text() == "1"
