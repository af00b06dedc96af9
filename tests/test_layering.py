"""Dependencies point one way: each product package imports only the packages below it.

data_service <- dnn_worker <- launcher <- hetero (docs/architecture.md). Inside data_service each
room imports only the rooms its rule names, and the consumer (dnn_worker) only the shared ones:
the contract, the protocol, membership, storage and the errors, never the server or the pool.
Inside launcher each room (and each module directly under it) imports only the launcher rooms
below it in LAUNCHER_ORDER that its rule names. No product module
imports benchmarks, examples or the tests; examples are reached by import path strings, as a
user's pipeline is. Only hetero.testing (the test and soak toolkit) may import hetero.testing.
Inside hetero each room (and each module directly under it) imports only the hetero rooms below it
in HETERO_ORDER that its rule names: the subcommands (hetero.commands) sit above every room, so
the rooms do the work and a subcommand parses its arguments and calls one of them.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ["data_service", "dnn_worker", "launcher", "hetero"]  # each may import those before it
OUTSIDE = {"benchmarks", "examples", "tests", "conftest"}
# A data node builds batches: no model code in it (models are user code, reached by import path).
MODEL_CODE = {"data_service": ("torchvision.models",)}


# Inside data_service: what each room may import besides itself (``errors`` is the top-level
# errors.py; the top-level __init__ is the public face and may name any room lazily).
ROOMS = {
    "crc32c": set(),
    "protocol": {"errors"},
    "contract": {"errors", "protocol"},
    "storage": {"errors"},
    "membership": {"errors", "protocol", "storage"},
    "shards": {"errors", "contract", "storage"},
    "video": {"errors"},
    "pipelines": {"errors", "contract", "storage", "shards", "video"},
    "prepare": {"errors", "contract", "storage", "shards", "pipelines", "video"},
    "pool": {"errors", "contract", "protocol"},
    "server": {"errors", "contract", "protocol", "pool", "storage", "membership"},
}
# The CRC32C (data_service/crc32c) lies below every room, beside the errors: any room may sum bytes.
for _room in ROOMS.keys() - {"crc32c"}:
    ROOMS[_room].add("crc32c")
# Inside launcher: its rooms and the modules directly under it, lowest first, and what each may
# import of launcher besides itself (always rooms before it: no upward import).
LAUNCHER_ORDER = ["capacity", "log_setup", "metric_lines", "advice", "autoscale", "config", "job", "serve", "train",
                  "node", "entry"]
LAUNCHER_ROOMS = {
    "capacity": set(),
    "log_setup": set(),
    "metric_lines": set(),
    "advice": {"capacity", "metric_lines"},
    "autoscale": {"advice", "metric_lines"},
    "config": {"autoscale"},              # the autoscale.* options are checked with the rest
    "job": {"config"},
    "serve": {"config", "job", "metric_lines"},
    "train": {"config", "job", "advice", "autoscale", "metric_lines", "log_setup"},
    "node": {"config", "job", "serve", "train", "log_setup"},
    "entry": {"node"},
}
LAUNCHER_TOP_MOST = 8  # modules directly under launcher/, __init__ included
# Inside hetero: its rooms and the modules directly under it, lowest first, and what each may
# import of hetero besides itself. cli loads the subcommands by name (importlib), not by import.
HETERO_ORDER = ["console", "ports", "options", "synthetic", "planning", "sagemaker", "testing", "local", "bench",
                "commands", "cli", "__main__"]
HETERO_ROOMS = {
    "console": set(),
    "ports": set(),
    "options": set(),
    "synthetic": set(),
    "planning": {"options", "synthetic"},
    "sagemaker": {"planning"},
    "testing": {"ports"},
    "local": {"ports", "sagemaker", "synthetic"},
    "bench": {"console", "local", "planning", "synthetic"},
    "commands": {"console", "options", "synthetic", "planning", "sagemaker", "local", "bench"},
    "cli": {"console"},
    "__main__": {"cli"},
}
HETERO_TOP_MOST = 8  # modules directly under hetero/, __init__ included
# What the consumer may import of data_service: the shared rooms, never the server's own.
CONSUMER = {"errors", "crc32c", "contract", "protocol", "membership", "storage"}
# Inside dnn_worker: what each room may import of the consumer besides itself. The top level (the
# datasets, the loader, Lightning) composes the rooms and may import any of them.
CONSUMER_ROOMS = {
    "transport": set(),
    "resume": set(),
    "fetch": {"transport", "resume"},
    "device": {"resume"},
}
# Names the public face (data_service/__init__.py) loads lazily, and the room each lives in.
PUBLIC_FACE = {"Pipeline": "contract", "PipelineSpec": "contract", "SkipSample": "contract",
               "DataServer": "server", "ServerOptions": "server", "PROTOCOL_VERSION": "protocol"}


def data_service_room(module: str) -> str | None:
    """The room of data_service that ``module`` (an absolute name, maybe an object) lies in."""
    parts = module.split(".")
    if parts[0] != "data_service":
        return None
    if len(parts) == 1:
        return ""
    if parts[1] in PUBLIC_FACE:
        return PUBLIC_FACE[parts[1]]
    if parts[1][0].isupper():  # the top level re-exports the errors besides its public face
        return "errors"
    return parts[1]


def launcher_room(module: str) -> str | None:
    """The room (or module directly under launcher/) that ``module`` lies in; "" for the package."""
    parts = module.split(".")
    if parts[0] != "launcher":
        return None
    return parts[1] if len(parts) > 1 else ""


def launcher_violations(path: Path, root: Path = ROOT) -> list[str]:
    """Imports of ``path`` (a module of launcher) that its room's rule does not name."""
    return package_room_violations(path, LAUNCHER_ROOMS, root)


