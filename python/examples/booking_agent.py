"""The booking story in Python: a travel agent books a flight, a hotel and a car, charges the
card and emails the itinerary, as one transaction.

    python python/examples/booking_agent.py

Act 1: everything succeeds; the reservations execute at once, the payment and the email are
held and leave only at commit, in issuance order.
Act 2: the airline has no seats. The transaction aborts: the hotel and car reservations made
earlier are cancelled in reverse order, the payment and the email never leave.
Act 3: the agent explores two itineraries speculatively; the losing branch's holds are
cancelled and its email never leaves.
"""

from __future__ import annotations

import tidegate


def say(who: str, what: str) -> None:
    print(f"    {who:<10} {what}")


class Airline:
    seats = True


# -- adapters: one declaration per tool ---------------------------------------------------------


def cancel_flight(result, trip, **_):
    say("airline", f"cancels {result['pnr']} and keeps a 40 EUR fee")
    return "cancellation fee 40 EUR"  # residue, reported in the outcome


@tidegate.tool(scope=lambda trip, **_: f"travel:flight:{trip}", effect="reversible_with_cost", compensate=cancel_flight)
def reserve_flight(trip: str, route: str) -> dict:
    if not Airline.seats:
        say("airline", f"REFUSED flight {route} (no seats)")
        raise tidegate.NotApplied("no seats left on this route")
    say("airline", f"holds flight {route} for trip {trip}")
    return {"pnr": f"PNR-{trip}"}


@tidegate.tool(
    scope=lambda trip, **_: f"travel:hotel:{trip}",
    effect="reversible",
    compensate=lambda result, **_: say("hotel", f"cancels {result['confirmation']} free of charge"),
)
def reserve_hotel(trip: str, hotel: str) -> dict:
    say("hotel", f"reserves {hotel} for trip {trip}")
    return {"confirmation": f"HTL-{trip}"}


@tidegate.tool(
    scope=lambda trip, **_: f"travel:car:{trip}",
    effect="reversible",
    compensate=lambda result, **_: say("car rental", f"cancels {result['contract']}"),
)
def reserve_car(trip: str) -> dict:
    say("car rental", f"reserves a car for trip {trip}")
    return {"contract": f"CAR-{trip}"}


@tidegate.tool(scope=lambda trip, **_: f"retail:payment:{trip}", effect="gated", key=lambda trip, **_: f"pay-{trip}")
def charge_card(trip: str, amount: int) -> str:
    say("bank", f"charges {amount} EUR for trip {trip}")
    return f"PAY-{trip}"


@tidegate.tool(scope=lambda to, **_: f"mail:{to}", effect="gated")
def email(to: str, text: str) -> str:
    say("mail", f"sends to {to}: {text}")
    return "sent"


def book(tg: tidegate.Tidegate, trip: str, route: str) -> tidegate.Transaction:
    scopes = [f"travel:flight:{trip}", f"travel:hotel:{trip}", f"travel:car:{trip}", f"retail:payment:{trip}",
              "mail:ann@example.com"]
    with tg.transaction(agent="travel-agent", may_touch=scopes) as tx:
        reserve_hotel(trip, hotel="Hotel Miramar")
        reserve_car(trip)
        reserve_flight(trip, route=route)
        receipt = charge_card(trip, amount=1240)
        email("ann@example.com", f"Your trip {trip} is booked")
        print(f"    (agent)    payment is {receipt.kind}; nothing has been charged yet")
    return tx


def show(o: tidegate.Outcome) -> None:
    state = "COMMITTED" if o.committed else f"ABORTED ({o.reason_kind})"
    print(f"  => {state}")
    for e in o.effects:
        extra = f"  [{e.detail}]" if e.detail else ""
        print(f"     #{e.id} {e.tool:<15} {e.effect:<21} {e.disposition:<14} {e.tag}{extra}")


def main() -> None:
    tg = tidegate.open()
    print("Act 1: a trip that works out")
    show(book(tg, "T1", "LIS-NYC").outcome)

    print("\nAct 2: the airline has no seats")
    Airline.seats = False
    try:
        book(tg, "T2", "LIS-SFO")
    except tidegate.ToolFailed as e:
        print(f"    (agent)    {e}")
        show(e.outcome)
    Airline.seats = True

    print("\nAct 3: two itineraries explored speculatively; the second wins")
    with tg.speculate(2, agent="planner") as spec:
        for branch, (trip, hotel) in zip(spec.branches, [("T3a", "Hotel Sol"), ("T3b", "Hotel Mar")]):
            with branch:
                reserve_hotel(trip, hotel=hotel)
                email("ann@example.com", f"Option {trip}: {hotel}")
        out = spec.commit(1)
    show(out.winner)
    for lo in out.losers:
        show(lo)
    tg.check_integrity()


if __name__ == "__main__":
    main()
