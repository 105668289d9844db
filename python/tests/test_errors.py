"""Bad input raises clear exceptions naming the argument; nothing is left half-registered."""

from __future__ import annotations

import pytest

import tidegate
from tidegate.errors import Aborted, InvalidArgument, InvalidScope, TidegateError


def f(order):
    return order


def test_exception_hierarchy_and_retryable_flags():
    for cls in (tidegate.StaleRead, tidegate.Vetoed, tidegate.ProtocolViolation, tidegate.ToolFailed,
                tidegate.LostBranch, tidegate.LeaseExpired, tidegate.WaitTimeout):
        assert issubclass(cls, Aborted) and issubclass(cls, TidegateError)
    assert issubclass(InvalidArgument, ValueError)
    assert issubclass(InvalidScope, InvalidArgument)


def test_unknown_effect_class_names_the_argument():
    with pytest.raises(InvalidArgument) as info:
        tidegate.tool(f, scope="kv:a", effect="sometimes")
    assert info.value.argument == "effect" and "'sometimes'" in str(info.value) and "'gated'" in str(info.value)


@pytest.mark.parametrize("argument", ["compensate", "key", "probe"])
def test_non_callable_handlers_are_refused(argument):
    with pytest.raises(InvalidArgument) as info:
        tidegate.tool(f, scope="kv:a", effect="reversible", **{argument: "not a function"})
    assert info.value.argument == argument and "expected a callable" in str(info.value)


@pytest.mark.parametrize("scope", [5, [], ["kv:a", 3], None])
def test_bad_scope_declarations(scope):
    with pytest.raises(InvalidArgument) as info:
        tidegate.tool(f, scope=scope, effect="reversible")
    assert info.value.argument == "scope"


def test_wrong_types_for_engine_and_transaction_arguments(tg):
    with pytest.raises(InvalidArgument) as info:
        tidegate.open(lease="long")
    assert info.value.argument == "lease"
    with pytest.raises(InvalidArgument) as info:
        tg.transaction(agent=5)
    assert info.value.argument == "agent"
    with pytest.raises(InvalidArgument) as info:
        tg.transaction(may_touch="retail:order:W1")
    assert info.value.argument == "may_touch"
    with pytest.raises(InvalidArgument) as info:
        tg.speculate(0)
    assert info.value.argument == "branches"
    with pytest.raises(InvalidScope) as info:
        with tg.transaction(may_touch=["no type here"]):
            pass
    assert "no type here" in str(info.value) and info.value.argument == "may_touch"


def test_raising_scope_function_records_nothing(tg):
    calls = []

    def scope(order, **_):
        raise LookupError("no such order")

    t = tidegate.tool(lambda order: calls.append(order), scope=scope, effect="reversible", name="t")
    with tg.transaction() as tx:
        with pytest.raises(InvalidArgument) as info:
            t("W1")
        assert info.value.argument == "scope" and "LookupError" in str(info.value)
        assert isinstance(info.value.__cause__, LookupError)
        assert tx.state == "open"  # the transaction is unaffected
    assert calls == [] and tx.outcome.committed and tx.outcome.effects == ()


def test_malformed_scope_records_nothing(tg):
    t = tidegate.tool(lambda order: order, scope=lambda order: f"bo gus:{order}", effect="gated", name="t")
    with tg.transaction() as tx:
        with pytest.raises(InvalidScope):
            t("W1")
    assert tx.outcome.effects == ()


def test_non_json_arguments_name_the_argument(tg):
    t = tidegate.tool(lambda order, meta=None: order, scope="kv:a", effect="reversible", name="t")
    with tg.transaction() as tx:
        with pytest.raises(InvalidArgument) as info:
            t("W1", meta={"when": object()})
        assert "meta.when" in str(info.value) and "object" in str(info.value)
    assert tx.outcome.effects == ()


def test_failed_declaration_leaves_the_name_free(tg):
    with pytest.raises(InvalidArgument):
        tidegate.tool(f, scope="kv:a", effect="gated", compensate=42, name="same")
    ok = tidegate.tool(f, scope="kv:a", effect="gated", name="same")
    with tg.transaction():
        ok("x")
    other = tidegate.tool(lambda order: order, scope="kv:a", effect="gated", name="same")
    with tg.transaction() as tx:
        with pytest.raises(InvalidArgument) as info:
            other("y")
        assert info.value.argument == "name"
    assert tx.outcome.effects == ()
