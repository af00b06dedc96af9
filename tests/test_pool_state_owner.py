"""Only the worker pool's state calls its task queue and slot tables, which hold no lock of their own
(docs/architecture.md, "The worker pool: one owner of its state"): a call from elsewhere would change
them outside the pool's lock. Read from the source, as tests/test_layering.py reads the imports."""
from __future__ import annotations

import ast
import inspect
from pathlib import Path

from data_service.pool.slots import SlotTable
from data_service.pool.task_queue import TaskQueue

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("data_service", "dnn_worker", "launcher", "hetero")
# the state, and the two lock-less parts it drives (the queue reserves slots of the table it is given)
OWNERS = {"data_service/pool/state.py", "data_service/pool/task_queue.py", "data_service/pool/slots.py"}
METHODS = {name for cls in (SlotTable, TaskQueue) for name, _ in inspect.getmembers(cls, inspect.isfunction)
           if not name.startswith("__")}
# what the product calls a table or a queue it holds (WorkerHandle.table, ServerSlot.table, PoolState._queue)
HOLDERS = {"table", "_queue"}


def _offences(source: str, where: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source, where)):
        if isinstance(node, ast.ImportFrom) and any(a.name == "TaskQueue" for a in node.names):
            found.append(f"{where}:{node.lineno}: imports TaskQueue")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in METHODS:
            held = node.func.value
            if isinstance(held, ast.Attribute) and held.attr in HOLDERS:
                found.append(f"{where}:{node.lineno}: {ast.unparse(node.func)}()")
    return found


def test_only_the_pool_state_calls_the_task_queue_and_the_slot_tables():
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            where = str(path.relative_to(ROOT))
            if where not in OWNERS and "generated" not in path.parts:
                found += _offences(path.read_text(), where)
    assert not found, "only PoolState (data_service/pool/state.py) may call these: " + "; ".join(found)


def test_the_check_sees_a_call_through_a_worker_handle_or_a_slot():
    source = "def release(w, slot):\n    w.table.orphan_all()\n    slot.table.release(slot)\n    w.table.name\n"
    assert _offences(source, "m.py") == ["m.py:2: w.table.orphan_all()", "m.py:3: slot.table.release()"]
