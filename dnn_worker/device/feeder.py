"""Device-side finishing and prefetched delivery to the training device.

    feeder = DeviceFeeder(ResumableLoader(loader), device="cuda", finish=ds.finish_stage())
    for batch in feeder:      # batches on the device, finished (e.g. uint8 -> normalised float32)
        ...
    torch.save({"data": feeder.state_dict(), ...}, ckpt)    # exact: as of the last batch yielded

Batches travel in compact dtypes (uint8 images); the pipeline's ``finish`` stage runs on the
consumer's device. ``DeviceFeeder`` begins each batch (copy to the device, then finish)
``depth`` batches ahead of the one the loop trains on, with the same code on every device:
on CUDA the copy is asynchronous on a side stream from pinned memory; on CPU the finish stage
is the work done ahead (``dnn_worker.device.ops``). Its ``state_dict()`` is the wrapped stage's
state as it was when the last *yielded* batch was pulled, so prefetching never skips a batch
on resume.
"""
from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping, Sized, cast

import torch

from data_service.contract import wire_encoding
from data_service.contract.batch_id import BatchId
from data_service.contract.tensor_layout import DTYPES, flatten
from data_service.errors import ConfigError, DataServiceError
from data_service.contract.pipeline import PipelineSpec
from data_service.protocol.generated import pb
from data_service.contract.wire_encoding import WireEncoding

from ..resume.audit import AuditedStage, AuditLog, take_audit
from ..resume.audit import digest as audit_digest
from ..resume.state import LoadableState, ResumeState
from .ops import HostOps, StreamOps, ops_for


class FinishError(DataServiceError):
    """The finish stage changed a batch in a way the pipeline did not declare."""


@dataclass(frozen=True)
class FinishStage:
    """A pipeline's device-side last stage, the dtype changes it may make, and the wire encoding
    it undoes first (:mod:`data_service.contract.wire_encoding`)."""

    fn: Callable[[Any], Any] | None = None
    dtypes: Mapping[str, str] = field(default_factory=dict)
    target: str = ""
    wire: WireEncoding | None = None   # None: whatever each batch says it carries
    max_batch_bytes: int = 0  # the most a decoded batch may hold, as the servers announced (0: none)

    @classmethod
    def load(cls, target: str, dtypes: Mapping[str, str] | None = None, wire: str | WireEncoding | None = None,
             max_batch_bytes: int = 0) -> "FinishStage":
        """The stage from its import path; ``wire`` is the encoding the servers announced (checked
        against every batch; None: decode whatever a batch carries), ``max_batch_bytes`` the
        largest batch they announced: a batch that would decode past it is refused before it is
        decoded (0: nothing announced; ``wire_encoding.MAX_DECODED_BYTES`` bounds it).

        Raises:
            ConfigError: unknown dtypes, an unknown encoding, or one this node cannot decode.
        """
        dtypes = dict(dtypes or {})
        bad = {k: v for k, v in dtypes.items() if v not in DTYPES}
        if bad:
            raise ConfigError(f"finish_dtypes {bad} name unknown dtypes; use one of {sorted(DTYPES)}")
        encoding = None
        if wire is not None:
            encoding = wire_encoding.parse(wire)
            wire_encoding.check_decoder(encoding)  # now, at start, not at the first batch
        return cls(PipelineSpec(target).resolve() if target else None, dtypes, target, encoding, max_batch_bytes)

    def unwire(self, batch: Any, device: torch.device | str | None = None) -> Any:
        """Decode the batch's wire encoding, for ``device`` (JPEGs on the GPU when it is CUDA)."""
        return wire_encoding.decode_batch(batch, device, self.wire, max_bytes=self.max_batch_bytes)

    def __call__(self, batch: Any) -> Any:
        if wire_encoding.is_encoded(batch):  # ``DeviceFeeder``'s ops decode it before the copy
            batch = self.unwire(batch)
        if self.fn is None:
            return batch
        out = self.fn(batch)
        self.check(batch, out)
        return out

    def check(self, before: Any, after: Any) -> None:
        """Raise FinishError naming the tensor whose structure, shape or dtype changed unexpectedly."""
        s0, items0 = flatten(before)
        try:
            s1, items1 = flatten(after)
        except ConfigError as exc:
            raise FinishError(f"finish stage {self.target!r} returned something that is not a batch: {exc}") from None
        names0, names1 = [n for n, _ in items0], [n for n, _ in items1]
        if s0 != s1 or names0 != names1:
            raise FinishError(f"finish stage {self.target!r} changed the batch's entries from {names0} to {names1}; "
                              "it must return the same structure")
        for (name, a), (_, b) in zip(items0, items1):
            if a.shape != b.shape:
                raise FinishError(f"finish stage {self.target!r} changed tensor {name!r} from shape "
                                  f"{list(a.shape)} to {list(b.shape)}; reshape on the data server instead")
            expected = DTYPES[self.dtypes[name]] if name in self.dtypes else a.dtype
            if b.dtype != expected:
                raise FinishError(f"finish stage {self.target!r} turned tensor {name!r} into {b.dtype}, expected "
                                  f"{expected}; declare it in Pipeline(finish_dtypes={{{name!r}: ...}})")


