"""The log lines SageMaker turns into metrics, the regular expressions that read them, and the record
of the job's figures they report (``metrics.json``: :class:`JobMetrics`, its keys named once).

SageMaker scans every line a training container prints for each ``MetricDefinitions`` regex
and publishes the first group of a match as a data point of that metric (console, CloudWatch
``/aws/sagemaker/TrainingJobs``). The formats below and the regexes in
:data:`METRIC_DEFINITIONS` live side by side so they cannot drift apart; ``hetero submit``
and the SDK builder send exactly this list (the ``autoscale:*`` ones only to a job in
``autoscale.mode=act``, the one whose rank 0 prints ``autoscale`` lines), and
``tests/test_metric_definitions.py`` applies it to the logs of a real local job and compares
the last match of each metric with ``metrics.json`` / ``data_node.json``.

Which line feeds which metric (the last point of each equals the job's summary value):

=========================  ====================================================  ===============
metric                     lines                                                  summary key
=========================  ====================================================  ===============
train:step_time_s          every ``log_every`` steps (window), then ``done:``     avg_step_time_s
train:data_wait_percent    same lines                                             data_wait_fraction x 100
train:samples_per_s        same lines                                             samples_per_s
train:loss                 end of each epoch, ``done:``                           final_loss
test:accuracy              ``done:``                                              test_accuracy
data:batches_per_s         data node, every ``RATE_EVERY_S`` and at its exit       batches_per_s (data_node.json)
advice:data_node_change    rank 0, every ``advice_every`` steps, then at the end   advice.change
advice:predicted_step_s    same lines                                             advice.predicted_step_s
advice:change_usd_per_hour same lines (with a price for the data instance type)   advice.change_usd_per_hour
advice:change_usd_per_epoch same lines (with a price and the epoch's size)        advice.change_usd_per_epoch
autoscale:target_nodes     rank 0, one ``autoscale`` line per periodic advice      advice.autoscale.decisions[-1].target
autoscale:node_change      same lines (+n out, -n in, 0 hold)                     the decision's count, signed
autoscale:usd_per_hour     same lines (with a price): the target's data node $/h  ...decisions[-1].usd_per_hour
=========================  ====================================================  ===============

The advice lines (``launcher/advice/advisor.py``) name no figure the other metrics read ("batches per
s", "waits on data"), so they add points only to their own metrics.

No ``n/a`` value matches: a metric without a value (an emulated step has no loss) has no point.
"""
from __future__ import annotations

import re
import types
import typing
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Mapping, Self

# A number as Python's %f/%g write it (no sign: every metric here is >= 0 except a loss,
# which the optional minus covers).
_NUMBER = r"(-?[0-9]+(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?)"

METRIC_DEFINITIONS: tuple[dict[str, str], ...] = (
    {"Name": "train:step_time_s", "Regex": r"avg step time " + _NUMBER + r" s"},
    {"Name": "train:data_wait_percent", "Regex": r"data wait " + _NUMBER + r"%"},
    {"Name": "train:samples_per_s", "Regex": _NUMBER + r" samples/s"},
    {"Name": "train:loss", "Regex": r"[ ,]loss " + _NUMBER},
    {"Name": "test:accuracy", "Regex": r"test accuracy " + _NUMBER},
    {"Name": "data:batches_per_s", "Regex": _NUMBER + r" batches/s"},
    {"Name": "advice:data_node_change", "Regex": r"advice at step [0-9]+.*?: data node change \+?" + _NUMBER},
    {"Name": "advice:predicted_step_s", "Regex": r"predicted step " + _NUMBER + r" s"},
    {"Name": "advice:change_usd_per_hour", "Regex": r"cost change " + _NUMBER + r" USD/h"},
    {"Name": "advice:change_usd_per_epoch", "Regex": r"USD/h, " + _NUMBER + r" USD/epoch"},
    {"Name": "autoscale:target_nodes", "Regex": r"autoscale at step [0-9]+ .*?data nodes [0-9]+ -> " + _NUMBER},
    {"Name": "autoscale:node_change", "Regex": r"autoscale at step [0-9]+ .*?: node change \+?" + _NUMBER},
    {"Name": "autoscale:usd_per_hour",
     "Regex": r"autoscale at step [0-9]+ .*?data group at " + _NUMBER + r" USD per h"},
)

