"""Build, check and submit SageMaker training jobs (heterogeneous and homogeneous) with boto3.

Modules: ``spec`` (JobSpec and parsing), ``jobs`` (the JobSpecs ``hetero submit`` and ``hetero
sweep`` options describe), ``request`` (CreateTrainingJob request),
``validate`` (botocore model + API rules), ``input_modes`` (File/FastFile against the
pipeline), ``images`` (training image URIs), ``source`` (sourcedir.tar.gz), ``client``
(submit), ``follow`` (wait, logs, metrics and cost), ``sdk`` (a SageMaker SDK v3
``ModelTrainer`` from a JobSpec) and ``sdk_version`` (is a usable SDK installed).
"""
from hetero.sagemaker.request import build_request, homogeneous_twin, make_pair, masked
from hetero.sagemaker.spec import Channel, Group, JobSpec, SubmitError
from hetero.sagemaker.validate import check_request

__all__ = ["Channel", "Group", "JobSpec", "SubmitError", "build_request", "check_request",
           "homogeneous_twin", "make_pair", "masked"]
