"""The ``hetero`` command line and job-level tools: the local cluster (``local``), SageMaker
submission (``sagemaker``), planning and prices (``planning``), the step-time benchmark
(``bench``), synthetic MNIST files, and the test toolkit (``testing``)."""