RATE_EVERY_S = 60.0  # a data node's batches/s line: often enough for a console chart, not chatty


def metric_definitions(autoscale: bool = True) -> list[dict[str, str]]:
    """A fresh copy of :data:`METRIC_DEFINITIONS` for a CreateTrainingJob request; without the
    ``autoscale:*`` ones unless ``autoscale`` (only a job in ``autoscale.mode=act`` prints their
    lines, and a definition that can never match is an empty metric in the console)."""
    return [dict(d) for d in METRIC_DEFINITIONS if autoscale or not d["Name"].startswith("autoscale:")]


def fmt(value: float | None, spec: str = ".4f") -> str:
    """``value`` formatted, or ``n/a`` for None (no such figure: no SageMaker metric matches it)."""
    return "n/a" if value is None else format(value, spec)


def window_line(label: str, step: int, avg_step_s: float, steps: int, wait_fraction: float,
                samples_per_s: float) -> str:
    """A trainer rank's periodic line: the last ``steps`` steps' average step time, data wait, rate."""
    return (f"{label}step {step}: avg step time {avg_step_s:.4f} s over the last {steps} steps, "
            f"data wait {100 * wait_fraction:.0f}%, {samples_per_s:.1f} samples/s")


@dataclass(frozen=True)
class Record:
    """A JSON object one process writes and another reads, its keys the fields' names: ``to_json``
    writes them, ``from_json`` reads them back (keys a record does not name are other readers')."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Self:
        """The record in ``doc`` (a key it lacks keeps its default); ValueError for a value of another
        kind than its field's, naming the key, the value and the kind."""
        if not isinstance(doc, Mapping):
            raise ValueError(f"{cls.__name__}: expected a JSON object, got {type(doc).__name__}")
        hints = typing.get_type_hints(cls)
        return cls(**{f.name: _checked(cls.__name__, f.name, doc[f.name], hints[f.name])
                      for f in fields(cls) if f.name in doc})


_KINDS = {int: "a whole number", float: "a number", str: "a string", dict: "an object", type(None): "null"}


def _checked(record: str, name: str, value: Any, hint: Any) -> Any:
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    kinds = tuple(typing.get_origin(k) or k for k in (typing.get_args(hint) if union else (hint,)))
    if isinstance(value, kinds + ((int,) if float in kinds else ())) and not isinstance(value, bool):
        return value
    raise ValueError(f"{record}: {name}={value!r} must be {' or '.join(_KINDS[k] for k in kinds)} (a file of "
                     "another release, or edited by hand: rerun the job, or fix the value)")


@dataclass(frozen=True)
class StepFigures(Record):
    """One trainer rank's step figures, or the job's: steps run, warm-up steps left out of the averages,
    and the averages over the others (None: no step was measured)."""

    steps: int = 0
    warmup_steps_discarded: int = 0
    avg_step_time_s: float | None = None
    data_wait_fraction: float | None = None
    samples_per_s: float | None = None


@dataclass(frozen=True)
class DataNodeFigures(Record):
    """What one data server had sent when the trainer asked at the end (a data node's entry in
    ``metrics.json``'s ``nodes``); ``error``: why it could not be asked (the entry then holds no figures)."""

    host: str = ""
    role: str = "data"
    address: str = ""
    batches_sent: int = 0
    bytes_sent: int = 0
    workers: int = 0
    worker_busy_fraction: float = 0.0
    batch_errors: int = 0
    samples_skipped: int = 0
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        # no zeros for a server not asked: readers take an entry with bytes_sent as measured (hetero plan --metrics)
        if self.error is not None:
            return {"host": self.host, "role": self.role, "address": self.address, "error": self.error}
        return {k: v for k, v in super().to_json().items() if k != "error"}


