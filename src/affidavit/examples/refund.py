"""A refund agent over small local stand-ins for real systems.

- ``lookup_order`` (tool) reads the order from a shop database (``shop.json``);
- ``decide_refund`` (pure) decides the amount: the whole order for damaged goods, half otherwise;
- ``issue_refund`` (tool) pays through a payments ledger (``payments.jsonl``) that, like a real
  payment API, deduplicates by the idempotency key it is given — affidavit's external key;
- ``email_customer`` (tool) writes an ``.eml`` file to an outbox.

Both effectful tools have a ``reconcile`` hook that looks their effect up by the key, so a
crash between the effect and its record is caught up, never repeated.

Run it: ``affidavit run refund.json --tools affidavit.examples.refund --input
'{"order_id": "A-1001", "data_dir": "/path/to/shop"}'`` after :func:`setup_shop`.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from affidavit.runtime import AgentContext, ToolContext, ToolRegistry, agent, pure, tool

PLAN: dict[str, Any] = {
    "name": "refund-order",
    "nodes": [
        {
            "id": "lookup",
            "type": "tool",
            "tool": "lookup_order",
            "args": {"data_dir": "${input.data_dir}", "order_id": "${input.order_id}"},
        },
        {
            "id": "decide",
            "type": "pure",
            "tool": "decide_refund",
            "args": {"order": "${lookup}"},
            "depends_on": ["lookup"],
        },
        {
            "id": "refund",
            "type": "tool",
            "tool": "issue_refund",
            "args": {
                "data_dir": "${input.data_dir}",
                "order_id": "${input.order_id}",
                "amount": "${decide.amount}",
            },
            "depends_on": ["decide"],
        },
        {
            "id": "email",
            "type": "tool",
            "tool": "email_customer",
            "args": {"data_dir": "${input.data_dir}", "order": "${lookup}", "refund": "${refund}"},
            "depends_on": ["refund"],
        },
    ],
}

ORDERS = {
    "A-1001": {"customer": "ada@example.com", "total": 4200, "currency": "EUR", "damaged": True},
    "A-1002": {"customer": "grace@example.com", "total": 1999, "currency": "EUR", "damaged": False},
    "A-1003": {"customer": "alan@example.com", "total": 8800, "currency": "EUR", "damaged": True},
    "A-1004": {"customer": "edsger@example.com", "total": 1250, "currency": "EUR", "damaged": True},
}


def setup_shop(data_dir: str | Path) -> Path:
    """Create the shop database, an empty payments ledger and an empty outbox."""
    root = Path(data_dir)
    (root / "outbox").mkdir(parents=True, exist_ok=True)
    (root / "shop.json").write_text(json.dumps({"orders": ORDERS}, indent=2))
    (root / "payments.jsonl").touch()
    return root


class PaymentsLedger:
    """An append-only payments file that deduplicates refunds by idempotency key."""

    def __init__(self, data_dir: str | Path) -> None:
        self.path = Path(data_dir) / "payments.jsonl"

    def entries(self) -> list[dict[str, Any]]:
        lines = self.path.read_text().splitlines() if self.path.exists() else []
        return [json.loads(line) for line in lines if line.strip()]

    def find(self, key: str) -> dict[str, Any] | None:
        return next((e for e in self.entries() if e["idempotency_key"] == key), None)

    def refund(self, key: str, order_id: str, amount: int) -> dict[str, Any]:
        existing = self.find(key)
        if existing is not None:
            return existing
        entry = {
            "idempotency_key": key,
            "refund_id": "rf_" + hashlib.sha256(key.encode()).hexdigest()[:12],
            "order_id": order_id,
            "amount": amount,
            "status": "succeeded",
        }
        with self.path.open("a") as f:
            f.write(json.dumps(entry) + "\n")
        return entry


def _outbox_file(data_dir: str, key: str) -> Path:
    return Path(data_dir) / "outbox" / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.eml"


@tool("lookup_order")
def lookup_order(ctx: ToolContext, data_dir: str, order_id: str) -> dict[str, Any]:
    orders = json.loads((Path(data_dir) / "shop.json").read_text())["orders"]
    if order_id not in orders:
        raise LookupError(f"no order {order_id!r} in the shop database")
    return {"order_id": order_id, **orders[order_id]}


@pure("decide_refund")
def decide_refund(ctx: ToolContext, order: dict[str, Any]) -> dict[str, Any]:
    if order["damaged"]:
        return {"amount": order["total"], "reason": "item arrived damaged: full refund"}
    return {"amount": order["total"] // 2, "reason": "goodwill: half refund"}


@tool("issue_refund")
def issue_refund(ctx: ToolContext, data_dir: str, order_id: str, amount: int) -> dict[str, Any]:
    entry = PaymentsLedger(data_dir).refund(ctx.external_key, order_id, amount)
    ctx.record_state_change("payment", entry["refund_id"], "create", external_ref=ctx.external_key)
    return {"refund_id": entry["refund_id"], "amount": amount, "status": entry["status"]}


@issue_refund.reconcile
def _find_refund(
    ctx: ToolContext, data_dir: str, order_id: str, amount: int
) -> dict[str, Any] | None:
    entry = PaymentsLedger(data_dir).find(ctx.external_key)
    if entry is None:
        return None
    return {"refund_id": entry["refund_id"], "amount": entry["amount"], "status": entry["status"]}


@tool("email_customer")
def email_customer(
    ctx: ToolContext, data_dir: str, order: dict[str, Any], refund: dict[str, Any]
) -> dict[str, Any]:
    path = _outbox_file(data_dir, ctx.external_key)
    message_id = f"<{ctx.external_key.replace(':', '.')}@affidavit.example>"
    path.write_text(
        f"Message-ID: {message_id}\nTo: {order['customer']}\n"
        f"Subject: Your refund for order {order['order_id']}\n\n"
        f"We refunded {refund['amount'] / 100:.2f} {order['currency']} "
        f"({refund['refund_id']}).\n"
    )
    return {"message_id": message_id, "file": path.name}


@email_customer.reconcile
def _find_email(
    ctx: ToolContext, data_dir: str, order: dict[str, Any], refund: dict[str, Any]
) -> dict[str, Any] | None:
    path = _outbox_file(data_dir, ctx.external_key)
    if not path.exists():
        return None
    message_id = path.read_text().splitlines()[0].removeprefix("Message-ID: ")
    return {"message_id": message_id, "file": path.name}


# --- the same refund as an agent: code that decides its next tool as it runs ------------------

# What the stand-in model does, in order; a real agent would ask an LLM (a pure step too).
_SCRIPT = ("lookup_order", "decide_refund", "issue_refund", "email_customer")


@pure("scripted_model")
def scripted_model(ctx: ToolContext, order_id: str, done: list[str]) -> dict[str, Any]:
    """A scripted decision function in place of a model (no network): given the tools called so
    far, the next one to call, or ``"finish"``. Recorded like any pure step, so a recovery
    replays its answers instead of asking again."""
    for name in _SCRIPT:
        if name not in done:
            return {"next": name, "why": f"{order_id}: {name} has not run yet"}
    return {"next": "finish", "why": f"{order_id}: refunded and told the customer"}


@agent("shop_refund_agent", version="1")
def refund_agent(ctx: AgentContext, order_id: str, data_dir: str) -> dict[str, Any]:
    """The refund as an agent: it asks the (scripted) model for its next tool until it is told
    to finish, and calls what it is told with what it learned so far."""
    seen: dict[str, Any] = {}
    while True:
        choice = ctx.call(scripted_model, order_id=order_id, done=sorted(seen))
        step = choice["next"]
        if step == "finish":
            return {"order_id": order_id, "refund": seen["issue_refund"]}
        if step == "lookup_order":
            seen[step] = ctx.call(lookup_order, data_dir=data_dir, order_id=order_id)
        elif step == "decide_refund":
            seen[step] = ctx.call(decide_refund, order=seen["lookup_order"])
        elif step == "issue_refund":
            amount = seen["decide_refund"]["amount"]
            seen[step] = ctx.call(issue_refund, data_dir=data_dir, order_id=order_id, amount=amount)
        else:
            seen[step] = ctx.call(
                email_customer, data_dir=data_dir, order=seen["lookup_order"],
                refund=seen["issue_refund"],
            )  # fmt: skip


TOOLS = ToolRegistry(
    [lookup_order, decide_refund, issue_refund, email_customer, scripted_model, refund_agent]
)