def package_room_violations(path: Path, rules: dict[str, set[str]], root: Path = ROOT) -> list[str]:
    """Imports of ``path`` (a module of launcher or hetero) of the package's rooms that its room's
    rule in ``rules`` does not name."""
    where = path.relative_to(root)
    parts = where.with_suffix("").parts
    package = parts[0]
    own = parts[1] if len(parts) > 1 and parts[1] != "__init__" else ""
    if not own:
        return []
    allowed = rules.get(own, set()) | {own}
    bad = []
    for line, module in imported_modules(path, root):
        names = module.split(".")
        if names[0] != package or len(names) == 1:
            continue
        if names[1] not in allowed:
            bad.append(f"{where}:{line} imports {module} ({package}/{own} may import only {sorted(allowed)} of {package})")
    return bad


def room_violations(path: Path, root: Path = ROOT) -> list[str]:
    """Imports of ``path`` (a module of data_service, dnn_worker or launcher) that its room may not make."""
    where = path.relative_to(root)
    parts = where.with_suffix("").parts
    if parts[0] == "launcher":
        return launcher_violations(path, root)
    if parts[0] == "hetero":
        return package_room_violations(path, HETERO_ROOMS, root)
    if parts[0] == "dnn_worker":
        allowed, who = CONSUMER, "the consumer (dnn_worker)"
    elif parts[0] == "data_service" and len(parts) > 2 and parts[1] in ROOMS:
        allowed, who = ROOMS[parts[1]] | {parts[1]}, f"data_service/{parts[1]}"
    else:
        return []
    bad = []
    for line, module in imported_modules(path, root):
        room = data_service_room(module)
        if room is None or room == "" and parts[0] == "data_service":
            continue
        if room not in allowed:
            bad.append(f"{where}:{line} imports {module} ({who} may import only {sorted(allowed)} of data_service)")
    return bad


