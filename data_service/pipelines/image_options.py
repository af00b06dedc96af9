"""The image pipeline's options as one typed, checked value: :class:`ImageOptions`.

Every option is checked when the object is made; a bad one is a ConfigError that names the value
and what it must be. Sizes (``"20GB"``) are parsed once, and the values the pipeline derives (the
decoded side, the shuffle block in whole batches) are attributes.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields

from ..contract import wire as wire_encoding
from ..contract.on_corrupt import OnCorrupt
from ..errors import ConfigError, check_integer

# Shard reading: a shuffle block of this many batches, and this many blocks alternating
# (docs/shards.md, "Choosing the block size").
DEFAULT_BLOCK_BATCHES = 32
DEFAULT_INTERLEAVE = 8
FINISH_ON = {"device": "uint8 on the wire, normalised on the training device", "server": "float32 on the wire"}
DECODE = {"fused": "decode only the random crop", "whole": "decode every image whole, then crop"}
DCT_SCALING = {"pow2": "large crops decoded at 1/2, 1/4 or 1/8 scale", "none": "full scale"}
UNCHECKED = {"warn": "read it, saying so once per file", "refuse": "stop at start, naming the file and the fix"}


@dataclass(frozen=True)
class ImageOptions:
    """``build_pipeline``'s options (documented there), checked; the derived values as attributes.

    Attributes (derived): ``fused`` (``decode == "fused"``), ``decoded_budget`` and
    ``shard_cache_budget`` (bytes), ``side`` (short side of the decoded images kept), ``block``
    (samples per shuffle block, whole batches; 0 without ``shards``).

    Raises:
        ConfigError: an option of the wrong type or out of range, or two that do not go together.
    """

    batch_size: int = 32
    image_size: int = 224
    min_scale: float = 0.08
    on_corrupt: OnCorrupt = OnCorrupt.FAIL  # a name ("fail", "skip") is parsed once, at construction
    limit: int = 0
    data_dir: str | None = None
    drop_last: bool = True
    finish_on: str = "device"
    shards: str = ""
    shuffle_block: int = 0
    interleave: int = DEFAULT_INTERLEAVE
    cache_dir: str = ""
    cache_bytes: int | str = 0
    request_timeout_s: float = 60.0
    decode: str = "fused"
    dct_scaling: str = "pow2"
    decoded_cache_bytes: int | str = 0
    decoded_cache_dir: str = "/dev/shm"
    decoded_side: int = 0
    wire_encoding: str = "uint8"
    index: str = ""
    parquet: str = ""
    image_column: str = "image"
    label_column: str = "label"
    unchecked: str = "warn"
    fused: bool = field(init=False, repr=False)
    decoded_budget: int = field(init=False, repr=False)
    shard_cache_budget: int = field(init=False, repr=False)
    side: int = field(init=False, repr=False)
    block: int = field(init=False, repr=False)

    @classmethod
    def from_kwargs(cls, **kwargs) -> "ImageOptions":
        """The options from keyword arguments; an unknown name is a ConfigError listing the known ones."""
        known = {f.name for f in fields(cls) if f.init}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise ConfigError(f"unknown image pipeline option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        return cls(**kwargs)

    def __post_init__(self) -> None:
        from ..storage.parsing import parse_size

        check_integer("batch_size", self.batch_size, 1)
        check_integer("image_size", self.image_size, 8, 4096, " (pixels per side of the crop)")
        _number("min_scale", self.min_scale, "in (0, 1]: the smallest crop area as a share of the image",
                lambda x: 0 < x <= 1)
        object.__setattr__(self, "on_corrupt", OnCorrupt.parse(self.on_corrupt))
        _choice("finish_on", self.finish_on, FINISH_ON)
        check_integer("limit", self.limit, 0, hint=" (0 = every image)")
        _text("data_dir", self.data_dir, "a folder laid out as root/<class>/*.jpg (or unset: SM_CHANNEL_TRAINING)",
              optional=True)
        if not isinstance(self.drop_last, bool):
            raise ConfigError(f"drop_last={self.drop_last!r} must be true or false")
        _choice("decode", self.decode, DECODE)
        _choice("dct_scaling", self.dct_scaling, DCT_SCALING)
        check_integer("decoded_side", self.decoded_side, 0, hint=" (pixels; 0 = 1.15 x image_size)")
        _text("decoded_cache_dir", self.decoded_cache_dir, "a folder on a tmpfs such as /dev/shm")
        _text("shards", self.shards, "a folder of shards or an s3://bucket/prefix")
        _text("index", self.index, "the folder or s3:// prefix holding the shards' index.bin or the Parquet files' "
                                   "row checksums (hetero index --to)")
        _text("parquet", self.parquet, "a Parquet file, or a folder or s3:// prefix of .parquet files")
        _text("image_column", self.image_column, "the Parquet column of image bytes (binary, or a struct with bytes)")
        _text("label_column", self.label_column, "the Parquet column of integer labels")
        _choice("unchecked", self.unchecked, UNCHECKED)
        if self.index and not self.shards and not self.parquet:
            raise ConfigError(f"index={self.index!r} names where the shards' index (or the Parquet files' row "
                              "checksums) lives: pass shards= (the folder or s3:// prefix holding the tars) or parquet=")
        if self.shards and self.parquet:
            raise ConfigError(f"shards={self.shards!r} and parquet={self.parquet!r}: read one source; pass only one")
        check_integer("shuffle_block", self.shuffle_block, 0,
                      hint=f" (samples per shuffle block; 0 = {DEFAULT_BLOCK_BATCHES} batches)")
        check_integer("interleave", self.interleave, 1, hint=" (blocks whose batches alternate)")
        _text("cache_dir", self.cache_dir, "a writable folder (empty = HETERO_CACHE_DIR or the temporary folder)")
        _number("request_timeout_s", self.request_timeout_s, "a number of seconds > 0", lambda x: x > 0)
        wire = wire_encoding.parse(self.wire_encoding)  # ConfigError naming an unknown name or quality
        if wire.encoded and self.finish_on == "server":
            raise ConfigError(f"wire_encoding={self.wire_encoding!r} encodes uint8 images, but finish_on='server' sends "
                              "normalised float32; use finish_on='device' (the default) or wire_encoding='uint8'")
        derived = {
            "fused": self.decode == "fused",
            "decoded_budget": parse_size(self.decoded_cache_bytes, "decoded_cache_bytes"),
            "shard_cache_budget": parse_size(self.cache_bytes, "cache_bytes"),
            "side": self.decoded_side or round(1.15 * self.image_size),
            "block": -(-(self.shuffle_block or DEFAULT_BLOCK_BATCHES * self.batch_size) // self.batch_size)
            * self.batch_size if self.shards or self.parquet else 0,
        }
        for name, value in derived.items():
            object.__setattr__(self, name, value)  # frozen: set once, here
        if self.decoded_budget and self.side < self.image_size:
            raise ConfigError(f"decoded_side={self.decoded_side} is below image_size={self.image_size}: crops would "
                              f"be upscaled from smaller images; use 0 (= {round(1.15 * self.image_size)}) or at least "
                              f"{self.image_size}")
        if self.decoded_budget and not self.fused:
            raise ConfigError("decoded_cache_bytes needs decode='fused' (the cache keeps the images the fused path "
                              "shrinks)")


def _number(name: str, value, what: str, ok) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not ok(value):
        raise ConfigError(f"{name}={value!r} must be {what}")


def _choice(name: str, value, choices: dict[str, str]) -> None:
    if not isinstance(value, str) or value not in choices:
        raise ConfigError(f"{name}={value!r} must be " + " or ".join(f"{k!r} ({why})" for k, why in choices.items()))


def _text(name: str, value, what: str, optional: bool = False) -> None:
    if not isinstance(value, str) and not (optional and value is None):
        raise ConfigError(f"{name}={value!r} must be {what}")
