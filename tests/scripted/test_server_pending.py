"""The server's pending permission requests and the idle allow-once countdown, on the event loop:
oldest first, a fresh countdown at the front, a person's reply cancels it, allow-once only, rechecked."""

from __future__ import annotations

import asyncio

from harness.pytest_plugin import LOOP_SCRIPTED
from harness.server._pending import Pending

pytestmark = LOOP_SCRIPTED

OPTIONS = [{"optionId": "always", "kind": "allow_always"}, {"optionId": "once", "kind": "allow_once"},
           {"optionId": "no", "kind": "reject_once"}]  # fmt: skip


def request(title: str, options=OPTIONS) -> dict:
    return {"toolCall": {"title": title}, "options": options}


def test_the_oldest_gets_the_countdown_and_the_next_a_fresh_one():
    async def scenario():
        pending = Pending(0.2, eligible=lambda: True)
        first = asyncio.ensure_future(pending.handler(request("first")))
        second = asyncio.ensure_future(pending.handler(request("second")))
        await asyncio.sleep(0.05)
        listing = pending.listing()
        assert [r["toolCall"]["title"] for r in listing] == ["first", "second"]
        assert listing[0]["allow_once_in_s"] is not None and listing[1]["allow_once_in_s"] is None
        assert pending.reply(listing[0]["id"], {"outcome": "selected", "optionId": "no"})  # a person: no countdown
        assert await first == {"outcome": "selected", "optionId": "no"}
        await asyncio.sleep(0)
        assert 0.1 < pending.listing()[0]["allow_once_in_s"] <= 0.2  # a fresh countdown at the front
        assert await asyncio.wait_for(second, 1) == {"outcome": "selected", "optionId": "once"}  # never "always"
        assert pending.listing() == []

    asyncio.run(scenario())


def test_no_countdown_when_not_eligible_and_none_without_an_allow_once_option():
    async def scenario():
        eligible = {"now": False}
        pending = Pending(0.1, eligible=lambda: eligible["now"])
        waiting = asyncio.ensure_future(pending.handler(request("ineligible")))
        await asyncio.sleep(0.25)
        assert not waiting.done() and pending.listing()[0]["allow_once_in_s"] is None
        pending.reply(pending.listing()[0]["id"], {"outcome": "cancelled"})
        assert await waiting == {"outcome": "cancelled"}

        eligible["now"] = True
        only_always = asyncio.ensure_future(pending.handler(request("x", options=OPTIONS[:1])))
        await asyncio.sleep(0.25)
        assert not only_always.done()  # the countdown never picks allow_always
        pending.reply(pending.listing()[0]["id"], {"outcome": "cancelled"})
        await only_always
        later = asyncio.ensure_future(pending.handler(request("y")))
        await asyncio.sleep(0.02)
        assert pending.listing()[0]["allow_once_in_s"] is not None  # armed while eligible
        eligible["now"] = False  # and eligibility is checked again when it fires
        await asyncio.sleep(0.25)
        assert not later.done()
        later.cancel()

    asyncio.run(scenario())


def test_a_countdown_follows_eligibility_when_it_changes():
    async def scenario():
        eligible = {"now": False}
        pending = Pending(0.2, eligible=lambda: eligible["now"])
        waiting = asyncio.ensure_future(pending.handler(request("later")))
        await asyncio.sleep(0.05)
        assert pending.listing()[0]["allow_once_in_s"] is None
        eligible["now"] = True
        pending.rearm()  # the switch turned on: a fresh countdown
        assert pending.listing()[0]["allow_once_in_s"] is not None
        eligible["now"] = False
        pending.rearm()  # and off again: it stops
        assert pending.listing()[0]["allow_once_in_s"] is None
        await asyncio.sleep(0.3)
        assert not waiting.done()
        waiting.cancel()

    asyncio.run(scenario())