def imported_modules(path: Path, root: Path = ROOT) -> list[tuple[int, str]]:
    """(line, absolute name) of everything the file imports, at any depth (lazy imports too)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = ".".join(path.relative_to(root).with_suffix("").parts[:-1])
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the file's package
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            # ``from hetero import testing`` imports hetero.testing: name each imported object
            found += [(node.lineno, f"{module}.{alias.name}") for alias in node.names]
    return found


def violations(path: Path, layer: int, root: Path = ROOT) -> list[str]:
    """Imports of ``path`` (a module of ``LAYERS[layer]`` below ``root``) that point the wrong way."""
    own = LAYERS[layer]
    where = path.relative_to(root)
    module_name = ".".join(where.with_suffix("").parts)
    allowed = set(LAYERS[:layer + 1])
    bad = []
    for line, module in imported_modules(path, root):
        top = module.split(".")[0]
        if top in OUTSIDE:
            bad.append(f"{where}:{line} imports {module} (outside the product)")
        elif top in LAYERS and top not in allowed:
            bad.append(f"{where}:{line} imports {module} ({own} may use only {sorted(allowed)})")
        elif any(module == m or module.startswith(m + ".") for m in MODEL_CODE.get(own, ())):
            bad.append(f"{where}:{line} imports {module} (model code, not for {own})")
        elif module.startswith("hetero.testing") and not module_name.startswith("hetero.testing"):
            bad.append(f"{where}:{line} imports {module} (test toolkit, not for the product)")
    return bad


@pytest.mark.parametrize("layer", range(len(LAYERS)), ids=LAYERS)
def test_product_imports_point_one_way(layer):
    files = sorted((ROOT / LAYERS[layer]).rglob("*.py"))
    assert files, f"no modules found under {LAYERS[layer]}/"
    bad = [v for f in files for v in violations(f, layer)]
    assert not bad, "imports against the layering:\n" + "\n".join(bad)


def test_the_top_of_data_service_is_its_public_face_and_errors_only():
    top = sorted(p.name for p in (ROOT / "data_service").glob("*.py"))
    rooms = sorted(p.name for p in (ROOT / "data_service").iterdir() if (p / "__init__.py").is_file())
    assert top == ["__init__.py", "errors.py"], f"modules directly under data_service/ belong in a room: {top}"
    assert set(rooms) <= set(ROOMS), f"rooms without a rule in ROOMS: {sorted(set(rooms) - set(ROOMS))}"


def package_layout_problems(package: str, rules: dict[str, set[str]], order: list[str], top_most: int) -> list[str]:
    """What is wrong with ``package``'s layout against its rules: too many modules directly under it,
    a room or top module without a rule (or a rule without one), a rule that imports upward."""
    top = sorted(p.name for p in (ROOT / package).glob("*.py"))
    rooms = sorted(p.name for p in (ROOT / package).iterdir() if (p / "__init__.py").is_file())
    problems = []
    if len(top) > top_most:
        problems.append(f"{len(top)} modules directly under {package}/ (at most {top_most}): {top}")
    named = {t.removesuffix(".py") for t in top if t != "__init__.py"} | set(rooms)
    if not named == set(rules) == set(order):
        problems.append(f"{package}'s rooms and top modules {sorted(named)} against its rules {sorted(rules)}")
    upward = [f"{room} -> {other}" for room, rule in rules.items() for other in rule
              if order.index(other) >= order.index(room)]
    if upward:
        problems.append(f"rules that import upward (the order): {upward}")
    return problems


def test_launcher_in_rooms_each_below_the_rooms_that_use_it():
    assert not package_layout_problems("launcher", LAUNCHER_ROOMS, LAUNCHER_ORDER, LAUNCHER_TOP_MOST)


def test_hetero_in_rooms_each_below_the_rooms_that_use_it():
    assert not package_layout_problems("hetero", HETERO_ROOMS, HETERO_ORDER, HETERO_TOP_MOST)


def test_the_hetero_room_check_refuses_a_room_reaching_up_to_a_subcommand(tmp_path):
    (tmp_path / "hetero" / "bench").mkdir(parents=True)
    probe = tmp_path / "hetero" / "bench" / "probe.py"
    probe.write_text("from ..planning import planner\nfrom .report import markdown\n\n\ndef f():\n"
                     "    from hetero.commands import HelpFormatter\n    import hetero.cli\n")
    found = [b.split(" imports ")[1].split(" ")[0] for b in room_violations(probe, tmp_path)]
    assert found == ["hetero.commands.HelpFormatter", "hetero.cli"]


def test_the_launcher_room_check_refuses_an_upward_import(tmp_path):
    (tmp_path / "launcher" / "advice").mkdir(parents=True)
    probe = tmp_path / "launcher" / "advice" / "probe.py"
    probe.write_text("from ..capacity import predict\nfrom .model import advise\n\n\ndef f():\n"
                     "    from ..train.trainer import TrainJob\n    import launcher.config\n")
    found = [b.split(" imports ")[1].split(" ")[0] for b in launcher_violations(probe, tmp_path)]
    assert found == ["launcher.train.trainer.TrainJob", "launcher.config"]


@pytest.mark.parametrize("package", ["data_service", "dnn_worker", "launcher", "hetero"])
def test_each_room_imports_only_what_its_rule_names(package):
    bad = [v for f in sorted((ROOT / package).rglob("*.py")) for v in room_violations(f)]
    assert not bad, "imports against the rooms' rules:\n" + "\n".join(bad)


def consumer_room_violations(path: Path, root: Path = ROOT) -> list[str]:
    """Imports of ``path`` (a module in a room of dnn_worker) of another room its rule does not name,
    or of the consumer's top level (the top composes the rooms; no room reaches up to it)."""
    parts = path.relative_to(root).with_suffix("").parts
    if parts[0] != "dnn_worker" or len(parts) < 3:
        return []
    own = parts[1]
    allowed = CONSUMER_ROOMS.get(own)
    if allowed is None:
        return [f"{path.relative_to(root)}: dnn_worker/{own}/ is a room without a rule in CONSUMER_ROOMS"]
    bad = []
    for line, module in imported_modules(path, root):
        names = module.split(".")
        if names[0] != "dnn_worker" or len(names) > 1 and names[1] == own:
            continue
        room = names[1] if len(names) > 2 and names[1] in CONSUMER_ROOMS else "the top level"
        if room not in allowed:
            bad.append(f"{path.relative_to(root)}:{line} imports {module} (dnn_worker/{own} may import only "
                       f"{sorted(allowed)} of dnn_worker)")
    return bad


