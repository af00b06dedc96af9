"""The one compiled part: fused crop-and-decode of JPEGs against the system's libjpeg-turbo.

Optional: without a C compiler or libjpeg-turbo's headers (Debian/Ubuntu ``libjpeg-dev``,
Amazon Linux/RHEL ``libjpeg-turbo-devel``) the package installs without it and the image pipeline
decodes whole images instead (docs/images.md, "Fused crop and decode").
"""
from setuptools import Extension, setup

setup(ext_modules=[Extension("data_service.pipelines._jpegcrop", ["data_service/pipelines/_jpegcrop.c"],
                             libraries=["jpeg"], optional=True, extra_compile_args=["-O2"])])
