"""Triton kernels for mlloss, installed as ``mlloss.kernels``."""
