"""Fused crop-and-decode: the same boxes as torchvision, the same pixels at full scale, odd files as before."""
from __future__ import annotations

import io
import logging

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.transforms import v2

from data_service.contract.pipeline import build_batch, seed_everything
from data_service.pipelines import crop_decode, images
from data_service.pipelines.crop_decode import BoxDraw, CropDecode, dct_scale
from data_service.pipelines.images import Augment, CorruptImageError, FusedAugment, decode_bytes

from _odd_images import _photo, write_odd_folder

needs_ext = pytest.mark.skipif(not crop_decode.available(), reason="the compiled crop decoder is not built")


def _jpeg(w: int, h: int, seed: int, **kw) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(_photo(w, h, seed)).save(buf, format="JPEG", **({"quality": 90} | kw))
    return buf.getvalue()


def _classic(data: bytes, seed: int, size: int = 224, min_scale: float = 0.08) -> torch.Tensor:
    seed_everything(seed)
    return Augment(size, min_scale)((decode_bytes(data, "x"), 0))[0]


def _fused(data: bytes, seed: int, size: int = 224, min_scale: float = 0.08, dct_scaling: str = "none",
           op: CropDecode | None = None) -> torch.Tensor:
    seed_everything(seed)
    op = op or CropDecode(size, min_scale, decode_bytes, dct_scaling)
    return op(((data, "x"), 0))[0]


@pytest.mark.parametrize("hw", [(375, 500), (500, 333), (1, 1), (7, 3000), (3000, 7), (224, 224), (1200, 1600)])
def test_boxes_are_torchvisions_for_the_same_seed(hw):
    h, w = hw
    reference = v2.RandomResizedCrop(224, scale=(0.08, 1.0))
    draw = BoxDraw((0.08, 1.0))
    for seed in range(200):
        torch.manual_seed(seed)
        want = reference.make_params([torch.empty(3, h, w, dtype=torch.uint8)])
        want_next = torch.rand(1)
        torch.manual_seed(seed)
        top, left, bh, bw = draw(h, w)
        assert (top, left, bh, bw) == (want["top"], want["left"], want["height"], want["width"])
        assert torch.equal(torch.rand(1), want_next)  # the generator is left where torchvision leaves it


def test_dct_scale_is_the_smallest_power_of_two_that_keeps_the_size():
    assert dct_scale(447, 900, 224) == 8
    assert dct_scale(448, 900, 224) == 4
    assert dct_scale(895, 1000, 224) == 4
    assert dct_scale(896, 1000, 224) == 2
    assert dct_scale(1792, 1792, 224) == 1
    assert dct_scale(1, 1, 224) == 8


@needs_ext
@pytest.mark.parametrize("subsampling", [0, 1, 2])  # 4:4:4, 4:2:2, 4:2:0
def test_full_scale_pixels_are_bit_identical_to_the_classic_recipe(subsampling):
    op = CropDecode(224, 0.08, decode_bytes, "none")
    for seed in range(40):
        data = _jpeg(300 + 7 * seed, 200 + 5 * seed, seed, subsampling=subsampling)
        assert torch.equal(_fused(data, seed, op=op), _classic(data, seed)), seed
    assert op.counts == {"fused": 40, "whole": 0}


@needs_ext
def test_dct_scaled_crops_look_the_same_as_the_classic_recipe():
    # Large crops of large images: decoded at 1/2 or 1/4 scale, then resized. Bound: PSNR >= 30 dB
    # and mean absolute error <= 3 levels of 255 against the whole decode + antialiased resize.
    op = CropDecode(224, 0.5, decode_bytes, "pow2")
    scaled = 0
    for seed in range(12):
        data = _jpeg(1600, 1200, seed)
        a, b = _fused(data, seed, min_scale=0.5, op=op).float(), _classic(data, seed, min_scale=0.5).float()
        mse = float(((a - b) ** 2).mean())
        assert 10 * np.log10(255 ** 2 / max(mse, 1e-9)) >= 30.0, seed
        assert float((a - b).abs().mean()) <= 3.0, seed
        scaled += not torch.equal(a, b)
    assert scaled >= 10  # the scaled path was taken


