"""The compiled parts, both optional: without a C compiler the package installs without them.

- ``data_service.pipelines._jpegcrop``: fused crop-and-decode of JPEGs against the system's
  libjpeg-turbo (Debian/Ubuntu ``libjpeg-dev``, Amazon Linux/RHEL ``libjpeg-turbo-devel``); without
  it the image pipeline decodes whole images instead (docs/images.md, "Fused crop and decode").
- ``data_service.crc32c._hw``: CRC32C with the CPU's instruction (x86-64 SSE4.2) over any buffer in
  place; without it ``data_service.crc32c`` uses google-crc32c (the same values).
"""
from setuptools import Extension, setup

setup(ext_modules=[Extension("data_service.pipelines._jpegcrop", ["data_service/pipelines/_jpegcrop.c"],
                             libraries=["jpeg"], optional=True, extra_compile_args=["-O2"]),
                   Extension("data_service.crc32c._hw", ["data_service/crc32c/_hw.c"], optional=True,
                             extra_compile_args=["-O2"])])