def finish_from_info(info: pb.DatasetInfo) -> FinishStage:
    return FinishStage.load(info.finish, dict(info.finish_dtypes), info.wire_encoding, info.max_batch_bytes)


class DeviceFeeder(AuditedStage):
    """Iterate batches already on ``device`` and finished, ``depth`` batches ahead.

    A consumer stage (docs/consumer.md): ``state_dict``/``load_state_dict``/``set_epoch``/``epoch``
    delegate to the wrapped stage (a ``ResumableLoader``), with the state taken as of the last
    batch this feeder yielded; the audit log is written here when the wrapped stage has one.

    Args:
        iterable: yields host batches (a ``ResumableLoader``; any iterable without resume).
        device: target device ("cuda", "cuda:1", "cpu").
        finish: the pipeline's ``FinishStage`` (``dataset.finish_stage()``), or None.
        depth: batches begun ahead of the one being trained on (bounded).
        pin_memory: pin host tensors before copying (CUDA only).
        ops: how a batch reaches the device (default: ``device_ops.ops_for(device, pin_memory)``).
    """

    def __init__(self, iterable: Iterable, device: str | torch.device = "cpu", finish: FinishStage | None = None,
                 depth: int = 2, pin_memory: bool = True, ops: HostOps | StreamOps | None = None) -> None:
        if not isinstance(depth, int) or depth < 1:
            raise ConfigError(f"depth={depth!r} must be an int >= 1")
        self.iterable = iterable
        self.device = torch.device(device)
        if ops is None and self.device.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError(f"device={device!r} but CUDA is not available; use device='cpu'")
        self.finish = finish or FinishStage()
        if ops is None and self.device.type == "cuda" and self.finish.wire is not None:
            wire_encoding.check_decoder(self.finish.wire, self.device)  # the GPU's JPEG decoder, at start
        self.depth = depth
        self.pin_memory = pin_memory
        self._ops = ops
        self._stateful = callable(getattr(iterable, "state_dict", None))
        # this package's stages take and give the typed state; any other speaks the contract's dicts
        self._typed = callable(getattr(iterable, "resume_state", None))
        self._state: ResumeState | None = None  # None: the wrapped stage's own state holds
        self.last_yielded: BatchId | None = None
        self._audit = take_audit(iterable)

    # -- the stage contract
    def _upstream(self, what: str) -> Any:
        if not self._stateful:
            raise ConfigError(f"DeviceFeeder.{what} needs a resumable stage to wrap, got "
                              f"{type(self.iterable).__name__}; wrap the DataLoader: "
                              "DeviceFeeder(ResumableLoader(DataLoader(dataset, ...)), ...)")
        return self.iterable

    def state_dict(self) -> dict[str, Any]:
        """Where to resume, as of the last batch this feeder yielded."""
        return self.resume_state().to_dict()

    def resume_state(self) -> ResumeState:
        """:meth:`state_dict` as the typed value."""
        self._upstream("state_dict")
        return self._state if self._state is not None else self._upstream_state()

    def _upstream_state(self) -> ResumeState:
        up: Any = self.iterable
        return up.resume_state() if self._typed else ResumeState.from_dict(up.state_dict())

    def load_state_dict(self, state: LoadableState) -> None:
        """Resume there: this rank's state, or every rank's (a list) from another number of ranks."""
        self._upstream("load_state_dict").load_state_dict(state)
        self._state = None

    @property
    def epoch(self) -> int:
        return self.resume_state().epoch

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch the next iteration yields; the current one keeps its position."""
        up = self._upstream("set_epoch")
        if self._state is not None and epoch == self._state.epoch:
            return
        self._state = None
        up.set_epoch(epoch)

    def __len__(self) -> int:
        return len(cast(Sized, self.iterable))  # a DataLoader or ResumableLoader; a bare iterable raises TypeError

    def __iter__(self) -> Iterator[Any]:
        up: Any = self.iterable  # with ``_stateful``, a resumable stage (state_dict, load_state_dict)
        if self._stateful:
            if self._state is not None:  # the wrapped stage ran ahead of what was yielded
                up.load_state_dict(self._state if self._typed else self._state.to_dict())
            self._state = self._upstream_state()
        ops = self._ops or ops_for(self.device, self.pin_memory)
        audit = self._audit
        it = iter(up)
        pending: collections.deque = collections.deque()

        def pull() -> bool:
            try:
                batch = next(it)
            except StopIteration:
                return False
            state = self._upstream_state() if self._stateful else None
            ident = getattr(up, "last_yielded", None)
            record = (ident, audit_digest(batch)) if audit is not None and ident is not None else None
            out, token = ops.begin(batch, self.finish)
            pending.append((out, token, state, ident, record))
            return True

        try:
            exhausted = False
            while not exhausted and len(pending) < self.depth:
                exhausted = not pull()
            while pending:
                out, token, state, ident, record = pending.popleft()
                while not exhausted and len(pending) < self.depth:  # keep ``depth`` in flight during the step
                    exhausted = not pull()
                out = ops.ready(out, token)
                if state is not None:
                    self._state = state
                if record is not None:
                    which, sha = record
                    # a record is made only with an audit log (pull)
                    cast(AuditLog, audit).write(which, getattr(state, "dp_rank", None) or 0, sha)
                self.last_yielded = ident
                yield out
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                close()

