"""Batches as named tensors: dtype + shape + raw bytes, never pickle.

A batch (a tensor, a dict of tensors, or a tuple/list of tensors) is laid out
as one payload: each tensor's bytes at a 64-byte aligned offset. The header
(``BatchHeader`` in proto/) carries name, dtype, shape, offset and length of
each. ``decode`` turns a received buffer back into tensors with
``torch.frombuffer`` (views, no copies) after checking every field, so a
malformed or hostile header is a ``ProtocolError``, never a crash or a huge
allocation.
"""
from __future__ import annotations

import hashlib
from typing import Any, Sequence

import torch

from ..crc32c import copy_crc32c, crc32c
from ..errors import ConfigError, ProtocolError
from ..protocol.generated import pb

ALIGN = 64
MAX_DIMS = 16
MAX_TENSORS = 1024

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
    "bfloat16": torch.bfloat16, "uint8": torch.uint8, "int8": torch.int8,
    "int16": torch.int16, "int32": torch.int32, "int64": torch.int64,
    "bool": torch.bool, "complex64": torch.complex64,
}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
ITEMSIZES: dict[str, int] = {k: torch.empty((), dtype=v).element_size() for k, v in DTYPES.items()}
_MAX_DIM = 1 << 62


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def flatten(batch: Any) -> tuple[int, list[tuple[str, torch.Tensor]]]:
    """Split a batch into (structure, [(name, tensor)]).

    Raises:
        ConfigError: the batch is not a tensor / dict / tuple / list of tensors.
    """
    if isinstance(batch, torch.Tensor):
        structure, items = pb.TENSOR, [("", batch)]
    elif isinstance(batch, dict):
        structure, items = pb.DICT, list(batch.items())
        bad = [k for k in batch if not isinstance(k, str)]
        if bad:
            raise ConfigError(f"batch dict keys must be str, got {bad!r}; rename them in collate_fn")
    elif isinstance(batch, (tuple, list)):
        structure = pb.TUPLE if isinstance(batch, tuple) else pb.LIST
        items = [(str(i), t) for i, t in enumerate(batch)]
    else:
        raise ConfigError(f"a batch must be a tensor, a dict of tensors or a tuple/list of tensors, got "
                          f"{type(batch).__name__}; make collate_fn return tensors")
    for name, t in items:
        if not isinstance(t, torch.Tensor):
            raise ConfigError(f"batch entry {name!r} is a {type(t).__name__}, not a tensor; nested or "
                              "non-tensor values cannot travel: convert it in collate_fn")
        if t.dtype not in DTYPE_NAMES:
            raise ConfigError(f"batch entry {name!r} has dtype {t.dtype}, not one of {sorted(DTYPES)}")
    return structure, items


def plan_layout(batch: Any) -> tuple[int, list[pb.TensorMeta], list[torch.Tensor], int]:
    """Return (structure, metas, contiguous tensors, payload size) for a batch."""
    structure, items = flatten(batch)
    metas, tensors, offset = [], [], 0
    for name, t in items:
        t = t.detach().cpu().contiguous()  # cpu() and contiguous() return the tensor itself when it already is
        nbytes = t.numel() * t.element_size()
        metas.append(pb.TensorMeta(name=name, dtype=DTYPE_NAMES[t.dtype], shape=list(t.shape),
                                   offset=offset, nbytes=nbytes))
        tensors.append(t)
        offset = _align(offset + nbytes)
    return structure, metas, tensors, offset


def write_payload(metas: Sequence[pb.TensorMeta], tensors: Sequence[torch.Tensor], buf) -> None:
    """Copy each tensor's bytes into ``buf`` (a writable buffer) at its offset."""
    for meta, t in zip(metas, tensors):
        if meta.nbytes == 0:
            continue
        dst = torch.frombuffer(buf, dtype=torch.uint8, count=meta.nbytes, offset=meta.offset)
        dst.copy_(t.reshape(-1).view(torch.uint8))


def write_summed_payload(metas: Sequence[pb.TensorMeta], tensors: Sequence[torch.Tensor], buf, crc: int) -> int:
    """:func:`write_payload`, and the CRC32C of the whole payload as laid out in ``buf`` (the alignment
    gaps included), continuing ``crc``: each tensor is summed as it is copied (``copy_crc32c``), so
    the payload is not read from memory a second time to sum it."""
    pos = 0
    with memoryview(buf) as view:
        for meta, t in zip(metas, tensors):
            crc = crc32c(view[pos:meta.offset], crc)  # the gap before it
            src = t.reshape(-1).resolve_conj().resolve_neg().view(torch.uint8).numpy()
            crc = copy_crc32c(view[meta.offset:meta.offset + meta.nbytes], src, crc)
            pos = meta.offset + meta.nbytes
        return crc32c(view[pos:_align(pos)], crc)  # the gap after the last