@needs_ext
def test_odd_files_behave_as_with_the_whole_decode(tmp_path):
    files = write_odd_folder(tmp_path)
    op = CropDecode(64, 0.08, decode_bytes, "none")
    for kind, path in files.items():
        data = path.read_bytes()
        if kind in ("corrupt", "empty"):
            with pytest.raises(CorruptImageError) as fused_err:
                _fused(data, 1, 64, op=op)
            with pytest.raises(CorruptImageError) as whole_err:
                _classic(data, 1, 64)
            assert str(fused_err.value) == str(whole_err.value)
            continue
        assert torch.equal(_fused(data, 3, 64, op=op), _classic(data, 3, 64)), kind
    whole = {k: v for k, v in op.counts.items() if k.startswith("whole:")}
    # PNGs (three of them, one named .JPEG) and the CMYK JPEG are decoded whole, and counted
    assert whole["whole: not a JPEG"] >= 3 and whole["whole: CMYK/YCCK"] == 1, op.counts
    assert op.counts["fused"] == 4  # gray, progressive, tiny, huge


@needs_ext
def test_corrupt_entropy_data_falls_back_to_the_whole_decoders_verdict():
    data = bytearray(_jpeg(400, 300, 5))
    start = data.index(b"\xff\xda")  # start of scan
    for i in range(start + 40, start + 400, 7):
        data[i] ^= 0x5A
    data = bytes(data)
    op = CropDecode(64, 0.08, decode_bytes, "none")
    for seed in range(10):
        try:
            want = _classic(data, seed, 64)
        except CorruptImageError as exc:
            with pytest.raises(CorruptImageError, match=str(exc)[:30]):
                _fused(data, seed, 64, op=op)
            continue
        assert torch.equal(_fused(data, seed, 64, op=op), want)
    assert op.counts.get("whole: corrupt data", 0) >= 1, op.counts


def test_without_the_compiled_part_every_image_is_decoded_whole(monkeypatch, caplog):
    monkeypatch.setattr(crop_decode, "_jpegcrop", None)
    op = CropDecode(96, 0.08, decode_bytes, "pow2")
    with caplog.at_level(logging.WARNING, logger=crop_decode.__name__):
        for seed in range(5):
            data = _jpeg(320, 240, seed)
            assert torch.equal(_fused(data, seed, 96, op=op), _classic(data, seed, 96))
    assert op.counts == {"fused": 0, "whole": 5, "whole: not built": 5}
    assert sum("libjpeg-dev" in r.message for r in caplog.records) == 1


def test_fused_augment_skips_corrupt_files_when_asked(tmp_path):
    from data_service import SkipSample

    data = _jpeg(100, 80, 1)[:150]
    with pytest.raises(SkipSample, match="does not decode"):
        FusedAugment(32, 0.08, on_corrupt="skip")(((data, "bad.jpg"), 0))
    with pytest.raises(CorruptImageError, match="bad.jpg.*on_corrupt=skip"):
        FusedAugment(32, 0.08)(((data, "bad.jpg"), 0))


@pytest.mark.parametrize("bad, message", [({"decode": "gpu"}, "decode='gpu' must be 'fused'"),
                                          ({"dct_scaling": "any"}, "dct_scaling='any' must be 'pow2'")])
def test_bad_decode_options_are_named(tmp_path, bad, message):
    from data_service.errors import ConfigError

    write_odd_folder(tmp_path)
    with pytest.raises(ConfigError, match=message):
        images.build_pipeline(data_dir=str(tmp_path / "plain"), batch_size=2, **bad)


@needs_ext
def test_fused_and_whole_pipelines_build_the_same_batches(tmp_path):
    root = tmp_path / "img"
    for c in range(2):
        (root / f"c{c}").mkdir(parents=True)
        for i in range(6):
            (root / f"c{c}" / f"{i}.jpg").write_bytes(_jpeg(260 + 10 * i, 200, 10 * c + i))
    kw = dict(data_dir=str(root), batch_size=4, image_size=64)
    fused = images.build_pipeline(decode="fused", dct_scaling="none", **kw)
    whole = images.build_pipeline(decode="whole", **kw)
    for index in range(3):
        a = build_batch(fused, fused.epoch_shape(), 7, 1, index)
        b = build_batch(whole, whole.epoch_shape(), 7, 1, index)
        assert torch.equal(a["image"], b["image"]) and torch.equal(a["label"], b["label"])
    assert fused.transform.counts["fused"] == 12
