"""What ``_jpegcrop.c`` exports (built by setup.py where a C compiler and libjpeg-turbo's headers exist)."""
from typing import Any

SIMD_MIRROR: int
JCS_GRAYSCALE: int
JCS_YCbCr: int
JCS_RGB: int
FAST_IDCT: int
PLAIN_UPSAMPLING: int
LIBJPEG_VERSION: int

# src and dst: any writable buffer (numpy arrays, which numpy's stubs do not declare buffers)
def copy_rows(src: Any, rows: int, cols: int, flip: bool, dst: Any, /) -> None: ...
def info(data: bytes | bytearray | memoryview, /) -> tuple[int, int, int, int, int, int, int]: ...
def decode_crop(data: bytes | bytearray | memoryview, x: int, y: int, w: int, h: int, scale_num: int,
                flags: int = ..., /) -> tuple[bytearray, int, int] | None: ...