@dataclass(frozen=True)
class JobMetrics(StepFigures):
    """What ``metrics.json`` says of a job, by the names it writes (rank 0 writes it when training
    ends; it holds more, which no other process reads by name: the advice, every rank's figures).
    ``data_nodes`` are the entries of its ``nodes`` list whose ``role`` is ``data``."""

    mode: str = ""
    step_kind: str = "real"
    status: str = "completed"
    warmup_steps: int | None = None
    test_accuracy: float | None = None
    final_loss: float | None = None
    resumed_from_steps: int | None = None
    wire_encoding: str = "uint8"
    pipeline_options: dict[str, Any] | None = None
    data_nodes: tuple[DataNodeFigures, ...] = ()

    def to_json(self) -> dict[str, Any]:
        out = super().to_json()
        del out["data_nodes"]
        out["nodes"] = [n.to_json() for n in self.data_nodes]
        return out

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Self:
        read = super().from_json(doc)
        nodes = [n for n in doc.get("nodes") or [] if isinstance(n, dict) and n.get("role") == "data"]
        return replace(read, data_nodes=tuple(DataNodeFigures.from_json(n) for n in nodes))


def none_measured(metrics: JobMetrics) -> str | None:
    """Why a run has no average step time, in words (every step was warm-up, or none ran); None
    when it has one."""
    if metrics.avg_step_time_s is not None:
        return None
    if metrics.steps == 0:
        return "avg step time: none measured (no step ran)"
    warmup = metrics.warmup_steps or metrics.warmup_steps_discarded or metrics.steps
    every = "the step was" if metrics.steps == 1 else f"all {metrics.steps} steps were"
    return (f"avg step time: none measured ({every} warm-up, warmup_steps={warmup}; run more than {warmup} "
            "steps or lower warmup_steps)")


def summary_line(metrics: Mapping[str, Any], where: str) -> str:
    """The trainer's last line: the job's averages as written to ``metrics.json`` in ``where``."""
    m = JobMetrics.from_json(metrics)
    wait = m.data_wait_fraction
    tail = f"loss {fmt(m.final_loss)}, test accuracy {fmt(m.test_accuracy)}; metrics in {where}"
    unmeasured = none_measured(m)
    if unmeasured is not None:  # no figure for the step-time, wait and rate metrics to read
        return f"done: {unmeasured} ({m.step_kind}), {tail}"
    return (f"done: avg step time {fmt(m.avg_step_time_s)} s ({m.step_kind}), "
            f"data wait {fmt(None if wait is None else 100 * wait, '.2f')}%, {fmt(m.samples_per_s)} samples/s, {tail}")


def advice_line(step: int, advice: Mapping[str, Any], final: bool = False) -> str:
    """Rank 0's advice (``launcher.advice.model.Advice.to_dict()``): the data node change, the step it
    predicts and what the change costs; ``final``: the one at the end of training."""
    when = f"advice at step {step}" + (" (end of training)" if final else "")
    n, kind = advice["data_nodes"], advice["data_instance"] or "data instance"
    node_cap = advice.get("node_capacity_per_s")
    now = (f"now {n} x {kind}, {advice['delivered_per_s']:.1f} batches per s delivered, "
           f"{'n/a' if node_cap is None else format(node_cap, '.1f')} per node possible")
    change = advice.get("change")
    if change is None:
        return f"{when}: no data node change to advise ({now}; {advice.get('note') or 'no figures'})"
    timing = (f"predicted step {advice['predicted_step_s']:.4f} s (now {advice['step_s']:.4f} s, compute "
              f"{advice['compute_s']:.4f} s, waits on data {100 * advice['data_wait_fraction']:.0f}% of it)")
    per_h, per_epoch = advice.get("change_usd_per_hour"), advice.get("change_usd_per_epoch")
    if per_h is None:
        cost = f"cost n/a (no price for {kind}: advice_prices)"
    else:
        cost = f"cost change {per_h:.4f} USD/h" + (f", {per_epoch:.4f} USD/epoch" if per_epoch is not None else "")
    job_now, job_after = advice.get("job_usd_per_epoch"), advice.get("predicted_job_usd_per_epoch")
    job = f"; job {job_now:.4f} -> {job_after:.4f} USD per epoch" if job_now is not None and job_after is not None \
        else ""
    note = f"; {advice['note']}" if advice.get("note") else ""
    return f"{when}: data node change {change:+d} ({now}): {timing}; {cost}{job}{network_words(advice)}{note}"


