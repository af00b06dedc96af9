"""What one sample takes on the wire: the wire encodings' bytes and CPU per image, and the bytes per
sample a plan prices (measured by a finished job's data servers, given, profiled, or the uint8 crop).

The network itself (each data node's NIC baseline, one flow's cap per rank and server, the DNN
nodes' NICs) is the capacity model's (:mod:`launcher.capacity`). One flow is capped at
:data:`SINGLE_FLOW_GBPS` outside a cluster placement group (:data:`PLACEMENT_GROUP_FLOW_GBPS`
inside one; EC2 user guide, "Amazon EC2 instance network bandwidth"). A NIC's *baseline* is what
it sustains; the "up to" burst lasts minutes on credits, so a job that trains for hours is sized
on the baseline.

Bytes per image are what the data servers count on the wire (their ``bytes_sent`` over the
samples in ``batches_sent``), or, before a job has run, the uint8 crop: ``crop x crop x 3``.
A wire encoding (``WIRE_ENCODINGS``) scales those bytes and adds CPU per image on the data node.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from launcher import capacity
from launcher.capacity import PLACEMENT_GROUP_FLOW_GBPS, SINGLE_FLOW_GBPS, PlanError, positive, whole

UINT8_CROP_BYTES = 224 * 224 * 3  # one 224 x 224 RGB uint8 crop: 150,528 bytes


@dataclass(frozen=True)
class WireEncoding:
    """How a sample travels: bytes against the uint8 crop, and the CPU it costs per image.

    Args:
        name: the encoding's name as the job option spells it.
        bytes_ratio: bytes on the wire over the uint8 crop's bytes (None: no stored figure).
        encode_s: data-node CPU seconds added per image (on one core).
        decode_s: DNN-node seconds per image to turn it back into uint8 (CPU; ~0 on a GPU decoder).
        source: where the figures come from.
    """

    name: str
    bytes_ratio: float | None  # None: not measured here, so only bytes measured on the wire can size it
    encode_s: float = 0.0
    decode_s: float = 0.0
    source: str = ""


# Measured with the wire encodings (data_service/contract/wire_encoding.py) by benchmarks/wire.py on 640 crops of 224 px from
# photo-like JPEGs, one core, 2026-11-26 (docs/benchmarks.md, "Wire encodings"): bytes over uint8's (headers
# included), data-node CPU added per image, DNN-side CPU decode per image (libjpeg-turbo; a GPU decoder takes little).
_MEASURED = "benchmarks/wire.py, 640 photo crops of 224 px, one core, 2026-11-26"
_JPEG_CPU = "; encode/decode CPU as jpeg:90's"
WIRE_ENCODINGS: dict[str, WireEncoding] = {
    "uint8": WireEncoding("uint8", 1.0, 0.0, 0.0, "the uint8 crop as built"),
    "up-zstd": WireEncoding("up-zstd", 0.536, 0.00041, 0.00025, _MEASURED + "; lossless"),
    "jpeg:75": WireEncoding("jpeg:75", 0.054, 0.00024, 0.00027, _MEASURED + _JPEG_CPU + "; PSNR 36.7 dB"),
    "jpeg:85": WireEncoding("jpeg:85", 0.071, 0.00024, 0.00027, _MEASURED + _JPEG_CPU + "; PSNR 38.5 dB"),
    "jpeg:90": WireEncoding("jpeg:90", 0.088, 0.00024, 0.00027, _MEASURED + "; PSNR 40.05 dB"),
    "jpeg:95": WireEncoding("jpeg:95", 0.124, 0.00024, 0.00027, _MEASURED + _JPEG_CPU + "; PSNR 42.5 dB"),
}
COMPACT = capacity.COMPACT_WIRE  # the compact encoding the planner recommends when the network binds


def canonical_wire(name: str) -> str:
    """``name`` as servers announce it (``JPEG`` -> ``jpeg:90``), parsed as the pipelines parse it.

    Raises:
        PlanError: a name the pipelines refuse, naming it and the accepted forms.
    """
    from data_service.contract import wire_encoding as contract  # imports torch: only when a name is parsed
    from data_service.errors import ConfigError

    try:
        return contract.parse(name).name
    except ConfigError as exc:
        raise PlanError(str(exc)) from None


def wire_encoding(name: str, bytes_measured: bool = False) -> WireEncoding:
    """The encoding called ``name``, in any case the pipelines accept.

    Args:
        bytes_measured: the bytes per sample were measured with this encoding, so a JPEG quality
            without a stored bytes ratio is usable (its ``bytes_ratio`` is None; its CPU is jpeg:90's).

    Raises:
        PlanError: a name the pipelines refuse, or one without a stored bytes ratio when the
            bytes were not measured (listing the stored ones).
    """
    canonical = canonical_wire(name)
    known = WIRE_ENCODINGS.get(canonical)
    if known is not None:
        return known
    if not bytes_measured:
        raise PlanError(f"wire encoding {name!r} has no measured bytes ratio; known: {', '.join(WIRE_ENCODINGS)} "
                        "(or give the bytes per sample measured on the wire: --bytes-per-sample or --metrics)")
    # JPEG's CPU per image hardly moves with the quality (jpeg:75..95 were measured alike)
    jpeg = WIRE_ENCODINGS[COMPACT]
    return WireEncoding(canonical, None, jpeg.encode_s, jpeg.decode_s, "bytes as measured; CPU as jpeg:90's")


def bytes_per_image_from_stats(bytes_sent: int, batches_sent: int, batch_size: int) -> float | None:
    """Bytes per image a data server measured on the wire (its stats), or None without a batch sent."""
    if batches_sent <= 0 or batch_size <= 0 or bytes_sent <= 0:
        return None
    return bytes_sent / (batches_sent * batch_size)


def metrics_bytes(path: Path, batch_size: int | None) -> tuple[float, str]:
    """(bytes per sample, wire encoding) a finished job's data nodes measured: their ``bytes_sent`` over
    ``batches_sent`` x the batch size (``batch_size``, else the job's ``pipeline_options``).

    Raises:
        PlanError: unreadable file, a field that is not a whole number, or no data node that sent a batch.
    """
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise PlanError(f"--metrics {path}: cannot read it ({exc})") from None
    if not isinstance(doc, dict):
        raise PlanError(f"--metrics {path}: expected a job's metrics.json object, got {type(doc).__name__}")
    fix = "a JSON integer, not a string; fix the file or give --bytes-per-sample"
    nodes = [n for n in doc.get("nodes") or [] if isinstance(n, dict) and "bytes_sent" in n]
    for node in nodes:
        for key in ("bytes_sent", "batches_sent"):
            whole(f"--metrics {path}: {key} of node {node.get('host', '?')}", node.get(key, 0), low=0, fix=fix)
    options = doc.get("pipeline_options")
    batch = batch_size or whole(f"--metrics {path}: pipeline_options.batch_size",
                                (options.get("batch_size") if isinstance(options, dict) else None) or 0, low=0, fix=fix)
    per_sample = bytes_per_image_from_stats(sum(n["bytes_sent"] for n in nodes),
                                            sum(n.get("batches_sent", 0) for n in nodes), batch)
    if per_sample is None:
        raise PlanError(f"--metrics {path}: no data node with bytes_sent and batches_sent (a heterogeneous job's "
                        "metrics.json has them under 'nodes'), or no batch size: give --batch-size")
    return per_sample, str(doc.get("wire_encoding") or "uint8")


@dataclass(frozen=True)
class WireBytes:
    """What one sample of a plan takes on the wire: its bytes (None: the network is not modelled),
    the job's wire encoding, and where the bytes come from."""

    bytes_per_sample: float | None
    wire: WireEncoding
    source: str = ""


def wire_bytes(wire: str, *, modelled: bool = True, metrics: Path | None = None, batch_size: int | None = None,
               given: float | None = None, profiled: float | None = None, crop_side: int = 224) -> WireBytes:
    """The bytes per sample a plan prices, first found of: those a finished job's data servers measured
    (``metrics``, whose encoding replaces a ``wire`` of uint8), ``given``, those of the ``profiled``
    batches, else a uint8 crop of ``crop_side`` pixels times ``wire``'s stored bytes ratio.

    Args:
        wire: the job's wire encoding, the one the bytes and the preprocessing were measured with.
        modelled: False: the network is not modelled (no bytes).

    Raises:
        PlanError: an unknown encoding or a bad figure (naming it).
    """
    name = canonical_wire(wire)
    if metrics is not None and modelled:
        per_sample, measured_wire = metrics_bytes(metrics, batch_size)
        if name == "uint8":
            name = canonical_wire(measured_wire)
        return WireBytes(per_sample, wire_encoding(name, bytes_measured=True),
                         f"measured by the data servers of {metrics.name}")
    # measured bytes need no stored ratio for the encoding they were measured with
    enc = wire_encoding(name, bytes_measured=not modelled or given is not None or bool(profiled))
    if not modelled:
        return WireBytes(None, enc)
    if given is not None:
        return WireBytes(positive("--bytes-per-sample", given), enc, "measured, --bytes-per-sample")
    if profiled:
        return WireBytes(profiled, enc, "the profiled batches' tensors")
    side = whole("crop size", crop_side, fix="give --crop-size (or -o image_size) in pixels")
    ratio = cast(float, enc.bytes_ratio)  # bytes not measured: wire_encoding gave a stored encoding, with a ratio
    return WireBytes(side * side * 3 * ratio, enc, f"assumed: a {side}x{side}x3 uint8 crop"
                     + (f" x {ratio:g} for {enc.name}" if enc.name != "uint8" else "")
                     + "; give --bytes-per-sample as measured, or --profile")


__all__ = ["COMPACT", "PLACEMENT_GROUP_FLOW_GBPS", "SINGLE_FLOW_GBPS", "UINT8_CROP_BYTES",
           "WIRE_ENCODINGS", "WireBytes", "WireEncoding", "bytes_per_image_from_stats", "canonical_wire",
           "metrics_bytes", "wire_bytes", "wire_encoding"]