def check_header(header: pb.BatchHeader, buffer_len: int, max_bytes: int) -> None:
    """Validate every field of a header against the received buffer.

    Raises:
        ProtocolError: naming the bad field.
    """
    if header.raw_bytes > max_bytes:
        raise ProtocolError(f"batch of {header.raw_bytes} bytes exceeds max_batch_bytes={max_bytes}")
    if header.raw_bytes != buffer_len:
        raise ProtocolError(f"header says raw_bytes={header.raw_bytes}, buffer holds {buffer_len}")
    if len(header.tensors) > MAX_TENSORS:
        raise ProtocolError(f"{len(header.tensors)} tensors in one batch (max {MAX_TENSORS})")
    structure = header.structure
    names = [m.name for m in header.tensors]
    if len(set(names)) != len(names):
        raise ProtocolError(f"duplicate tensor names {names!r}")
    if structure == pb.TENSOR:
        if names != [""]:
            raise ProtocolError(f"structure TENSOR needs exactly one unnamed tensor, got {names!r}")
    elif structure in (pb.TUPLE, pb.LIST):
        if names != [str(i) for i in range(len(names))]:
            raise ProtocolError(f"structure TUPLE/LIST needs names '0'..'n-1', got {names!r}")
    elif structure != pb.DICT:
        raise ProtocolError(f"unknown structure {structure}")
    for m in header.tensors:
        itemsize = ITEMSIZES.get(m.dtype)
        if itemsize is None:
            raise ProtocolError(f"tensor {m.name!r}: dtype {m.dtype!r} is not one of {sorted(DTYPES)}")
        shape = m.shape
        if len(shape) > MAX_DIMS:
            raise ProtocolError(f"tensor {m.name!r}: {len(shape)} dims (max {MAX_DIMS})")
        if shape and max(shape) >= _MAX_DIM:
            raise ProtocolError(f"tensor {m.name!r}: a dimension of shape {list(shape)} exceeds 2**62")
        numel = 1
        for d in shape:
            numel *= d
            if numel > buffer_len:  # stops huge products early
                break
        nbytes, offset = m.nbytes, m.offset
        if numel * itemsize != nbytes:
            raise ProtocolError(f"tensor {m.name!r}: shape {list(shape)} x {m.dtype} needs {numel * itemsize} "
                                f"bytes, header says {nbytes}")
        if offset % itemsize or offset + nbytes > buffer_len:
            raise ProtocolError(f"tensor {m.name!r}: bytes [{offset}, {offset + nbytes}) fall outside the "
                                f"{buffer_len}-byte payload or are misaligned")


def decode(header: pb.BatchHeader, buffer, max_bytes: int = 1 << 40) -> Any:
    """Rebuild a batch from a header and a writable buffer, without copying.

    The tensors are views of ``buffer``; keep it alive (they do).
    """
    buffer_len = len(buffer) if not isinstance(buffer, torch.Tensor) else buffer.numel()
    check_header(header, buffer_len, max_bytes)
    out = []
    is_tensor = isinstance(buffer, torch.Tensor)
    for m in header.tensors:
        dtype = DTYPES[m.dtype]
        shape = tuple(m.shape)
        nbytes, offset = m.nbytes, m.offset
        if nbytes == 0:
            t = torch.empty(shape, dtype=dtype)
        elif is_tensor:
            t = buffer[offset:offset + nbytes] if offset or nbytes != buffer_len else buffer
            if dtype is not torch.uint8:
                t = t.view(dtype)
            if len(shape) != 1 or shape[0] != t.numel():
                t = t.view(shape)
        else:
            t = torch.frombuffer(buffer, dtype=dtype, count=nbytes // ITEMSIZES[m.dtype], offset=offset).view(shape)
        out.append((m.name, t))
    if header.structure == pb.TENSOR:
        return out[0][1]
    if header.structure == pb.DICT:
        return dict(out)
    values = [t for _, t in out]
    return tuple(values) if header.structure == pb.TUPLE else values


def batch_digest(batch: Any) -> str:
    """sha256 over (name, dtype, shape, bytes) of each tensor, in batch order (the audit hash)."""
    _, items = flatten(batch)
    h = hashlib.sha256()
    for name, t in items:
        t = t.detach().cpu().contiguous()
        h.update(f"{name}|{DTYPE_NAMES[t.dtype]}|{list(t.shape)}|".encode())
        if t.numel():  # the ignore: numpy's stubs do not declare ndarray a buffer
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.dtype == torch.bfloat16
                     else memoryview(t.numpy()).cast("B"))  # type: ignore[arg-type]
    return h.hexdigest()
