"""What the network lets a data group deliver, in images: the capacity model's network
(:mod:`launcher.capacity`) for the planner, and the wire encodings' bytes and CPU per image.

The model (images per second, all consumers together; :func:`deliverable`):

* a data node builds ``cores x per_core_images_s`` images/s and its NIC carries
  ``baseline_gbps * goodput / (8 * bytes_per_image)`` of them; it delivers the smaller;
* each consumer (rank) keeps one connection (one TCP flow) to each data server, and one flow is
  capped at :data:`SINGLE_FLOW_GBPS` outside a cluster placement group
  (:data:`PLACEMENT_GROUP_FLOW_GBPS` inside one; EC2 user guide, "Amazon EC2 instance network
  bandwidth"), so a data node sends at most ``consumers x flow`` however wide its NIC;
* the DNN nodes' NICs bound what all their ranks receive together
  (``dnn_nodes x dnn_nic_gbps``); a DNN node's own data server (``local_images_s``) sends over
  no NIC.

The *binding resource* is the term that sets the rate: ``"cores"``, ``"data NIC"``, ``"DNN NIC"``
or ``"flow"``. A NIC's *baseline* is what it sustains; the "up to" burst lasts minutes on
credits, so a job that trains for hours is sized on the baseline.

Bytes per image are what the data servers count on the wire (their ``bytes_sent`` over the
samples in ``batches_sent``), or, before a job has run, the uint8 crop: ``crop x crop x 3``.
A wire encoding (``WIRE_ENCODINGS``) scales those bytes and adds CPU per image on the data node.

Example:
    >>> d = deliverable(cores=4, per_core_images_s=650, bytes_per_image=150_528, data_nic_gbps=1.25)
    >>> d.binding, round(d.items_s)
    ('data NIC', 1038)
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from launcher import capacity
from launcher.capacity import BINDINGS, NETWORK_BINDINGS, PLACEMENT_GROUP_FLOW_GBPS, SINGLE_FLOW_GBPS

UINT8_CROP_BYTES = 224 * 224 * 3  # one 224 x 224 RGB uint8 crop: 150,528 bytes


class NetworkError(ValueError):
    """A network figure the model cannot use (naming the value and what it should be)."""


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
WIRE_BYTES_RATIO = {name: w.bytes_ratio for name, w in WIRE_ENCODINGS.items()}


def canonical_wire(name: str) -> str:
    """``name`` as servers announce it (``JPEG`` -> ``jpeg:90``), parsed as the pipelines parse it.

    Raises:
        NetworkError: a name the pipelines refuse, naming it and the accepted forms.
    """
    from data_service.contract import wire_encoding as contract  # imports torch: only when a name is parsed
    from data_service.errors import ConfigError

    try:
        return contract.parse(name).name
    except ConfigError as exc:
        raise NetworkError(str(exc)) from None


def wire_encoding(name: str, bytes_measured: bool = False) -> WireEncoding:
    """The encoding called ``name``, in any case the pipelines accept.

    Args:
        bytes_measured: the bytes per sample were measured with this encoding, so a JPEG quality
            without a stored bytes ratio is usable (its ``bytes_ratio`` is None; its CPU is jpeg:90's).

    Raises:
        NetworkError: a name the pipelines refuse, or one without a stored bytes ratio when the
            bytes were not measured (listing the stored ones).
    """
    canonical = canonical_wire(name)
    known = WIRE_ENCODINGS.get(canonical)
    if known is not None:
        return known
    if not bytes_measured:
        raise NetworkError(f"wire encoding {name!r} has no measured bytes ratio; known: {', '.join(WIRE_ENCODINGS)} "
                           "(or give the bytes per sample measured on the wire: --bytes-per-sample or --metrics)")
    # JPEG's CPU per image hardly moves with the quality (jpeg:75..95 were measured alike)
    jpeg = WIRE_ENCODINGS[COMPACT]
    return WireEncoding(canonical, None, jpeg.encode_s, jpeg.decode_s, "bytes as measured; CPU as jpeg:90's")


Delivery = capacity.Delivery


def gbps_to_images(gbps: float, bytes_per_image: float, goodput: float = 1.0) -> float:
    """Images/s a link of ``gbps`` (1e9 bit/s) carries at ``bytes_per_image``."""
    return capacity.gbps_to_items(gbps, bytes_per_image, goodput)


def images_to_gbps(images_per_s: float, bytes_per_image: float) -> float:
    """Gbps ``images_per_s`` images of ``bytes_per_image`` need."""
    return capacity.items_to_gbps(images_per_s, bytes_per_image)


def deliverable(cores: float, per_core_images_s: float, bytes_per_image: float, data_nic_gbps: float | None, *,
                data_nodes: int = 1, consumers: int = 1, dnn_nic_gbps: float | None = None, dnn_nodes: int = 1,
                flow_gbps: float | None = None, goodput: float = 1.0, local_images_s: float = 0.0) -> Delivery:
    """Images/s ``data_nodes`` data nodes deliver to ``consumers`` ranks, and the binding resource
    (:func:`launcher.capacity.remote`, in images).

    Args:
        cores: cores building images on ONE data node.
        per_core_images_s: images one core builds per second (wire encoding included).
        bytes_per_image: bytes one image takes on the wire.
        data_nic_gbps: one data node's NIC baseline (None: not limited).
        data_nodes: data nodes, all alike.
        consumers: ranks taking batches; each keeps one flow to each data node.
        dnn_nic_gbps: one DNN node's NIC baseline (None: not limited); ``dnn_nodes`` of them.
        flow_gbps: one flow's cap (:data:`SINGLE_FLOW_GBPS`, or :data:`PLACEMENT_GROUP_FLOW_GBPS`
            in a cluster placement group; None: not limited).
        goodput: share of a link's Gbps that carries payload (TCP/IP and framing take the rest).
        local_images_s: images/s the DNN nodes' own data servers add without crossing a NIC.

    Raises:
        NetworkError: a figure out of range (naming it).
    """
    for name, value in (("cores", cores), ("per_core_images_s", per_core_images_s),
                        ("bytes_per_image", bytes_per_image)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise NetworkError(f"{name}={value!r} must be a positive number")
    for name, value in (("data_nodes", data_nodes), ("consumers", consumers), ("dnn_nodes", dnn_nodes)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise NetworkError(f"{name}={value!r} must be an integer >= 1")
    if not local_images_s >= 0:
        raise NetworkError(f"local_images_s={local_images_s!r} must be >= 0")
    layout = capacity.Layout(consumers, 1.0, capacity.uniform(data_nodes, cores * per_core_images_s),
                             network=capacity.Network(bytes_per_image, data_nic_gbps, dnn_nic_gbps, flow_gbps, goodput),
                             dnn_nodes=dnn_nodes)
    try:
        layout.check()
    except capacity.CapacityError as exc:
        raise NetworkError(str(exc)) from None
    d = capacity.remote(layout)
    return Delivery(d.items_s + local_images_s, d.binding, {k: v + local_images_s for k, v in d.limits.items()})


def bytes_per_image_from_stats(bytes_sent: int, batches_sent: int, batch_size: int) -> float | None:
    """Bytes per image a data server measured on the wire (its stats), or None without a batch sent."""
    if batches_sent <= 0 or batch_size <= 0 or bytes_sent <= 0:
        return None
    return bytes_sent / (batches_sent * batch_size)


def uint8_bytes(options: dict) -> int:
    """Bytes of one uint8 crop from a pipeline's options (``crop_size`` / ``image_size``, default 224)."""
    size = options.get("crop_size") or options.get("image_size") or 224
    try:
        side = int(size)
    except (TypeError, ValueError):
        raise NetworkError(f"crop size {size!r} in the pipeline options must be an integer number of pixels") from None
    return side * side * 3


__all__ = ["BINDINGS", "NETWORK_BINDINGS", "Delivery", "NetworkError", "PLACEMENT_GROUP_FLOW_GBPS", "SINGLE_FLOW_GBPS",
           "UINT8_CROP_BYTES", "COMPACT", "WIRE_BYTES_RATIO", "WIRE_ENCODINGS", "WireEncoding", "bytes_per_image_from_stats",
           "canonical_wire", "deliverable", "gbps_to_images", "images_to_gbps", "uint8_bytes", "wire_encoding"]