_ADVICE_LINE = re.compile(
    r"advice at step (?P<step>[0-9]+)(?P<final> \(end of training\))?: data node change (?P<change>[+-]?[0-9]+) "
    r"\(now (?P<nodes>[0-9]+) x (?P<kind>\S+), [0-9.]+ batches per s delivered, (?P<cap>[0-9.]+|n/a) per node "
    r"possible\): .*?waits on data (?P<wait>[0-9]+)% of it\); (?:cost change (?P<usd>-?[0-9.]+) USD/h)?"
    r"(?:.*?data side bound by (?P<binding>[^;:]+?) at)?")


def parse_advice_line(text: str) -> dict[str, Any] | None:
    """The figures of one :func:`advice_line` (from a job's log, e.g. CloudWatch) as the advice's
    keys the autoscaler reads; None for a line that is not one with a data node change."""
    m = _ADVICE_LINE.search(text)
    if m is None:
        return None
    change, usd = int(m["change"]), None if m["usd"] is None else float(m["usd"])
    return {"step": int(m["step"]), "final": bool(m["final"]), "change": change, "data_nodes": int(m["nodes"]),
            "data_instance": m["kind"], "node_capacity_per_s": None if m["cap"] == "n/a" else float(m["cap"]),
            "data_wait_fraction": int(m["wait"]) / 100, "change_usd_per_hour": usd,
            "node_usd_per_hour": abs(usd / change) if usd is not None and change else None,
            "binding": (m["binding"] or "").strip()}


def network_words(advice: Mapping[str, Any]) -> str:
    """The advice's binding resource and bytes per sample, and what helps when the network binds ("" : none)."""
    binding, per_sample = advice.get("binding"), advice.get("bytes_per_sample")
    if not binding or per_sample is None:
        return ""
    note = advice.get("network_note")
    return f"; data side bound by {binding} at {per_sample:,.0f} bytes per sample" + (f": {note}" if note else "")


def autoscale_line(d: Mapping[str, Any]) -> str:
    """Rank 0's autoscaler decision (``launcher.autoscale.policy.Decision.figures()`` and its mode):
    the action, the node change, the data nodes before and after, and every figure it used."""
    signed = {"out": d["count"], "in": -d["count"]}.get(d["action"], 0)
    verb = {"out": "add", "in": "drain"}.get(d["action"], "hold")
    mode = "" if d.get("mode", "act") == "act" else f" ({d['mode']}: not acted on)"
    rate, price = d.get("node_rate"), d.get("node_usd_per_hour")
    usd = d.get("usd_per_hour")
    advised = d.get("advised_nodes")
    return (f"autoscale at step {d.get('step', 0)} ({d['binding']} bound){mode}: node change {signed:+d} "
            f"({verb}; data nodes {d['nodes']} -> {d['target']}, advised {'n/a' if advised is None else advised}, "
            f"waits {100 * d['data_wait_share']:.0f}% on data, {fmt(rate, '.2f')} batches per s per node, "
            f"{fmt(price, '.4f')} USD per h per node, cap {fmt(d.get('cap_nodes'), 'd')} nodes; "
            f"data group at {fmt(usd, '.4f')} USD per h): {d['reason']}")


def rate_line(batches_sent: int, batches_per_s: float | None, seconds: float, final: bool) -> str:
    """A data node's throughput line (``final``: over its whole serving time, at exit)."""
    what = "while serving" if final else f"over the last {seconds:.0f} s"
    return f"{batches_sent} batches sent, {fmt(batches_per_s)} batches/s {what}"
