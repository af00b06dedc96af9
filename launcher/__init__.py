"""Launcher: the SageMaker entry point of heterogeneous (data + DNN group) training jobs."""
