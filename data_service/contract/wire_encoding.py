"""Wire encodings of image batches: fewer bytes per image when the network, not the cores, binds.

A job picks one (the image pipeline's ``wire_encoding`` option, ``Pipeline(wire_encoding=...)``):

* ``uint8``: the finished crop as it is (150,528 bytes per 224-px RGB image); the default.
* ``up-zstd``: lossless. Each row minus the row above (mod 256), then zstd level 1 over the
  batch; on photographs about half of uint8's bytes. It beat left-difference, plain zstd or lz4
  (which hardly shrink photographs) and Paeth or PNG (a few % smaller at 3-7x the CPU): see
  docs/benchmarks.md, "Wire encodings".
* ``jpeg:Q``: lossy. Each image re-encoded as a JPEG of quality ``Q`` (1..100; ``jpeg`` alone is
  ``jpeg:90``, about 1/12 of uint8's bytes at a PSNR of about 40 dB on photographs).

The data server's worker processes encode (:func:`encode_batch`, called by ``build_batch``, so the
homogeneous mode builds exactly the same bytes); the consumer decodes before the finish stage
(:func:`decode_batch`; ``dnn_worker.device.feeder.FinishStage``), JPEGs in batches on the GPU when the
batch goes to CUDA (``torchvision.io.decode_jpeg(device=...)``), with libjpeg-turbo on the CPU
otherwise, so the model sees the same ``uint8 [B, C, H, W]`` tensor it would see without one.

Every uint8 ``[B, C, H, W]`` tensor of a dict batch is encoded (``C`` 1 or 3 for JPEG). Its entry
``name`` then holds the encoded bytes (uint8, 1-D) and ``name + ".wire"`` an int64 header:
``[kind, quality, B, C, H, W, k, size_1 .. size_k]`` (``k`` = B JPEG sizes, or 1 zstd frame). The
batch says what it carries, and the decoder checks every field before it allocates anything: the
decoded batch may hold at most the ``max_batch_bytes`` its data servers announced.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch

from ..errors import ConfigError, ProtocolError, install_extra
from .wire import DEFAULT_JPEG_QUALITY, HELP, JPEG, UINT8, UP_ZSTD, WireEncoding, parse

__all__ = ["DEFAULT_JPEG_QUALITY", "HELP", "JPEG", "UINT8", "UP_ZSTD", "WireEncoding", "parse", "check_encoder",
           "check_decoder", "encode_batch", "decode_batch", "is_encoded", "decoded_bytes", "jpeg_dims"]

SUFFIX = ".wire"
_KIND_IDS = {UP_ZSTD: 1, JPEG: 2}
_KIND_NAMES = {v: k for k, v in _KIND_IDS.items()}
_HEADER = 7
_ZSTD_LEVEL = 1
# A decoded batch larger than this is refused before it is allocated (a hostile or corrupt header),
# where no server announced its max_batch_bytes (a batch decoded in the process that built it).
MAX_DECODED_BYTES = 1 << 34


def check_encoder(enc: WireEncoding) -> None:
    """Raise ConfigError at start unless this node can encode ``enc`` (a data node)."""
    _check(enc, "encode", "data node")


def check_decoder(enc: WireEncoding, device: torch.device | str | None = None) -> None:
    """Raise ConfigError at start unless this node can decode ``enc`` (a DNN node); for a CUDA
    ``device``, JPEGs are decoded there, so that decoder is tried too."""
    _check(enc, "decode", "DNN node", torch.device(device) if device is not None else None)


def _check(enc: WireEncoding, what: str, node: str, device: torch.device | None = None) -> None:
    if enc.kind == UP_ZSTD:
        try:
            import zstandard  # noqa: F401
        except ImportError:
            raise ConfigError(f"wire_encoding={enc.name!r} needs zstandard to {what} on this {node}: "
                              f"{install_extra('compress')}, or choose another wire_encoding") from None
    elif enc.kind == JPEG:
        try:
            probe = jpeg_encode([torch.zeros(3, 8, 8, dtype=torch.uint8)], 90)
            if what == "decode":
                jpeg_decode_cpu(probe)
                if device is not None and device.type == "cuda":
                    jpeg_decode_cuda(probe, device)
        except Exception as exc:  # a torchvision without its image library raises at the call
            raise ConfigError(f"wire_encoding={enc.name!r} cannot {what} JPEG on this {node} ({type(exc).__name__}: "
                              f"{exc}); install torchvision with its image extension (requirements/torch.txt), "
                              "or choose 'up-zstd' or 'uint8'") from None


# -- the codecs (a seam each: the benchmark times them, tests replace them)

def jpeg_encode(images: list[torch.Tensor], quality: int) -> list[torch.Tensor]:
    """JPEGs of ``[C, H, W]`` uint8 images (libjpeg-turbo, in torchvision)."""
    from torchvision.io import encode_jpeg

    return encode_jpeg(images, quality=quality)


def jpeg_decode_cpu(datas: list[torch.Tensor]) -> list[torch.Tensor]:
    """Decode JPEGs on the CPU (libjpeg-turbo, in torchvision), one ``[C, H, W]`` tensor each."""
    from torchvision.io import ImageReadMode, decode_jpeg

    return decode_jpeg(datas, mode=ImageReadMode.UNCHANGED)


def jpeg_decode_cuda(datas: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """Decode JPEGs in one batch on the GPU (nvJPEG, through torchvision); the bytes stay on the host."""
    from torchvision.io import ImageReadMode, decode_jpeg

    return decode_jpeg(datas, mode=ImageReadMode.UNCHANGED, device=device)


# -- encoding (data node)

def encode_batch(batch: Any, enc: WireEncoding) -> Any:
    """The batch with each uint8 ``[B, C, H, W]`` tensor encoded as ``enc`` (``uint8``: unchanged).

    Raises:
        ValueError: the batch is not a dict, or has no tensor to encode (naming its entries).
    """
    if enc.kind == UINT8:
        return batch
    if not isinstance(batch, dict):
        raise ValueError(f"wire_encoding={enc.name!r} needs a dict batch (e.g. {{'image': ..., 'label': ...}}), got "
                         f"a {type(batch).__name__}; return a dict from collate_fn or use wire_encoding='uint8'")
    out: dict[str, Any] = {}
    found = False
    for name, t in batch.items():
        if _encodable(t, enc):
            if name + SUFFIX in batch:
                raise ValueError(f"batch entry {name + SUFFIX!r} collides with the wire header of {name!r}; rename it")
            out[name], out[name + SUFFIX] = _encode(t.contiguous(), enc)
            found = True
        else:
            out[name] = t
    if not found:
        shapes = {k: (str(v.dtype), list(v.shape)) for k, v in batch.items() if isinstance(v, torch.Tensor)}
        channels = "1 or 3" if enc.kind == JPEG else "any"
        raise ValueError(f"wire_encoding={enc.name!r} found no uint8 [B, C, H, W] tensor ({channels} channels) in the "
                         f"batch {shapes}; use wire_encoding='uint8' for this pipeline")
    return out


def _encodable(t: Any, enc: WireEncoding) -> bool:
    return (isinstance(t, torch.Tensor) and t.dtype == torch.uint8 and t.dim() == 4 and t.numel() > 0
            and (enc.kind != JPEG or t.shape[1] in (1, 3)))


def _encode(t: torch.Tensor, enc: WireEncoding) -> tuple[torch.Tensor, torch.Tensor]:
    b, c, h, w = t.shape
    if enc.kind == JPEG:
        parts = jpeg_encode(list(t.unbind(0)), enc.quality)
        sizes = [p.numel() for p in parts]
        payload = torch.cat(parts)
    else:
        import zstandard

        diff = t.clone()
        diff[:, :, 1:, :] -= t[:, :, :-1, :]  # uint8 arithmetic wraps: mod 256, undone exactly
        frame = zstandard.ZstdCompressor(level=_ZSTD_LEVEL).compress(diff.numpy().data)
        sizes = [len(frame)]
        payload = torch.frombuffer(bytearray(frame), dtype=torch.uint8)
    header = torch.tensor([_KIND_IDS[enc.kind], enc.quality, b, c, h, w, len(sizes), *sizes], dtype=torch.int64)
    return payload, header


# -- decoding (DNN node)

def is_encoded(batch: Any) -> bool:
    """Whether ``batch`` carries wire-encoded tensors."""
    return isinstance(batch, dict) and any(isinstance(k, str) and k.endswith(SUFFIX) for k in batch)


def decode_batch(batch: Any, device: torch.device | str | None = None, expect: WireEncoding | None = None,
                 cuda_decode: Callable | None = None, max_bytes: int = 0) -> Any:
    """Undo :func:`encode_batch`: each encoded entry back to its uint8 ``[B, C, H, W]`` tensor.

    JPEGs for a CUDA ``device`` are decoded there in one batch (``cuda_decode``, default
    :func:`jpeg_decode_cuda`); everything else is decoded on the CPU. A batch without encoded
    entries comes back as it is. ``max_bytes`` is the ``max_batch_bytes`` the data servers
    announced: the most the decoded batch may hold (0: none announced, :data:`MAX_DECODED_BYTES`).

    Raises:
        ProtocolError: a header that does not match its bytes, an encoding other than ``expect``
            (what the servers announced), a batch that would decode past ``max_bytes`` (refused
            before anything is decoded), or bytes that do not decode to the announced shape.
    """
    if not is_encoded(batch):
        if expect is not None and expect.kind != UINT8 and isinstance(batch, dict):
            raise ProtocolError(f"a batch arrived without its {expect.name!r} wire encoding; the data servers of one "
                                "job must run the same pipeline options")
        return batch
    device = torch.device(device) if device is not None else None
    orphans = [k for k in batch if k.endswith(SUFFIX) and k[:-len(SUFFIX)] not in batch]
    if orphans:
        raise ProtocolError(f"wire headers {orphans} without their tensors")
    headers, total = _headers(batch, max_bytes)  # the whole batch's size is known before decoding
    _check_size("the batch", total, max_bytes)
    return {name: t if name not in headers else
            _decode(name, t, headers[name], device, expect, cuda_decode or jpeg_decode_cuda)
            for name, t in batch.items() if not name.endswith(SUFFIX)}


def decoded_bytes(batch: Any) -> int:
    """Bytes a batch :func:`encode_batch` made holds once decoded (a plain batch: its tensors' bytes).

    Raises:
        ProtocolError: a wire header that does not match its bytes.
    """
    return _headers(batch, 0)[1] if isinstance(batch, dict) else 0


def _headers(batch: dict, max_bytes: int) -> tuple[dict[str, tuple], int]:
    """The parsed wire header of each encoded entry, and the bytes the batch decodes to."""
    headers, total = {}, 0
    for name, t in batch.items():
        if name.endswith(SUFFIX):
            continue
        header = batch.get(name + SUFFIX)
        if header is None:
            total += t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0
        else:
            headers[name] = _read_header(name, t, header, max_bytes)
            b, c, h, w = headers[name][1]
            total += b * c * h * w
    return headers, total


def _check_size(what: str, n: int, max_bytes: int) -> None:
    if max_bytes and n > max_bytes:
        raise ProtocolError(f"{what} decodes to {n} bytes, more than the max_batch_bytes={max_bytes} the data servers "
                            "announced (a corrupt batch, or servers started with a larger --max-batch-bytes than "
                            "they announce: start them all with one that holds the decoded batch)")
    if not max_bytes and n > MAX_DECODED_BYTES:
        raise ProtocolError(f"{what} decodes past {MAX_DECODED_BYTES} bytes ({n}: a corrupt batch)")


def _decode(name: str, payload: torch.Tensor, parsed, device, expect, cuda_decode) -> torch.Tensor:
    enc, (b, c, h, w), sizes = parsed
    if expect is not None and enc != expect:
        raise ProtocolError(f"tensor {name!r} arrived as {enc.name!r}, but the servers announced {expect.name!r}")
    if enc.kind == UP_ZSTD:
        return _unzstd(name, payload, (b, c, h, w))
    parts = list(torch.split(payload, sizes))
    for i, part in enumerate(parts):
        dims = jpeg_dims(part)
        if dims != (h, w, c):
            raise ProtocolError(f"tensor {name!r}: JPEG {i} is {dims} (height, width, channels), header says {(h, w, c)}")
    try:
        images = cuda_decode(parts, device) if device is not None and device.type == "cuda" else jpeg_decode_cpu(parts)
    except RuntimeError as exc:  # corrupt entropy-coded data behind a valid header
        raise ProtocolError(f"tensor {name!r}: its JPEGs do not decode: {exc}") from None
    if any(tuple(im.shape) != (c, h, w) for im in images):
        raise ProtocolError(f"tensor {name!r}: JPEGs decoded to shapes other than {[c, h, w]}")
    # contiguous [B, C, H, W] as the uint8 batch would be (libjpeg's pixels are interleaved: the
    # stack re-lays them out), so a model that flattens or views the batch sees no difference
    return torch.stack(images)


def _read_header(name: str, payload: torch.Tensor, header: torch.Tensor, max_bytes: int = 0):
    if (header.dtype != torch.int64 or header.dim() != 1 or header.numel() < _HEADER
            or header.numel() > _HEADER + max(1, payload.numel()) or payload.dtype != torch.uint8
            or payload.dim() != 1):
        raise ProtocolError(f"tensor {name!r}: malformed wire header {list(header.shape)} {header.dtype} or payload "
                            f"{list(payload.shape)} {payload.dtype}")
    values = header.tolist()
    kind_id, quality, b, c, h, w, k = values[:_HEADER]
    sizes = values[_HEADER:]
    kind = _KIND_NAMES.get(kind_id)
    if kind is None:
        raise ProtocolError(f"tensor {name!r}: unknown wire encoding id {kind_id}")
    if kind == JPEG and not 1 <= quality <= 100:
        raise ProtocolError(f"tensor {name!r}: JPEG quality {quality} outside 1..100")
    if min(b, c, h, w) < 1:
        raise ProtocolError(f"tensor {name!r}: shape {[b, c, h, w]} is empty")
    _check_size(f"tensor {name!r}: shape {[b, c, h, w]}", b * c * h * w, max_bytes)
    if k != len(sizes) or k != (b if kind == JPEG else 1) or min(sizes) < 0 or sum(sizes) != payload.numel():
        raise ProtocolError(f"tensor {name!r}: {k} part sizes {sizes[:8]} do not cover the {payload.numel()}-byte "
                            f"payload of {b} images")
    return WireEncoding(kind, quality if kind == JPEG else 0), (b, c, h, w), sizes


def _unzstd(name: str, payload: torch.Tensor, shape: tuple[int, int, int, int]) -> torch.Tensor:
    import zstandard

    n = shape[0] * shape[1] * shape[2] * shape[3]
    data = payload.numpy().data
    try:
        announced = zstandard.frame_content_size(data)
        if announced != n:  # checked before decompressing: no decompression bombs
            raise ProtocolError(f"tensor {name!r}: zstd frame holds {announced} bytes, header says {n}")
        raw = zstandard.ZstdDecompressor().decompress(data, max_output_size=n)
    except zstandard.ZstdError as exc:
        raise ProtocolError(f"tensor {name!r}: cannot decompress its up-zstd bytes: {exc}") from None
    if len(raw) != n:
        raise ProtocolError(f"tensor {name!r}: zstd frame decompressed to {len(raw)} bytes, header says {n}")
    diff = np.frombuffer(raw, dtype=np.uint8).reshape(shape)
    return torch.from_numpy(np.cumsum(diff, axis=2, dtype=np.uint8))  # the running sum mod 256 undoes the filter


_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


def jpeg_dims(data: torch.Tensor | bytes) -> tuple[int, int, int] | None:
    """(height, width, components) from a JPEG's frame header, without decoding; None if there is none."""
    # numpy's stubs do not declare ndarray a buffer
    buf = memoryview(data.numpy() if isinstance(data, torch.Tensor) else data).cast("B")  # type: ignore[arg-type]
    if bytes(buf[:2]) != b"\xff\xd8":
        return None
    i = 2
    while i + 4 <= len(buf):
        if buf[i] != 0xFF:
            return None
        marker = buf[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:
            i += 2
            continue
        length = int.from_bytes(buf[i + 2:i + 4], "big")
        if marker in _SOF:
            if i + 10 > len(buf):
                return None
            return (int.from_bytes(buf[i + 5:i + 7], "big"), int.from_bytes(buf[i + 7:i + 9], "big"), buf[i + 9])
        if marker == 0xDA or length < 2:
            return None
        i += 2 + length
    return None
