import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import encode
from data_service.contract import tensor_layout
from data_service.errors import ConfigError, ProtocolError
from data_service.protocol.generated import pb


def roundtrip(batch):
    structure, metas, payload = encode(batch)
    header = pb.BatchHeader(structure=structure, tensors=metas, raw_bytes=len(payload), payload_bytes=len(payload))
    return tensor_layout.decode(header, payload), payload


@pytest.mark.parametrize("dtype", list(tensor_layout.DTYPES.values()))
def test_every_dtype_roundtrips_bit_exact(dtype):
    src = (torch.arange(24) % 7).to(dtype).reshape(2, 3, 4)
    out, _ = roundtrip({"x": src})
    assert out["x"].dtype == dtype and out["x"].shape == src.shape
    assert torch.equal(out["x"].view(torch.uint8) if dtype != torch.bool else out["x"],
                       src.view(torch.uint8) if dtype != torch.bool else src)


def test_structures_are_preserved():
    t = torch.ones(2)
    assert isinstance(roundtrip((t, t))[0], tuple)
    assert isinstance(roundtrip([t, t])[0], list)
    assert isinstance(roundtrip(t)[0], torch.Tensor)
    d, _ = roundtrip({"b": t, "a": torch.zeros(0, 3)})
    assert list(d) == ["b", "a"] and d["a"].shape == (0, 3)


def test_decode_makes_views_not_copies():
    out, payload = roundtrip({"x": torch.arange(1000, dtype=torch.float32)})
    payload[0:4] = b"\x00\x00\x80\x3f"  # 1.0f written into the buffer shows through the tensor
    assert out["x"][0].item() == 1.0


def test_non_contiguous_and_scalar_tensors():
    base = torch.arange(12.0).reshape(3, 4)
    out, _ = roundtrip({"t": base.t(), "s": torch.tensor(3)})
    assert torch.equal(out["t"], base.t()) and out["s"].item() == 3


def test_bad_batches_are_config_errors_naming_the_entry():
    with pytest.raises(ConfigError, match="'label'"):
        encode({"label": 3})
    with pytest.raises(ConfigError, match="str"):
        encode({1: torch.ones(1)})
    with pytest.raises(ConfigError, match="tensor"):
        encode("text")


def _header(**kw):
    meta = pb.TensorMeta(name=kw.pop("name", "x"), dtype=kw.pop("dtype", "float32"),
                         shape=kw.pop("shape", [2]), offset=kw.pop("offset", 0), nbytes=kw.pop("nbytes", 8))
    return pb.BatchHeader(structure=kw.pop("structure", pb.DICT), tensors=[meta], raw_bytes=kw.pop("raw", 8))


@pytest.mark.parametrize("header, match", [
    (_header(dtype="object"), "dtype"),
    (_header(shape=[3]), "needs 12 bytes"),
    (_header(offset=4), "outside"),
    (_header(offset=2, shape=[1], nbytes=4), "misaligned"),
    (_header(shape=[1 << 40, 1 << 40], nbytes=8), "needs"),
    (_header(shape=[1] * 40), "dims"),
    (_header(raw=16), "raw_bytes"),
    (_header(structure=pb.TUPLE, name="a"), "TUPLE"),
    (_header(structure=pb.TENSOR, name="a"), "TENSOR"),
])
def test_malformed_headers_are_protocol_errors(header, match):
    with pytest.raises(ProtocolError, match=match):
        tensor_layout.decode(header, bytearray(8))


def test_oversized_batch_is_refused():
    with pytest.raises(ProtocolError, match="max_batch_bytes"):
        tensor_layout.decode(_header(), bytearray(8), max_bytes=4)


@settings(max_examples=300, deadline=None)
@given(dtype=st.text(max_size=12) | st.sampled_from(sorted(tensor_layout.DTYPES)),
       shape=st.lists(st.integers(0, 1 << 62), max_size=20),
       offset=st.integers(0, 1 << 62), nbytes=st.integers(0, 1 << 62), buffer_len=st.integers(0, 256),
       structure=st.sampled_from([0, 1, 2, 3, 4, 99]), name=st.sampled_from(["", "0", "x"]))
def test_fuzzed_headers_never_crash_or_allocate(dtype, shape, offset, nbytes, buffer_len, structure, name):
    header = pb.BatchHeader(structure=structure, raw_bytes=buffer_len, tensors=[
        pb.TensorMeta(name=name, dtype=dtype, shape=shape, offset=offset, nbytes=nbytes)])
    try:
        out = tensor_layout.decode(header, bytearray(buffer_len))
    except ProtocolError:
        return
    tensors = [out] if isinstance(out, torch.Tensor) else list(out.values() if isinstance(out, dict) else out)
    assert sum(t.numel() * t.element_size() for t in tensors) <= buffer_len


def test_digest_depends_on_bytes_names_and_shape():
    a = {"x": torch.arange(4)}
    assert tensor_layout.batch_digest(a) == tensor_layout.batch_digest({"x": torch.arange(4)})
    assert tensor_layout.batch_digest(a) != tensor_layout.batch_digest({"y": torch.arange(4)})
    assert tensor_layout.batch_digest(a) != tensor_layout.batch_digest({"x": torch.arange(4).reshape(2, 2)})
    assert tensor_layout.batch_digest(a) != tensor_layout.batch_digest({"x": torch.tensor([0, 1, 2, 4])})
    assert tensor_layout.batch_digest({"b": torch.ones(2, dtype=torch.bfloat16)})
