"""Scopes of types nobody registered, from Python (issue 13 item 2), the rules they follow,
registering a type, and the size limits (issue 10 item 6)."""

from __future__ import annotations

import pytest

import tidegate
from tidegate import InvalidScope, ProtocolViolation, ScopeType, WaitTimeout


def gated(name: str, scope):  # type: ignore[no-untyped-def]
    return tidegate.tool(lambda **kw: kw, scope=scope, effect="gated", name=name)


@pytest.mark.parametrize(
    "text, canonical",
    [
        ("stripe:charge:ch_1", "stripe:charge:ch_1"),
        ("Stripe:charge::ch_1:", "stripe:charge:ch_1"),
        (" github: repo : org/name ", "github:repo:org/name"),
        ("github:repo:Org/Name", "github:repo:Org/Name"),
        ("s3:bucket:a/../b", "s3:bucket:a/../b"),
        ("fs:/repo/./src//app.py", "fs:/repo/src/app.py"),
        ("mail:Ann@Example.COM", "mail:ann@example.com"),
    ],
)
def test_any_well_formed_scope_is_accepted_with_the_default_rules(tg, text, canonical):
    assert tg.canonical_scope(text) == canonical


@pytest.mark.parametrize("text", ["", "no-type", ":x", "bad type:x", "stripe:", "stripe:a\nb", "fs:relative"])
def test_malformed_scopes_are_refused_naming_the_scope(tg, text):
    with pytest.raises(InvalidScope) as info:
        tg.canonical_scope(text)
    assert text.strip() == "" or text.strip()[:5] in str(info.value)


def test_unregistered_types_work_in_transactions_and_overlap_by_segments(tg):
    charge = gated("charge", lambda id: f"stripe:charge:{id}")
    with tg.transaction(agent="a", may_touch=["stripe:charge"]) as tx:
        charge(id="ch_1")  # covered: stripe:charge is a segment prefix
        charge(id="ch_2")
    assert tx.outcome.committed and len(tx.outcome.effects) == 2
    # A declared may-touch set is enforced segment-wise for unregistered types too.
    repo = gated("repo", lambda name: f"github:repo:{name}")
    with pytest.raises(ProtocolViolation):
        with tg.transaction(agent="b", may_touch=["github:repo:org"]):
            repo(name="org/name")  # `org` is not a segment of `org/name`
    with tg.transaction(agent="c", may_touch=["github:repo:org/name"]) as tx:
        repo(name="org/name")
    assert tx.outcome.committed


def test_overlapping_unregistered_scopes_order_transactions_and_disjoint_ones_do_not(tg):
    earlier = tg.begin(agent="earlier", may_touch=["stripe:charge"])
    # Overlaps (stripe:charge is a prefix): the later commit waits for the earlier transaction.
    with pytest.raises(WaitTimeout):
        with tg.transaction(agent="later", may_touch=["stripe:charge:ch_1"], wait_timeout=0.1) as tx:
            tx.read("stripe:charge:ch_1")
    # String prefix but not a segment prefix, other type, other id: no wait.
    for scope in ("stripe:charges:ch_1", "stripe-test:charge:ch_1", "github:charge:ch_1"):
        with tg.transaction(agent="disjoint", may_touch=[scope], wait_timeout=0.1) as tx:
            tx.read(scope)
        assert tx.outcome.committed, scope
    earlier.abort()


def test_registering_a_type_changes_only_its_canonicalisation():
    tg = tidegate.open(scope_types={"github": ScopeType(case="insensitive"), "vfs": {"style": "posix"}})
    assert tg.canonical_scope("GitHub:Repo:Org:Name") == "github:repo:org:name"
    assert tg.canonical_scope("vfs:/a/b/../c/") == "vfs:/a/c"
    assert tg.canonical_scope("stripe:Charge:ch_1") == "stripe:Charge:ch_1"  # untouched
    earlier = tg.begin(agent="earlier", may_touch=["github:repo:org"])
    with pytest.raises(WaitTimeout):  # case folds before overlap: ORG overlaps org
        with tg.transaction(agent="later", may_touch=["github:REPO:ORG:x"], wait_timeout=0.1) as tx:
            tx.read("github:REPO:ORG:x")
    earlier.abort()
    with pytest.raises(InvalidScope):
        tg.canonical_scope("vfs:relative/path")
    # The built-in mail rule can be replaced.
    cs = tidegate.open(scope_types={"mail": ScopeType()})
    assert cs.canonical_scope("mail:Ann@X.io") == "mail:Ann@X.io"


def test_a_twenty_thousand_segment_scope_is_refused_cleanly(tg):
    deep = "fs:/" + "/".join(["a"] * 20_000)
    t = gated("deep", deep)
    with tg.transaction() as tx:
        with pytest.raises(InvalidScope) as info:
            t()
        assert tx.state == "open"  # refused before anything was recorded
    msg = str(info.value)
    assert f"{len(deep)} bytes" in msg and "4096" in msg and len(msg) < 300
    assert tx.outcome.committed and tx.outcome.effects == ()
    with pytest.raises(InvalidScope) as info:
        tg.canonical_scope("kv:" + ":".join(["s"] * 257))
    assert "257 segments" in str(info.value) and "256" in str(info.value)


def test_a_one_mebibyte_scope_is_refused_cleanly(tg):
    huge = "stripe:charge:" + "x" * (1 << 20)
    with pytest.raises(InvalidScope) as info:
        with tg.transaction(may_touch=[huge]):
            pass
    assert info.value.argument == "may_touch"
    assert f"{len(huge)} bytes" in str(info.value) and len(str(info.value)) < 300