def test_each_consumer_room_imports_only_what_its_rule_names():
    bad = [v for f in sorted((ROOT / "dnn_worker").rglob("*.py")) for v in consumer_room_violations(f)]
    assert not bad, "imports against the consumer rooms' rules:\n" + "\n".join(bad)


def test_the_consumer_keeps_few_modules_at_its_top():
    top = sorted(p.name for p in (ROOT / "dnn_worker").glob("*.py"))
    assert len(top) <= 8, f"{len(top)} modules directly under dnn_worker/ (at most 8): put them in a room: {top}"


def test_the_consumer_room_check_refuses_upward_and_sideways_imports(tmp_path):
    room = tmp_path / "dnn_worker" / "transport"
    room.mkdir(parents=True)
    probe = room / "probe.py"
    probe.write_text("from .buffers import BufferPool\nfrom ..fetch.lane import key\n"
                     "def f():\n    from ..loader import ResumableLoader\n    import dnn_worker.resume.audit\n")
    found = [b.split(" imports ")[1].split(" ")[0] for b in consumer_room_violations(probe, tmp_path)]
    assert found == ["dnn_worker.fetch.lane.key", "dnn_worker.loader.ResumableLoader", "dnn_worker.resume.audit"]


def test_the_room_check_refuses_the_server_to_the_consumer(tmp_path):
    (tmp_path / "dnn_worker").mkdir()
    probe = tmp_path / "dnn_worker" / "probe.py"
    probe.write_text("from data_service.contract.pipeline import Pipeline\nfrom data_service import DataServer\n"
                     "def f():\n    from data_service.pool.slots import SlotTable\n    import data_service.server.session\n")
    (tmp_path / "data_service" / "pool").mkdir(parents=True)
    inner = tmp_path / "data_service" / "pool" / "probe.py"
    inner.write_text("from ..contract import sampler\nfrom ..server.stats import ServerStats\n")
    found = [b.split(" imports ")[1].split(" ")[0] for b in room_violations(probe, tmp_path) + room_violations(inner, tmp_path)]
    assert found == ["data_service.DataServer", "data_service.pool.slots.SlotTable", "data_service.server.session",
                     "data_service.server.stats.ServerStats"]


