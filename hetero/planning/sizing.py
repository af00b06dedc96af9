"""A sizing table for ResNet-50-class training: for each GPU instance, the cheapest data group per wire.

For every DNN instance type with a known per-GPU training rate, and every wire encoding, the
planner (:func:`hetero.planning.planner.plan`, network included) picks the cheapest data group
that keeps data wait under the target; the table gives it with its binding resource, the images
per second it predicts and the $ of one ImageNet-1k epoch (1,281,167 images).

Inputs, all stated in the table's header:

* per-GPU training rates (images/s) of a model (:data:`MODELS`): ResNet-50 v1.5 with AMP and DALI
  from NVIDIA's DeepLearningExamples (PyTorch), and a light model at a stated multiple of it;
* the data side's per-core rate: images one core crops and decodes per second
  (:data:`PER_CORE_IMAGES_S`, measured here), plus each wire encoding's CPU per image;
* bytes per image: the 224 px uint8 crop (150,528 bytes) times the encoding's ratio.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from launcher.capacity import Binding, usd_for

from .cost import PriceTable
from .network import SINGLE_FLOW_GBPS, UINT8_CROP_BYTES, wire_encoding
from .planner import Workload, plan

IMAGENET_TRAIN_IMAGES = 1_281_167
BATCH_PER_GPU = 256
# One pinned core of the 2-core development VM, fused crop-and-decode of 1,500 photo-like JPEGs to batches of 32
# uint8 crops of 224 px (docs/benchmarks.md: python -m benchmarks.decode ... --only fused,..., 2026-11-26).
PER_CORE_IMAGES_S = 1144.0
PER_CORE_SOURCE = ("fused crop-and-decode of photo-like JPEGs to 224 px uint8 crops, one pinned core of the 2-core "
                   "development VM, `python -m benchmarks.decode`, 2026-11-26 (docs/benchmarks.md); one vCPU is "
                   "taken to do as much, which a fully loaded instance's hyperthreads may not")


@dataclass(frozen=True)
class Model:
    """Per-GPU training images/s of one model, by GPU, with the source."""

    name: str
    rates: dict[str, float]
    source: str


RESNET50 = Model("ResNet-50 v1.5 (AMP)", {"V100": 1200.0, "V100-32GB": 1200.0, "A100": 2470.0, "A100-80GB": 2470.0},
                 "NVIDIA DeepLearningExamples, PyTorch ResNet-50 v1.5 with DALI: V100-16GB ~1,200 images/s, "
                 "A100-80GB ~2,470 per GPU")
LIGHT_FACTOR = 4.0
LIGHT = Model(f"light model ({LIGHT_FACTOR:g}x ResNet-50's rate)",
              {gpu: LIGHT_FACTOR * r for gpu, r in RESNET50.rates.items()},
              f"assumed: a ResNet-18/MobileNet-class network at {LIGHT_FACTOR:g}x ResNet-50's per-GPU rate (not a "
              "published figure)")
MODELS = (RESNET50, LIGHT)
DNN_TYPES = ("ml.p3.2xlarge", "ml.p3.8xlarge", "ml.p3.16xlarge", "ml.p3dn.24xlarge", "ml.p4d.24xlarge",
             "ml.p4de.24xlarge")
WIRES = ("uint8", "jpeg:90")


@dataclass(frozen=True)
class SizingRow:
    """One DNN instance, model and wire: the data group and what it costs."""

    model: str
    dnn_instance: str
    gpus: int
    wire: str
    data_group: str
    binding: Binding
    images_per_s: float
    demand_images_s: float
    usd_per_hour: float
    usd_per_epoch: float
    homogeneous_usd_per_epoch: float
    meets_target: bool
    homogeneous_binding: Binding
    homogeneous_meets_target: bool


def sizing(table: PriceTable, models: tuple[Model, ...] = MODELS, dnn_types: tuple[str, ...] = DNN_TYPES,
           wires: tuple[str, ...] = WIRES, data_types: tuple[str, ...] = (),
           per_core_images_s: float = PER_CORE_IMAGES_S, target_wait: float = 0.05, max_count: int = 32,
           flow_gbps: float | None = SINGLE_FLOW_GBPS) -> list[SizingRow]:
    """Every (model, DNN instance, wire) row of the sizing table.

    Raises:
        PlanError: an unknown type or encoding, a bad figure.
    """
    rows = []
    for model in models:
        for dnn in dnn_types:
            info = table.info(dnn)
            rate = model.rates.get(info.gpu)
            if rate is None:
                continue  # no published rate for this GPU
            gpu_step_s = BATCH_PER_GPU / rate
            for name in wires:
                enc = wire_encoding(name)
                p = plan(table, Workload(dnn, BATCH_PER_GPU / per_core_images_s, gpu_step_s, BATCH_PER_GPU,
                                         data_types=data_types, max_count=max_count, target_wait=target_wait,
                                         # a stored encoding (bytes not measured): it has a bytes ratio
                                         bytes_per_sample=UINT8_CROP_BYTES * cast(float, enc.bytes_ratio),
                                         encode_s=enc.encode_s, flow_gbps=flow_gbps, wire=enc.name))
                best = p.data_group or min(p.candidates, key=lambda c: (c.step_s, c.usd_per_step))
                per_s = info.gpus * BATCH_PER_GPU / best.step_s
                homo_per_s = info.gpus * BATCH_PER_GPU / p.homogeneous.step_s
                rows.append(SizingRow(model.name, dnn, info.gpus, enc.name, best.label, best.binding, per_s,
                                      info.gpus * rate, best.usd_per_hour,
                                      usd_for(best.usd_per_hour, IMAGENET_TRAIN_IMAGES / per_s),
                                      usd_for(p.homogeneous.usd_per_hour, IMAGENET_TRAIN_IMAGES / homo_per_s),
                                      best.meets_target, p.homogeneous.binding, p.homogeneous.meets_target))
    return rows


def format_sizing(rows: list[SizingRow], table: PriceTable, per_core_images_s: float = PER_CORE_IMAGES_S,
                  target_wait: float = 0.05, flow_gbps: float | None = SINGLE_FLOW_GBPS,
                  per_core_source: str = PER_CORE_SOURCE) -> str:
    """The rows as Markdown, with every assumption in the header."""
    jpeg = wire_encoding("jpeg:90")
    lines = [f"Per-core rate: {per_core_images_s:,.0f} images/s per vCPU ({per_core_source}); jpeg:90 adds "
             f"{jpeg.encode_s * 1000:.2f} ms per image on the data node and carries {jpeg.bytes_ratio:.3f} of uint8's "
             f"{UINT8_CROP_BYTES:,} bytes ({jpeg.source}). Batch {BATCH_PER_GPU} per GPU; data wait <= "
             f"{target_wait:.0%}; one flow <= {flow_gbps:g} Gbps; NIC baselines and prices from the instance table "
             f"({table.region}, as of {table.as_of}); an epoch is {IMAGENET_TRAIN_IMAGES:,} images.",
             "Models: " + "; ".join(f"{m.name}: {m.source}" for m in MODELS) + ".", "",
             "The data group feeds the GPUs alone (the GPU instance builds nothing); the last column is the GPU "
             "instance alone, its own vCPUs building batches (one vCPU per GPU kept for the trainer).", "",
             "| model | DNN instance | GPUs | wire | GPUs take (images/s) | data group | binds | images/s | $/h | "
             "$/epoch | GPU instance alone: binds, $/epoch |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        group = r.data_group + ("" if r.meets_target else " (best; misses the target)")
        alone = f"{r.homogeneous_binding}, {r.homogeneous_usd_per_epoch:.2f}" + (
            "" if r.homogeneous_meets_target else " (misses the target)")
        lines.append(f"| {r.model} | {r.dnn_instance} | {r.gpus} | {r.wire} | {r.demand_images_s:,.0f} | {group} | "
                     f"{r.binding} | {r.images_per_s:,.0f} | {r.usd_per_hour:.2f} | {r.usd_per_epoch:.2f} | {alone} |")
    return "\n".join(lines)


__all__ = ["IMAGENET_TRAIN_IMAGES", "LIGHT", "MODELS", "Model", "PER_CORE_IMAGES_S", "RESNET50", "SizingRow",
           "format_sizing", "sizing"]