def test_the_check_sees_lazy_and_relative_imports(tmp_path):
    probe = tmp_path / "launcher" / "probe.py"
    probe.parent.mkdir()
    probe.write_text("from .config import load_object\nimport dnn_worker\n\n\ndef f():\n"
                     "    from examples.mnist import Net\n    from ..hetero import cli\n    import hetero.testing\n")
    bad = violations(probe, LAYERS.index("launcher"), root=tmp_path)
    assert [b.split(" imports ")[1].split(" ")[0] for b in bad] == ["examples.mnist.Net", "hetero.cli", "hetero.testing"]


def import_cycles(root: Path = ROOT) -> list[list[str]]:
    """Groups of product modules that import each other, directly or round a circle (lazy imports
    too; a module's import of its own package's ``__init__`` is not counted)."""
    modules = {}
    for pkg in LAYERS:
        for path in (root / pkg).rglob("*.py"):
            name = ".".join(path.relative_to(root).with_suffix("").parts)
            modules[name.removesuffix(".__init__")] = path

    def resolve(name: str) -> str:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    graph = {name: {d for _, m in imported_modules(path, root) if (d := resolve(m)) and d != name
                    and not name.startswith(d + ".")} for name, path in modules.items()}
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        order[v] = low[v] = len(order)
        stack.append(v)
        for w in graph[v]:
            if w not in order:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], order[w])
        if low[v] == order[v]:
            group = []
            while not group or group[-1] != v:
                group.append(stack.pop())
            if len(group) > 1:
                cycles.append(sorted(group))

    for v in sorted(graph):
        if v not in order:
            visit(v)
    return cycles


def test_no_import_circles():
    assert import_cycles() == []


def test_the_circle_check_finds_a_lazy_circle(tmp_path):
    (tmp_path / "dnn_worker").mkdir()
    (tmp_path / "dnn_worker" / "a.py").write_text("from .b import x\n")
    (tmp_path / "dnn_worker" / "b.py").write_text("def x():\n    from dnn_worker.c import y\n")
    (tmp_path / "dnn_worker" / "c.py").write_text("import dnn_worker.a\n")
    assert import_cycles(tmp_path) == [["dnn_worker.a", "dnn_worker.b", "dnn_worker.c"]]


def test_a_data_node_imports_no_model_code(tmp_path):
    (tmp_path / "data_service").mkdir()
    probe = tmp_path / "data_service" / "augment.py"
    probe.write_text("import torchvision.transforms\nfrom torchvision import models\n\n\ndef net():\n"
                     "    from torchvision.models import resnet18\n    import examples.imagefolder\n")
    found = [b.split(" imports ")[1] for b in violations(probe, LAYERS.index("data_service"), root=tmp_path)]
    assert found == ["torchvision.models (model code, not for data_service)",
                     "torchvision.models.resnet18 (model code, not for data_service)",
                     "examples.imagefolder (outside the product)"]


def test_no_command_imports_the_cli_that_loads_it():
    """hetero.cli loads hetero.commands.* by import_module, which no import graph sees: a command
    that imported hetero.cli back would close a circle the check above cannot find."""
    bad = [f"{f.relative_to(ROOT)}:{line} imports {m}" for f in sorted((ROOT / "hetero" / "commands").glob("*.py"))
           for line, m in imported_modules(f) if m == "hetero.cli" or m.startswith("hetero.cli.")]
    assert not bad, "\n".join(bad)


def test_one_module_per_subcommand_and_its_own_helpers_named_after_it():
    from hetero.cli import COMMANDS

    modules = {p.stem for p in (ROOT / "hetero" / "commands").glob("*.py")} - {"__init__"}
    assert set(COMMANDS) <= modules, f"subcommands without a module: {sorted(set(COMMANDS) - modules)}"
    stray = sorted(m for m in modules - set(COMMANDS) if not any(m.startswith(c + "_") for c in COMMANDS))
    assert not stray, f"modules in hetero/commands that are no subcommand nor one's helper (COMMAND_*.py): {stray}"
